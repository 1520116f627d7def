"""Readers of a run.

A run directory or prefix holds ``manifest.json``, ``completions/part-*.parquet``,
``failures/part-*.parquet`` and ``metrics/*.json`` (see ``run.py``). These functions take the
run's URL (or an open Store), read shard by shard (never the whole run at once), and check each
shard's ``draftdata.format`` before use.

``output_tokens`` counts each completion's output tokens the one way every figure does
(``draftdata.shared.tokens.completion_tokens``: usage, else token ids, else an estimate from the
text),
reading a shard's turns only for the rows whose usage counts none.

``iter_failures`` yields the failures that still stand by default: one per (id, sample), the
last recorded, and none for a pair that was later completed (a retried prompt). Pass
``all_attempts=True`` for every recorded failure.

This module never writes; the parquet writer is ``write.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from draftdata.errors import StoreError, UnreadableObjectError
from draftdata.records import Completion, Failure
from draftdata.shared.formats import (
    COMPLETION_FORMAT,
    FAILURE_FORMAT,
    check_format,
    turn_from_row,
)
from draftdata.shared.formats import iter_completions as _rows_to_completions
from draftdata.shared.formats import iter_failures as _rows_to_failures
from draftdata.shared.tokens import TokenCounter, turns_tokens
from draftdata.store.base import Store
from draftdata.store.doneset import DoneSet, hash_pairs, pair_hash
from draftdata.store.manifest import load_manifest
from draftdata.store.opener import open_store
from draftdata.store.quarantine import quarantined, read_error

COMPLETIONS_PREFIX = "completions/"
FAILURES_PREFIX = "failures/"
METRICS_PREFIX = "metrics/"

StoreLike = Store | str


def as_store(where: StoreLike) -> Store:
    """An open Store for a URL (a Store is returned as is)."""
    return where if isinstance(where, Store) else open_store(where)


def shard_keys(store: Store, prefix: str) -> list[str]:
    """Sorted parquet keys under ``prefix`` (e.g. ``completions/``), without the shards a
    quarantine marker sets aside (``quarantine.py``)."""
    keys = [k for k in store.list(prefix) if k.endswith(".parquet")]
    if not keys:
        return keys
    aside = quarantined(store, prefix)
    return [k for k in keys if k not in aside] if aside else keys


def parquet_file(
    store: Store, key: str, read_dictionary: Sequence[str] | None = None
) -> pq.ParquetFile:
    """Open one shard (a local path where the store has one). UnreadableShardError when its
    bytes are damaged; TransientStoreError when the store failed the read (retry)."""
    path = store.local_path(key)
    dicts = list(read_dictionary) if read_dictionary else None
    try:
        source = path if path is not None else store.open_input(key)
        return pq.ParquetFile(source, read_dictionary=dicts, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        raise read_error(store, key, exc, "not a readable parquet file: ") from exc


def read_shard(
    store: Store,
    key: str,
    expected: str,
    columns: Sequence[str] | None = None,
    *,
    read_dictionary: Sequence[str] | None = None,
    optional: Sequence[str] = (),
) -> pa.Table:
    """Read one shard (only ``columns`` if given; on S3 only the footer and those column chunks
    are fetched) after checking its format is ``expected``. Columns in ``read_dictionary``
    stay dictionary-encoded (cheap for a column with few distinct values); ``optional`` ones
    are read where the shard has them (columns a newer format added)."""
    pf = parquet_file(store, key, read_dictionary)
    check_format(pf.schema_arrow, expected, store.key_url(key))
    names = set(pf.schema_arrow.names)
    wanted = None if columns is None else [*columns, *(c for c in optional if c in names)]
    try:
        return pf.read(columns=wanted)
    except (OSError, pa.ArrowException) as exc:
        raise read_error(store, key, exc) from exc


def read_shards_parallel(
    store: Store,
    keys: Sequence[str],
    expected: str,
    columns: Sequence[str],
    workers: int = 8,
    optional: Sequence[str] = (),
) -> Iterator[pa.Table]:
    """Read the same columns (and the ``optional`` ones a shard has) of many shards with a
    thread pool, yielding tables in key order."""
    if not keys:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys)))) as pool:
        yield from pool.map(
            lambda k: read_shard(store, k, expected, columns, optional=optional), keys
        )


def read_manifest(url: StoreLike) -> dict[str, Any]:
    """The run's manifest plus ``history`` and ``effective_settings`` / ``effective_hash``."""
    store = as_store(url)
    if not store.exists("manifest.json"):
        raise StoreError(f"{store.url}: no manifest.json; not a draftdata run")
    return load_manifest(store)


