"""Protected-prefix comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftdata.errors import ProtectedPrefixError
from draftdata.store.protect import check_not_protected, overlap


@pytest.mark.parametrize(
    ("out", "prot", "rel"),
    [
        ("s3://b/completions", "s3://b/completions/", "equals"),
        ("s3://b/completions/v2/", "s3://b/completions", "lies inside"),
        ("s3://b", "s3://b/completions", "contains"),
        ("s3://b/completions_v2", "s3://b/completions", None),
        ("s3://other/completions", "s3://b/completions", None),
        ("/data/run", "s3://data/run", None),
    ],
)
def test_overlap(out: str, prot: str, rel: str | None) -> None:
    assert overlap(out, prot) == rel


def test_message_names_prefix_and_contents(tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    (live / "part-0.parquet").write_bytes(b"x")
    with pytest.raises(ProtectedPrefixError) as err:
        check_not_protected(str(tmp_path), [str(live)], describe=True)
    text = str(err.value)
    assert "contains the protected prefix" in text and str(live) in text
    assert "part-0.parquet" in text
    check_not_protected(str(tmp_path / "elsewhere"), [str(live)])
