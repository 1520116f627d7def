"""DiskError: a full, over-quota or read-only disk is one line naming the place and what to do;
every other OSError (and every other exception) passes through ``disk_errors`` unchanged."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import DISK_ERRNOS, DiskError, StoreError, disk_errors

codes = st.sampled_from(sorted(errno.errorcode))


@given(code=codes, where=st.text(min_size=1, max_size=40).filter(lambda s: "\n" not in s))
def test_only_disk_conditions_become_one_line(code: int, where: str) -> None:
    exc = OSError(code, "boom")
    err = DiskError.of(exc, where, "choose another --out")
    if code not in DISK_ERRNOS:
        assert err is None
        with pytest.raises(OSError) as raised, disk_errors(where, "choose another --out"):
            raise exc
        assert raised.value is exc
        return
    assert isinstance(err, StoreError)  # generate's committer: a store outage
    text = str(err)
    assert text.startswith(f"{where}: cannot write: ") and text.endswith("choose another --out")
    assert "\n" not in text.replace(where, "")
    assert ("free" in text) == (code != errno.EROFS)  # a read-only disk is not freed
    with pytest.raises(DiskError) as raised, disk_errors(where, "choose another --out"):
        raise exc
    assert str(raised.value) == text and raised.value.__cause__ is exc


def test_other_exceptions_pass() -> None:
    with pytest.raises(ValueError), disk_errors("x", "y"):
        raise ValueError("not a disk")
    assert DiskError.of(ValueError("x"), "x", "y") is None
