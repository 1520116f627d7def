"""An input that holds nothing is decided once, in the shared reader (``holds_nothing``), and
``open_dataset`` refuses it as empty for every command (``EmptyInputError``): 0 bytes, blank
lines and white space, an empty JSON array with white space anywhere, gzip of any of these,
with a byte-order mark or not, and parquet of 0 rows in any schema. Before, the reader took such
a file for conversations and each command decided alone (hidden-states with its own
``_holds_nothing``).

The other way round, a file with one row (or one byte that is no white space) is never called
empty, however much white space surrounds it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.errors import EmptyInputError
from draftdata.records import BOM
from draftdata.shared.readers.base import RowFile
from draftdata.shared.readers.files import holds_nothing
from draftdata.stats.readers import open_dataset

WHITE = st.text(alphabet=" \t\r\n\x0b\x0c", max_size=300).map(str.encode)
SCHEMAS = [
    pa.schema([("messages", pa.list_(pa.struct([("role", pa.string())])))]),
    pa.schema([("id", pa.string()), ("conversations", pa.list_(pa.string()))]),
    pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))]),
]


@st.composite
def empty_text(draw: st.DrawFn) -> bytes:
    """Blank text, or one empty JSON array with white space around and inside, a byte-order
    mark first or not."""
    body = draw(WHITE)
    if draw(st.booleans()):
        body = draw(WHITE) + b"[" + draw(WHITE) + b"]" + body
    return (BOM if draw(st.booleans()) else b"") + body


@st.composite
def empty_file(draw: st.DrawFn) -> tuple[str, bytes | pa.Schema]:
    """(file name, bytes or the schema of a 0-row parquet) of one empty shape."""
    shape = draw(st.sampled_from(["text", "gzip", "parquet"]))
    if shape == "parquet":
        return "empty.parquet", draw(st.sampled_from(SCHEMAS))
    ext = draw(st.sampled_from([".jsonl", ".json"]))
    text = draw(empty_text())
    if shape == "gzip":
        return f"empty{ext}.gz", gzip.compress(text)
    return f"empty{ext}", text


def _write(path: Path, content: bytes | pa.Schema) -> None:
    if isinstance(content, pa.Schema):
        pq.write_table(content.empty_table(), path)
    else:
        path.write_bytes(content)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=empty_file(), files=st.integers(1, 3))
def test_every_empty_shape_is_empty_for_the_reader_and_for_open_dataset(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[str, bytes | pa.Schema], files: int
) -> None:
    name, content = shape
    root = tmp_path_factory.mktemp("empty")
    for i in range(files):  # a file, or a folder of several empty files
        _write(root / f"{i}-{name}", content)
    path = root / f"0-{name}"
    assert holds_nothing(RowFile.local(str(path)))
    for url in (str(path), str(root)):
        with pytest.raises(EmptyInputError) as refused:
            open_dataset(url)
        assert str(refused.value).startswith(f"{url}: holds nothing to read (")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=empty_text(),
    after=WHITE,
    held=st.sampled_from([b"{}", b"[{}]", b"[[]]", b'{"id": "a"}', b"x", b"[ 1 ]", b"]"]),
    gz=st.booleans(),
)
def test_anything_that_is_not_white_space_is_not_empty(
    tmp_path_factory: pytest.TempPathFactory, before: bytes, after: bytes, held: bytes, gz: bool
) -> None:
    data = before + held + after
    name = "rows.jsonl.gz" if gz else "rows.jsonl"
    path = tmp_path_factory.mktemp("held") / name
    path.write_bytes(gzip.compress(data) if gz else data)
    assert not holds_nothing(RowFile.local(str(path)))


def test_a_parquet_with_rows_and_a_folder_with_one_file_of_rows_are_not_empty(
    tmp_path: Path,
) -> None:
    """A folder whose first file holds nothing but another holds a row is no empty input."""
    pq.write_table(SCHEMAS[0].empty_table(), tmp_path / "a.parquet")
    table = pa.table({"messages": [[{"role": "user"}]]}, schema=SCHEMAS[0])
    pq.write_table(table, tmp_path / "b.parquet")
    assert not holds_nothing(RowFile.local(str(tmp_path / "b.parquet")))
    assert open_dataset(str(tmp_path)).kind == "conversations"


def test_a_gzip_that_is_not_gzip_is_left_to_its_reader(tmp_path: Path) -> None:
    """A file named .gz that does not decompress is not called empty: its reader says what is
    wrong with it."""
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(b"not gzip at all")
    assert not holds_nothing(RowFile.local(str(path)))


@pytest.mark.parametrize("tail", [b"", b"]", b"] ", b"x"])
def test_white_space_across_the_read_chunks(tmp_path: Path, tail: bytes) -> None:
    """``[`` and ``]`` (or a row) in different 64 KiB reads: decided as in one."""
    data = b" " * 100_000 + b"[" + b"\n" * 70_000 + tail
    path = tmp_path / "long.json"
    path.write_bytes(data)
    assert holds_nothing(RowFile.local(str(path))) == (tail.strip() == b"]")
