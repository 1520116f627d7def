"""Files of any format, each read by its format's reader, in the given order; and whether a
file holds nothing at all (``holds_nothing``), decided here once for every command.

A file's format is its name's (``.jsonl``/``.ndjson``/``.json`` are JSON text, whose content
says lines or an array; ``.parquet``; a ``.gz`` or ``.zst`` suffix is looked through), or the
one the caller gives.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import IO, Any

from draftdata.errors import InputError
from draftdata.shared.readers.base import FileReader, Parse, RowFile, T, open_bytes
from draftdata.shared.readers.jsontext import json_rows
from draftdata.shared.readers.parquet import BATCH_ROWS, open_parquet, parquet_rows

_WHITE = b" \t\r\n\x0b\x0c"  # what a blank line holds (``bytes.strip``'s white space)
_CHUNK = 64 << 10  # bytes read at a time while only white space has come

FORMATS = ("jsonl", "json", "parquet")


def format_of(where: str, given: str | None = None) -> str:
    """``given``, else the format ``where``'s name says; InputError when it says none."""
    if given is not None:
        return given
    name = where.lower().removesuffix(".gz").removesuffix(".zst")
    for fmt in FORMATS:
        if name.endswith("." + fmt):
            return fmt
    if name.endswith(".ndjson"):
        return "jsonl"
    raise InputError(
        f"{where}: cannot tell the format from the name; set format: jsonl|json|parquet"
    )


class FilesReader(FileReader[T]):
    """Rows of files of any of the formats (``format`` given: all of that one)."""

    def __init__(
        self,
        files: Sequence[RowFile],
        parse: Parse[T],
        *,
        format: str | None = None,
        batch_rows: int = BATCH_ROWS,
        **kw: Any,
    ) -> None:
        super().__init__(files, parse, **kw)
        self.format = format
        self.batch_rows = batch_rows

    def read_file(self, file: RowFile) -> Iterator[tuple[str, Any]]:
        if format_of(file.where, self.format) == "parquet":
            yield from parquet_rows(file, self.batch_rows)
            return
        with open_bytes(file) as fh:
            yield from json_rows(fh, file.where)


def holds_nothing(file: RowFile, format: str | None = None) -> bool:
    """Whether ``file`` holds no row at all: 0 bytes, only blank lines or white space, one
    empty JSON array (white space anywhere around or inside, ``[ ]``), gzip (or zstd) of
    these after a byte-order mark or not, or a parquet of 0 rows. Every command asks this
    before it reads an input and refuses one that holds nothing with ``EmptyInputError``.

    Text is read only up to its first two bytes that are not white space (one small read for a
    file that holds rows; a file of white space is streamed to its end); parquet reads the
    footer. A file that cannot be opened, read or decompressed as its format is not called
    empty: its reader says what is wrong with it, in its own words."""
    try:
        fmt = format_of(file.where, format)
    except InputError:  # no format in the name: JSON text is what such an input is read as
        fmt = "jsonl"
    try:
        if fmt == "parquet":
            return bool(open_parquet(file).metadata.num_rows == 0)
        with open_bytes(file) as fh:
            return _text_holds_nothing(fh)
    except (InputError, OSError, EOFError, zlib.error):  # missing, not gzip, cut short
        return False


def _text_holds_nothing(fh: IO[bytes]) -> bool:
    """Whether the text in ``fh`` is white space around at most ``[`` then ``]``."""
    seen = b""  # the bytes so far that are not white space (at most ``[]``)
    while chunk := fh.read(_CHUNK):
        seen += chunk.translate(None, _WHITE)
        if not b"[]".startswith(seen):
            return False
    return seen in (b"", b"[]")
