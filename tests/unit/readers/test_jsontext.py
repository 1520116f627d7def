"""JSON text: lines or one array, streamed; the array's fast cut and its splitter agree with a
whole-file decode on every shape of row, at every block size."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import InputError, RowError
from draftdata.prepare.config import SourceConfig
from draftdata.prepare.load import iter_rows
from draftdata.shared.readers import jsontext
from draftdata.shared.readers.base import Decoded, RowFile
from draftdata.shared.readers.jsontext import JsonReader, json_rows

# strings that look like structure: a cut at "}," inside one must never split a row
_tricky = st.sampled_from(['"},{"', "},", "}, {", "]", "[{", '\\"', "\\", "\n", "ü", "{}"])
_text = st.lists(_tricky | st.text(max_size=6), max_size=4).map("".join)
_leaf = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _text
_value = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_row = st.dictionaries(_text, _value, max_size=4)
# mostly objects (the fast cut's case), sometimes another JSON value
_element = _row | _value
_space = st.sampled_from(["", " ", "\n", "  \n\t"])


def _rows(data: bytes, where: str = "a.json") -> list[tuple[str, Any]]:
    return list(json_rows(io.BufferedReader(io.BytesIO(data)), where))  # type: ignore[arg-type]


def _array(elements: list[bytes], space: str) -> bytes:
    sep = ("," + space).encode()
    return b"[" + space.encode() + sep.join(elements) + space.encode() + b"]"


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(_element, max_size=12),
    space=_space,
    block=st.integers(1, 300),
)
def test_an_array_streams_as_its_whole_decode(rows: list[Any], space: str, block: int) -> None:
    """Any array, cut in blocks of any size, gives its elements in order, each one whole."""
    data = _array([json.dumps(r).encode() for r in rows], space)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsontext, "BLOCK", block)
        got = _rows(data)
    assert [json.loads(raw) for _, raw in got] == rows
    assert [w for w, _ in got] == [f"a.json: element {i}" for i in range(len(rows))]


_bad = st.sampled_from(
    [
        b'{"q": "lone \\ud800"}',
        b'{"q": "bad \xff utf-8"}',
        b'{"q": ' + b"[" * 200 + b"]" * 200 + b"}",
        b'{"q": tru}',
        b'{"q" "a"}',
        b'{"q": "x" "y"}',
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(
        _row.map(lambda r: (True, r)) | _bad.map(lambda b: (False, b)), min_size=1, max_size=10
    ),
    block=st.integers(1, 200),
)
def test_a_bad_element_is_one_reject_in_its_place(
    tmp_path_factory: pytest.TempPathFactory, items: list[tuple[bool, Any]], block: int
) -> None:
    """Whatever the block size, each bad element is one located reject and every good one
    around it is read (the reader prepare and stats share)."""
    path = tmp_path_factory.mktemp("arr") / "a.json"
    path.write_bytes(_array([json.dumps(x).encode() if ok else x for ok, x in items], "\n"))
    src = SourceConfig(name="s", schema="openai", path=str(path))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsontext, "BLOCK", block)
        got = [r for _, r in iter_rows(src)]
    assert len(got) == len(items)
    for i, ((ok, x), row) in enumerate(zip(items, got, strict=True)):
        if ok:
            assert row == x
        else:
            assert isinstance(row, RowError) and row.detail.startswith(f"{path}: element {i}: ")


def test_data_after_the_closing_bracket_is_one_reject() -> None:
    got = _rows(b'[{"a": 1},\n {"a": 2}]\n{"b": 3}\n')
    assert [json.loads(r) for _, r in got[:2]] == [{"a": 1}, {"a": 2}]
    where, err = got[2]
    assert where == "a.json: after element 1" and isinstance(err, RowError)
    assert err.reason == "bad_json" and "closing bracket" in err.detail


def test_json_lines_whose_first_row_is_an_array() -> None:
    got = _rows(b'[1, 2]\n{"a": 1}\n\n["x"]\n', "f.jsonl")
    assert [(w, json.loads(r)) for w, r in got] == [
        ("f.jsonl:1", [1, 2]),
        ("f.jsonl:2", {"a": 1}),
        ("f.jsonl:4", ["x"]),
    ]


def test_a_line_over_the_limit_is_one_reject_and_the_next_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jsontext, "MAX_LINE_BYTES", 100)
    got = _rows(b'{"a": "' + b"x" * 500 + b'"}\n{"a": 2}\n', "f.jsonl")
    (where, err), (where2, raw) = got
    assert where == "f.jsonl:1" and isinstance(err, RowError) and err.reason == "too_long"
    assert where2 == "f.jsonl:2" and json.loads(raw) == {"a": 2}


def test_text_that_opens_an_array_but_is_none() -> None:
    with pytest.raises(InputError, match="expected a JSON array"):
        list(jsontext.array_rows(io.BytesIO(b"{}"), "x.json", b'{"a": 1}'))


def test_gzip_and_byte_order_mark_are_looked_through(tmp_path: Path) -> None:
    path = tmp_path / "a.json.gz"
    path.write_bytes(gzip.compress(b'\xef\xbb\xbf[{"a": 1}, {"a": 2}]'))
    reader = JsonReader([RowFile.local(str(path))], Decoded())
    assert list(reader) == [{"a": 1}, {"a": 2}]


def test_a_large_array_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """Memory holds a few blocks of an array, not the file (DESIGN invariant 4): reading a
    ~48 MB array peaks far below its size."""
    row = json.dumps({"query": "q " * 200, "response": "r, {} " * 100}).encode()
    n = 48_000_000 // (len(row) + 2)
    path = tmp_path / "big.json"
    with path.open("wb") as fh:
        fh.write(b"[")
        for i in range(n):
            fh.write(row if i == 0 else b",\n" + row)
        fh.write(b"]")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_rows(SourceConfig(name="s", schema="openai", path=str(path))))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n
    assert peak < size / 3, (peak, size)
