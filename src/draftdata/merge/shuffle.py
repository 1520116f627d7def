"""External shuffle through hashed buckets, and the create-only shard writer.

Pass 2 routes every output row to a bucket by its order key (``plan.bucket_of``: key ranges, so
bucket order is key order) and appends it to that bucket's Arrow IPC file in a local temp folder.
Then each bucket is read alone, sorted by (key, row, copy) and handed to a ``ShardWriter``, which
cuts fixed-size shards and writes them through the store (create-only, local or S3). Memory is
one bucket plus one shard, whatever the total size; the result is the same global order a full
in-memory sort would give.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from draftdata.store.base import Store
from draftdata.store.write import write_parquet_shard

# Helper columns carried through the buckets and removed before writing.
KEY, ROW, COPY = "_key", "_row", "_copy"
HELPER_FIELDS = [(KEY, pa.uint64()), (ROW, pa.int64()), (COPY, pa.int32())]


def bucket_schema(base: pa.Schema) -> pa.Schema:
    """``base`` plus the helper columns (no metadata: buckets are private temp files)."""
    fields = [pa.field(f.name, f.type) for f in base]
    fields += [pa.field(name, t) for name, t in HELPER_FIELDS]
    return pa.schema(fields)


class Buckets:
    """Append-only Arrow IPC files, one per (split, bucket), opened on first use."""

    def __init__(self, folder: Path, schema: pa.Schema, counts: dict[int, int]) -> None:
        self.folder = folder
        self.schema = schema
        self.counts = counts  # split -> number of buckets
        self._writers: dict[tuple[int, int], pa.ipc.RecordBatchStreamWriter] = {}
        self._sinks: dict[tuple[int, int], pa.OSFile] = {}

    def _path(self, split: int, bucket: int) -> Path:
        return self.folder / f"s{split}-b{bucket:05d}.arrow"

    def write(self, split: int, bucket: int, table: pa.Table) -> None:
        """Append ``table`` (bucket schema) to one bucket."""
        k = (split, bucket)
        w = self._writers.get(k)
        if w is None:
            sink = pa.OSFile(str(self._path(split, bucket)), "wb")
            w = pa.ipc.new_stream(sink, self.schema)
            self._sinks[k], self._writers[k] = sink, w
        w.write_table(table)

    def close(self) -> None:
        """Finish every open bucket file."""
        for k, w in self._writers.items():
            w.close()
            self._sinks[k].close()
        self._writers.clear()
        self._sinks.clear()

    def read_sorted(self, split: int, bucket: int) -> pa.Table | None:
        """One bucket's rows in (key, row, copy) order, helper columns dropped; None if empty."""
        path = self._path(split, bucket)
        if not path.exists():
            return None
        with pa.OSFile(str(path), "rb") as src:
            table = pa.ipc.open_stream(src).read_all()
        os.unlink(path)  # free the disk as we go
        order = np.lexsort(
            (
                table.column(COPY).to_numpy(),
                table.column(ROW).to_numpy(),
                table.column(KEY).to_numpy(),
            )
        )
        table = table.take(pa.array(order))
        return table.drop_columns([KEY, ROW, COPY])


class ShardWriter:
    """Cuts a stream of sorted tables into ``rows_per_shard``-row parquet shards in the store.

    Shard ``n`` of split ``name`` is ``{name}/part-{n:05d}.parquet``; ``extra(table, name, n)``
    may write a companion of each shard (the SpecForge JSONL export).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        schema: pa.Schema,
        rows_per_shard: int,
        extra: Callable[[pa.Table, str, int], None] | None = None,
        write_empty: bool = False,
    ) -> None:
        self.store = store
        self.name = name
        self.schema = schema
        self.rows_per_shard = max(1, rows_per_shard)
        self.extra = extra
        self.write_empty = write_empty  # one empty shard when no row comes (a loadable split)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.keys: list[str] = []
        self.rows = 0
        self.bytes = 0

    def add(self, table: pa.Table) -> None:
        """Queue sorted rows; writes every full shard."""
        if table.num_rows == 0:
            return
        self.pending.append(table)
        self.pending_rows += table.num_rows
        while self.pending_rows >= self.rows_per_shard:
            self._flush(self.rows_per_shard)

    def close(self) -> None:
        """Write the last, partial shard (or the empty one)."""
        if self.pending_rows:
            self._flush(self.pending_rows)
        elif not self.keys and self.write_empty:
            self.pending = [self.schema.empty_table()]
            self._flush(0)

    def _flush(self, n: int) -> None:
        whole = pa.concat_tables(self.pending)
        shard, rest = whole.slice(0, n), whole.slice(n)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows
        shard = pa.Table.from_arrays(
            [shard.column(f.name).combine_chunks() for f in self.schema], schema=self.schema
        )
        index = len(self.keys)
        key = f"{self.name}/part-{index:05d}.parquet"
        self.bytes += write_parquet_shard(self.store, key, shard)
        self.keys.append(key)
        self.rows += shard.num_rows
        if self.extra is not None:
            self.extra(shard, self.name, index)
