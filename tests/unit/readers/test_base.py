"""The row loop every reader shares: numbering, skip, limit, rejects, counts, progress; a file
that cannot be read is one InputError naming it, whatever the format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import InputError, RowError
from draftdata.shared.readers.base import Decoded, Reader, RowFile, batches
from draftdata.shared.readers.files import FilesReader, format_of


class _Listed(Reader[Any]):
    """Rows given as a list of (good, value): a bad one is raw bytes that are not JSON."""

    def __init__(self, rows: list[tuple[bool, int]], **kw: Any) -> None:
        super().__init__(Decoded(), **kw)
        self.given = rows

    def raw_rows(self) -> Iterator[tuple[str, Any]]:
        for i, (good, value) in enumerate(self.given):
            yield f"f:{i + 1}", str(value).encode() if good else b"{nope"


_rows = st.lists(st.tuples(st.booleans(), st.integers(0, 99)), max_size=30)


@given(rows=_rows, skip=st.integers(0, 35), limit=st.none() | st.integers(0, 35))
def test_numbering_skip_limit_and_counts(
    rows: list[tuple[bool, int]], skip: int, limit: int | None
) -> None:
    """Row numbers count every row from 0 (rejected ones too); skip drops the first rows,
    limit stops after that many; ``read`` and ``rejected`` count what was yielded."""
    reader = _Listed(rows, skip=skip, limit=limit)
    got = list(reader.rows())
    want = list(enumerate(rows))[skip:][: limit if limit is not None else None]
    assert [i for i, _, _ in got] == [i for i, _ in want]
    assert [w for _, w, _ in got] == [f"f:{i + 1}" for i, _ in want]
    for (_, _, value), (_, (good, n)) in zip(got, want, strict=True):
        assert value == n if good else isinstance(value, RowError) and value.reason == "bad_json"
    assert reader.read == len(want)
    assert reader.rejected["bad_json"] == sum(1 for _, (good, _) in want if not good)


@given(rows=_rows, every=st.integers(1, 7))
def test_progress_every_n_rows_and_at_the_end(rows: list[tuple[bool, int]], every: int) -> None:
    calls: list[int] = []
    list(_Listed(rows, progress=calls.append, progress_every=every).rows())
    n = len(rows)
    assert calls == [k for k in range(every, n + 1, every)] + [n]


def test_values_only_hand_rejects_to_on_reject() -> None:
    seen: list[tuple[str, str]] = []
    reader = _Listed(
        [(True, 1), (False, 0), (True, 2)], on_reject=lambda w, e: seen.append((w, e.reason))
    )
    assert list(reader) == [1, 2]
    assert seen == [("f:2", "bad_json")]
    with pytest.raises(InputError, match=r"^f:2: not valid JSON"):
        list(_Listed([(True, 1), (False, 0)]))  # no on_reject: the first bad row stops


def test_a_file_that_cannot_be_read_is_one_error_naming_it(tmp_path: Path) -> None:
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"q": ["x"]}), good)
    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    missing = str(tmp_path / "c.jsonl")
    reader = FilesReader([RowFile.local(str(good)), RowFile.local(str(bad))], Decoded())
    with pytest.raises(InputError, match=r"b\.parquet: not a readable parquet file"):
        list(reader)
    with pytest.raises(InputError, match=r"c\.jsonl: cannot read"):
        list(FilesReader([RowFile.local(missing)], Decoded()))

    def broken() -> Any:
        raise RuntimeError("the connection dropped")

    with pytest.raises(InputError, match=r"s3://b/k\.jsonl: cannot read \(RuntimeError: the"):
        list(FilesReader([RowFile("s3://b/k.jsonl", broken)], Decoded()))


def test_formats_by_name() -> None:
    assert format_of("a.JSONL.gz") == "jsonl"
    assert format_of("a.ndjson") == "jsonl"
    assert format_of("s3://b/x.parquet") == "parquet"
    assert format_of("a.txt", "json") == "json"
    with pytest.raises(InputError, match="cannot tell the format"):
        format_of("a.txt")


@given(items=st.lists(st.integers(), max_size=50), size=st.integers(1, 9))
def test_batches_keep_every_item_in_order(items: list[int], size: int) -> None:
    got = list(batches(iter(items), size))
    assert [x for b in got for x in b] == items
    assert all(len(b) == size for b in got[:-1]) and all(0 < len(b) <= size for b in got)
