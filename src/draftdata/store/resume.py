"""Rebuilding a run's done-sets on resume: from the rollups, plus the shards no rollup covers.

A pair (id, sample) is completed when a completions shard holds it, failed fatally when a
failures shard holds it with a fatal reason and no completion does. Rollups (``rollup.py``)
hold the ids of many shards in one object, so a resume reads few objects; the shards they do
not cover are read column-wise in parallel (on S3 the footer and id chunks). This module reads;
``run.py`` decides to write a new rollup when many shards were uncovered.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc

from draftdata.records import FATAL_REASONS
from draftdata.shared.formats import COMPLETION_FORMAT, FAILURE_FORMAT
from draftdata.store.base import Store
from draftdata.store.doneset import DoneSet, hash_pairs
from draftdata.store.local import LocalStore
from draftdata.store.quarantine import quarantined_in
from draftdata.store.read import COMPLETIONS_PREFIX, FAILURES_PREFIX, read_shards_parallel
from draftdata.store.rollup import ROLLUP_PREFIX, Entry, entry_of_table, read_rollups
from draftdata.support.metrics import StageStats


@functools.cache
def _fatal() -> pa.Array:
    # built on first use, not at import: pa.array imports pandas (a third of a second), which
    # every command that opens a store would pay, reading a run or not
    return pa.array(sorted(FATAL_REASONS), pa.string())


def rebuild_done_sets(
    store: Store, keys: list[str], stats: StageStats
) -> tuple[DoneSet, DoneSet, list[Entry]]:
    """The completed and fatal done-sets from the rollups plus the shards they do not cover;
    also the entries of those uncovered shards (for a new rollup)."""
    aside = quarantined_in(keys)  # set aside (unreadable): their pairs are generated again
    comp_keys = [k for k in keys if k.startswith(COMPLETIONS_PREFIX) and k.endswith(".parquet")]
    fail_keys = [k for k in keys if k.startswith(FAILURES_PREFIX) and k.endswith(".parquet")]
    comp_keys = [k for k in comp_keys if k not in aside]
    fail_keys = [k for k in fail_keys if k not in aside]
    roll_keys = [k for k in keys if k.startswith(ROLLUP_PREFIX) and k.endswith(".parquet")]
    workers = 4 if isinstance(store, LocalStore) else 16
    with stats.timed("store.read_rollups"):
        rolled, covered = read_rollups(store, roll_keys, comp_keys + fail_keys, workers)
    comp_chunks = []
    fatal_chunks = []
    for rows in rolled:  # (id, sample, reason) of shards a rollup covers
        reason = rows.column("reason")
        done = rows.filter(pc.is_null(reason))
        comp_chunks.append(
            hash_pairs(done.column("id").to_pylist(), done.column("sample").to_pylist())
        )
        fatal = rows.filter(pc.fill_null(pc.is_in(reason, value_set=_fatal()), False))
        fatal_chunks.append(
            hash_pairs(fatal.column("id").to_pylist(), fatal.column("sample").to_pylist())
        )
    uncovered: list[Entry] = []
    comp_left = [k for k in comp_keys if k not in covered]
    fail_left = [k for k in fail_keys if k not in covered]
    tables = read_shards_parallel(store, comp_left, COMPLETION_FORMAT, ["id", "sample"], workers)
    for key, t in zip(comp_left, tables, strict=True):
        entry = entry_of_table(key, t)
        uncovered.append(entry)
        comp_chunks.append(hash_pairs(entry[1], entry[2]))
    cols = ["id", "sample", "reason"]
    tables = read_shards_parallel(store, fail_left, FAILURE_FORMAT, cols, workers)
    for key, t in zip(fail_left, tables, strict=True):
        entry = entry_of_table(key, t)
        uncovered.append(entry)
        reasons = entry[3] or []
        rows = [
            (i, s)
            for i, s, r in zip(entry[1], entry[2], reasons, strict=True)
            if r in FATAL_REASONS
        ]
        fatal_chunks.append(hash_pairs([i for i, _ in rows], [s for _, s in rows]))
    completed = DoneSet.from_chunks(comp_chunks)
    # A pair completed after a retried failure is completed, not failed.
    fatal = DoneSet.from_chunks(fatal_chunks).minus(completed)
    stats.add("store.resumed_shards", len(comp_keys) + len(fail_keys))
    stats.add("store.resumed_rolled_up_shards", len(covered))
    stats.add("store.resumed_completed", len(completed))
    stats.add("store.resumed_fatal", len(fatal))
    return completed, fatal, uncovered
