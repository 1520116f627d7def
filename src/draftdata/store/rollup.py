"""Done-set rollups: one small object listing the ids of many shards, so resume is fast.

A run that commits a shard every few seconds collects thousands of shards; reading each one's
id column on resume costs about a millisecond locally (and a round trip on S3) per shard. So a
writer, every ``ROLLUP_EVERY`` shards it commits (and when it closes), writes one create-only
``index/rollup-<writer>-<seq>.parquet`` with the (shard, id, sample, reason) rows of those
shards, and ``Run.open`` writes one for any large set of shards no rollup covers yet. Resume
then reads the rollups plus only the shards none of them covers.

Rollups are derived data and never the truth: shards are immutable (create-only, never
deleted), so a rollup stays exact, but a rollup row counts only if its shard is in the current
listing, and a missing or unreadable rollup only costs speed. Readers of a run's data
(``read.py``, exports) ignore rollups. Format: ``draftdata.rollup/1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from draftdata.errors import DraftdataError
from draftdata.shared.formats import FORMAT_KEY
from draftdata.store.base import Store
from draftdata.store.read import read_shard

ROLLUP_PREFIX = "index/"
ROLLUP_FORMAT = "draftdata.rollup/1"
ROLLUP_EVERY = 64  # shards per rollup
ROLLUP_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("id", pa.string()),
        ("sample", pa.int32()),
        ("reason", pa.string()),  # null for completions
    ],
    metadata={FORMAT_KEY: ROLLUP_FORMAT.encode()},
)

# One shard's rows: (shard key, ids, samples, reasons or None for a completions shard)
Entry = tuple[str, Sequence[str], Sequence[int], Sequence[str | None] | None]


def rollup_table(entries: Iterable[Entry]) -> pa.Table:
    """The rollup table of ``entries`` (one per shard)."""
    shards: list[str] = []
    ids: list[str] = []
    samples: list[int] = []
    reasons: list[str | None] = []
    for key, e_ids, e_samples, e_reasons in entries:
        shards.extend([key] * len(e_ids))
        ids.extend(e_ids)
        samples.extend(e_samples)
        reasons.extend(e_reasons if e_reasons is not None else [None] * len(e_ids))
    return pa.table(
        [
            pa.array(shards, pa.string()),
            pa.array(ids, pa.string()),
            pa.array(samples, pa.int32()),
            pa.array(reasons, pa.string()),
        ],
        schema=ROLLUP_SCHEMA,
    )


def entry_of_table(key: str, table: pa.Table) -> Entry:
    """The rollup entry of a shard read with its id/sample (and, for failures, reason)."""
    reasons = table.column("reason").to_pylist() if "reason" in table.column_names else None
    return (key, table.column("id").to_pylist(), table.column("sample").to_pylist(), reasons)


def read_rollups(
    store: Store, keys: Sequence[str], listed: Sequence[str], workers: int
) -> tuple[list[pa.Table], set[str]]:
    """The rows of every rollup whose shard is in ``listed``, and the set of shards covered.

    A rollup that cannot be read or has another format version is skipped: it only costs
    speed, since its shards are then read one by one. The shard column is read
    dictionary-encoded and filtered through its (small) dictionary.
    """
    if not keys:
        return [], set()
    wanted = pa.array(sorted(set(listed)), pa.string())

    def read(key: str) -> tuple[list[pa.Table], set[str]]:
        try:
            table = read_shard(
                store, key, ROLLUP_FORMAT, ROLLUP_SCHEMA.names, read_dictionary=["shard"]
            )
        except DraftdataError:
            return [], set()
        out, covered = [], set()
        for batch in table.to_batches():
            shard = batch.column(0)
            if not isinstance(shard, pa.DictionaryArray):
                shard = pc.dictionary_encode(shard)
            ok = pc.is_in(shard.dictionary, value_set=wanted)  # per distinct shard key
            covered.update(shard.dictionary.filter(ok).to_pylist())
            rows = pa.Table.from_batches([batch]).filter(pc.take(ok, shard.indices))
            out.append(rows.drop_columns(["shard"]))
        return out, covered

    tables: list[pa.Table] = []
    covered: set[str] = set()
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys)))) as pool:
        for t, c in pool.map(read, keys):
            tables.extend(t)
            covered |= c
    return tables, covered
