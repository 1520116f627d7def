"""``draftdata run check RUN``: read every shard of a run in full, and set unreadable ones aside.

Generate's resume reads only the id columns of a run's shards, and a reader stops at the first
shard it cannot read. ``check_run`` reads every completions and failures shard whole: the
footer, the format, every page (with the CRC32 generate writes per page: a damaged byte is
never taken for data) and every row decoded as a record. It reports each shard that fails, with
its row count where the footer still tells it. With ``quarantine=True`` it writes a marker for
each (``quarantine.py``: create-only, nothing deleted), after which every reader leaves those
shards out and the same generate command generates their prompts again.

A shard is damaged only on what its bytes show (a bad footer, a failed page checksum, records
that do not decode). A read the store failed (S3 throttling or 5xx, a reset or timed-out
connection, a file the OS cannot read now) leaves the shard *not read now* (``unread``): it is
reported, never set aside, and the same check run again reads it. Before writing a marker the
check reads a damaged shard once more.

Shards set aside before are not read again; they are counted. A run that a live generate still
writes is checked but not changed (its writer decides what is done until it stops).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa

from draftdata.errors import DraftdataError, StoreError, TransientStoreError
from draftdata.shared.formats import COMPLETION_FORMAT, FAILURE_FORMAT, check_format
from draftdata.shared.formats import iter_completions as _completions
from draftdata.shared.formats import iter_failures as _failures
from draftdata.store.base import Store
from draftdata.store.lease import refuse_live_writer
from draftdata.store.local import LocalStore
from draftdata.store.opener import open_store
from draftdata.store.quarantine import not_read_now, quarantined_in, set_aside, store_condition
from draftdata.store.read import COMPLETIONS_PREFIX, FAILURES_PREFIX, parquet_file

# what a damaged shard can raise on the way from bytes to records
_DAMAGE = (
    DraftdataError,
    OSError,
    pa.ArrowException,
    ValueError,
    TypeError,
    KeyError,
    msgspec.DecodeError,
)


@dataclass(frozen=True)
class BadShard:
    """One shard that cannot be read: its key, its rows (None when the footer is gone too)
    and why."""

    key: str
    rows: int | None
    reason: str


@dataclass
class CheckResult:
    """What ``check_run`` found: shards and rows read, the bad shards, and the set-aside ones
    (``earlier``: before this check; ``now``: by it)."""

    url: str
    shards: int = 0
    rows: int = 0
    bad: list[BadShard] = field(default_factory=list)
    unread: list[BadShard] = field(default_factory=list)  # the store failed the read: retry
    earlier: list[str] = field(default_factory=list)
    now: list[str] = field(default_factory=list)


def check_shard(store: Store, key: str) -> tuple[int | None, str | None]:
    """(rows, None) when shard ``key`` reads whole into records, else (rows or None, why) when
    its bytes are damaged. TransientStoreError when the store failed a read (``store_condition``:
    S3 throttling or 5xx, a reset or timed-out connection): the shard is not known to be bad."""
    rows: int | None = None
    try:
        pf = parquet_file(store, key)
        rows = pf.metadata.num_rows
        completions = key.startswith(COMPLETIONS_PREFIX)
        check_format(pf.schema_arrow, COMPLETION_FORMAT if completions else FAILURE_FORMAT, key)
        table = pf.read()
        n = 0
        for _ in _completions(table) if completions else _failures(table):
            n += 1
        if n != rows:
            return rows, f"{n} rows decoded of the {rows} its footer counts"
    except _DAMAGE as exc:
        cause = store_condition(exc)
        if cause is not None:
            raise not_read_now(store, key, cause) from exc
        text = " ".join(str(exc).split())[:240] or type(exc).__name__
        return rows, text.replace(store.key_url(key) + ": ", "")
    return rows, None


def check_run(url: str, *, quarantine: bool = False) -> CheckResult:
    """Read every completions and failures shard of the run at ``url`` in full; with
    ``quarantine`` set each unreadable one aside (LeaseHeldError while a live generate writes
    the run: then nothing is changed). StoreError when ``url`` holds no run."""
    store = open_store(url)
    if not store.exists("manifest.json"):
        raise StoreError(f"{store.url}: no manifest.json; not a draftdata run")
    if quarantine:
        refuse_live_writer(store, "run check --quarantine")
    listing = store.list()
    aside = quarantined_in(listing)
    keys = [
        k
        for k in listing
        if k.startswith((COMPLETIONS_PREFIX, FAILURES_PREFIX)) and k.endswith(".parquet")
    ]
    result = CheckResult(url=store.url, earlier=sorted(k for k in keys if k in aside))
    todo = [k for k in keys if k not in aside]
    workers = 4 if isinstance(store, LocalStore) else 16
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo) or 1))) as pool:
        for key, (rows, why, later) in zip(
            todo, pool.map(lambda k: _check(store, k), todo), strict=True
        ):
            _tally(result, key, rows, why, later)
    if quarantine:
        suspects, result.bad = result.bad, []
        for bad in suspects:
            # read once more before the create-only marker: a shard is set aside for good
            rows, why, later = _check(store, bad.key)
            result.shards -= 1  # counted again by its second read
            _tally(result, bad.key, rows, why, later)
            if why is not None and set_aside(store, bad.key, why):
                result.now.append(bad.key)
    return result


def _check(store: Store, key: str) -> tuple[int | None, str | None, str | None]:
    """``check_shard`` as (rows, why damaged, why not read now)."""
    try:
        rows, why = check_shard(store, key)
    except TransientStoreError as exc:
        return None, None, str(exc).replace(store.key_url(key) + ": ", "")
    return rows, why, None


def _tally(
    result: CheckResult, key: str, rows: int | None, why: str | None, later: str | None
) -> None:
    """Count one shard: read whole, damaged (``bad``) or not read now (``unread``)."""
    if later is not None:
        result.unread.append(BadShard(key, rows, later))
        return
    result.shards += 1
    if why is None:
        result.rows += rows or 0
    else:
        result.bad.append(BadShard(key, rows, why))
