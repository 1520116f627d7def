"""Parquet: rows decoded a batch at a time.

A file is read in place where it has a local path, else through its opener (S3 in ranged
reads); ``batch_rows`` rows are decoded at a time (``iter_batches``, then ``to_pylist``), so a
file written as one large row group never sits in memory decoded whole. Page checksums are
verified where the writer stored them. ``columns`` reads only those columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.errors import InputError
from draftdata.shared.readers.base import FileReader, Parse, RowFile, T

BATCH_ROWS = 1024  # rows decoded at a time


def open_parquet(file: RowFile) -> pq.ParquetFile:
    """``file`` opened as parquet; InputError (one line) when it is not a readable one."""
    try:
        source = file.path if file.path is not None else file.open()
        return pq.ParquetFile(source, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{file.where}: not a readable parquet file ({exc})") from exc


def parquet_rows(
    file: RowFile, batch_rows: int = BATCH_ROWS, columns: Sequence[str] | None = None
) -> Iterator[tuple[str, Any]]:
    """(where, row dict) of each row of ``file``, ``batch_rows`` decoded at a time."""
    pf = open_parquet(file)
    n = 0
    cols = list(columns) if columns is not None else None
    for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
        for row in batch.to_pylist():
            yield f"{file.where}: row {n}", row
            n += 1


class ParquetReader(FileReader[T]):
    """Rows of parquet files, as dicts, ``batch_rows`` decoded at a time."""

    def __init__(
        self,
        files: Sequence[RowFile],
        parse: Parse[T],
        *,
        batch_rows: int = BATCH_ROWS,
        columns: Sequence[str] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(files, parse, **kw)
        self.batch_rows = batch_rows
        self.columns = columns

    def read_file(self, file: RowFile) -> Iterator[tuple[str, Any]]:
        return parquet_rows(file, self.batch_rows, self.columns)
