"""The JSON files draftdata writes: one name and format each, read through one checked loader."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import FormatVersionError, InputError
from draftdata.shared import formats
from draftdata.shared.formats import JsonFile

FILES = [v for v in vars(formats).values() if isinstance(v, JsonFile)]


def test_every_json_file_has_its_own_name() -> None:
    assert len(FILES) >= 6
    assert len({f.name for f in FILES}) == len(FILES)


@pytest.mark.parametrize("file", FILES, ids=[f.name for f in FILES])
def test_load_reads_its_own_format_and_refuses_others(file: JsonFile) -> None:
    doc = {"format": file.format, "x": 1}
    assert file.load(json.dumps(doc).encode(), "here") == doc
    with pytest.raises(FormatVersionError, match=rf"^here: format 'other/1'.*{file.name}"):
        file.load(b'{"format": "other/1"}', "here")
    with pytest.raises(FormatVersionError, match="format None"):
        file.load(b"{}", "here")
    with pytest.raises(InputError, match=r"^here: expected a JSON object"):
        file.load(b"[]", "here")
    with pytest.raises(InputError, match=r"^here: not valid JSON"):
        file.load(b"{", "here")


@given(st.binary(max_size=64))
def test_load_of_any_bytes_is_the_object_or_one_error(raw: bytes) -> None:
    file = formats.MERGE_REPORT
    try:
        doc = file.load(raw, "x")
    except (InputError, FormatVersionError) as exc:
        assert "\n" not in str(exc)
    else:
        assert doc["format"] == file.format