def iter_completion_tables(
    url: StoreLike, columns: Sequence[str] | None = None
) -> Iterator[pa.Table]:
    """One Arrow table per committed completions shard, in shard-name order."""
    store = as_store(url)
    for key in shard_keys(store, COMPLETIONS_PREFIX):
        yield read_shard(store, key, COMPLETION_FORMAT, columns)


def iter_completions(url: StoreLike) -> Iterator[Completion]:
    """Every committed Completion of the run, shard by shard."""
    for table in iter_completion_tables(url):
        yield from _rows_to_completions(table)


def newest_completions(url: StoreLike, k: int) -> list[Completion]:
    """At most ``k`` completions of the run's newest completions shard that can be read (an
    unreadable one is passed over for the one before): what a resumed command asks its fleet
    again (``recheck.py``). Empty for a run with none."""
    store = as_store(url)
    for key in reversed(shard_keys(store, COMPLETIONS_PREFIX)):
        try:
            table = read_shard(store, key, COMPLETION_FORMAT)
        except StoreError:
            continue
        return list(_rows_to_completions(table.slice(0, k)))
    return []


def iter_failure_tables(url: StoreLike) -> Iterator[pa.Table]:
    """One Arrow table per committed failures shard."""
    store = as_store(url)
    for key in shard_keys(store, FAILURES_PREFIX):
        yield read_shard(store, key, FAILURE_FORMAT)


def iter_failures(url: StoreLike, *, all_attempts: bool = False) -> Iterator[Failure]:
    """The run's failures: by default one per unresolved (id, sample), the last recorded.

    ``all_attempts=True`` yields every recorded failure in shard order instead.
    """
    store = as_store(url)
    if all_attempts:
        for table in iter_failure_tables(store):
            yield from _rows_to_failures(table)
        return
    completed = DoneSet.from_chunks(_hash_tables(iter_completion_tables(store, ["id", "sample"])))
    last: dict[int, Failure] = {}
    for table in iter_failure_tables(store):
        for f in _rows_to_failures(table):
            h = pair_hash(f.id, f.sample)
            if not completed.contains_hash(h):
                last.pop(h, None)
                last[h] = f
    yield from last.values()


def _hash_tables(tables: Iterator[pa.Table]) -> Iterator[Any]:
    for t in tables:
        yield hash_pairs(t.column("id").to_pylist(), t.column("sample").to_pylist())


def read_metrics(url: StoreLike) -> list[dict[str, Any]]:
    """Every metrics object of the run (``metrics/*.json``), in key order."""
    store = as_store(url)
    out = []
    for key in store.list(METRICS_PREFIX):
        if key.endswith(".json"):
            try:
                value = json.loads(store.read(key))
            except ValueError as exc:
                raise UnreadableObjectError(
                    f"{store.key_url(key)}: not valid JSON ({exc})"
                ) from exc
            if isinstance(value, dict):
                value.setdefault("key", key)
                out.append(value)
    return out


def turn_finish_reasons(turns: Any) -> list[list[str | None]]:
    """Each row's turn finish reasons, read from a completions shard's ``turns`` column without
    converting the rest of the turns (texts, token ids) to Python."""
    col = turns.combine_chunks() if isinstance(turns, pa.ChunkedArray) else turns
    counts = [n or 0 for n in pc.list_value_length(col).to_pylist()]
    flat = pc.struct_field(pc.list_flatten(col), "finish_reason").to_pylist()
    out: list[list[str | None]] = []
    at = 0
    for n in counts:
        out.append(flat[at : at + n])
        at += n
    return out


def output_tokens(
    store: Store, key: str, table: pa.Table, count: TokenCounter | None = None
) -> tuple[list[int], list[bool]]:
    """(output tokens, estimated) of each row of ``table``: every row of the completions shard
    ``key`` in order, with its ``usage`` column. The usage's count where it has one; the rows
    whose usage counts none (a server that sent no usage, or 0) are counted from their turns
    (``draftdata.shared.tokens.turns_tokens``, their text with ``count``), read only then."""
    counted = pc.struct_field(table.column("usage"), "completion_tokens").to_pylist()
    tokens = [int(x or 0) for x in counted]
    estimated = [False] * len(tokens)
    zero = [i for i, n in enumerate(tokens) if n <= 0]
    if not zero:
        return tokens, estimated
    turns = read_shard(store, key, COMPLETION_FORMAT, ["turns"]).column("turns")
    if len(turns) != len(tokens):
        raise StoreError(f"{store.key_url(key)}: changed while it was read; read it again")
    for i, row in zip(zero, turns.take(pa.array(zero)).to_pylist(), strict=True):
        tokens[i], estimated[i] = turns_tokens([turn_from_row(t) for t in row or []], count)
    return tokens, estimated
