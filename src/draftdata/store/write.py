"""The create-only parquet writer: a table's parquet bytes, and a shard written once.

The run writer (``run.py``, ``shards.py``) and the stages that write parquet into a store
(tokenize, merge) write through these, so every shard is laid out the same way: one row group,
dictionary columns as ``formats.dictionary_columns`` names them, zstd, and page checksums on a
run's completions and failures.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.shared.formats import dictionary_columns
from draftdata.store.base import Store


def parquet_bytes(table: pa.Table, *, compression: str = "zstd", checksums: bool = False) -> bytes:
    """Serialise ``table`` (schema metadata included) to parquet bytes, one row group.

    ``checksums`` writes a CRC32 of every page (a run's completions and failures shards), which
    every reader here verifies: a damaged page is then always an error, never other data."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression=compression,
        row_group_size=max(1, table.num_rows),
        use_dictionary=dictionary_columns(table.schema),
        write_page_checksum=checksums,
    )
    return sink.getvalue()


def write_parquet_shard(
    store: Store, key: str, table: pa.Table, *, compression: str = "zstd"
) -> int:
    """Write ``table`` as a create-only parquet object ``key``; returns its size in bytes.

    AlreadyExistsError if ``key`` exists with other bytes (nothing is ever overwritten).
    """
    data = parquet_bytes(table, compression=compression)
    store.put_new(key, data)
    return len(data)
