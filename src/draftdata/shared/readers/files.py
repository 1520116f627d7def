"""Files of any format, each read by its format's reader, in the given order.

A file's format is its name's (``.jsonl``/``.ndjson``/``.json`` are JSON text, whose content
says lines or an array; ``.parquet``; a ``.gz`` or ``.zst`` suffix is looked through), or the
one the caller gives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from draftdata.errors import InputError
from draftdata.shared.readers.base import FileReader, Parse, RowFile, T, open_bytes
from draftdata.shared.readers.jsontext import json_rows
from draftdata.shared.readers.parquet import BATCH_ROWS, parquet_rows

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
