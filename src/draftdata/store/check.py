"""``draftdata run check RUN``: read every shard of a run in full, and set unreadable ones aside.

Generate's resume reads only the id columns of a run's shards, and a reader stops at the first
shard it cannot read. ``check_run`` reads every completions and failures shard whole: the
footer, the format, every page (with the CRC32 generate writes per page: a damaged byte is
never taken for data) and every row decoded as a record. It reports each shard that fails, with
its row count where the footer still tells it. With ``quarantine=True`` it writes a marker for
each (``quarantine.py``: create-only, nothing deleted), after which every reader leaves those
shards out and the same generate command generates their prompts again.

Shards set aside before are not read again; they are counted. A run that a live generate still
writes is checked but not changed (its writer decides what is done until it stops).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa

from draftdata.errors import DraftdataError, StoreError
from draftdata.formats import COMPLETION_FORMAT, FAILURE_FORMAT, check_format
from draftdata.formats import iter_completions as _completions
from draftdata.formats import iter_failures as _failures
from draftdata.store.base import Store
from draftdata.store.lease import refuse_live_writer
from draftdata.store.local import LocalStore
from draftdata.store.quarantine import quarantined_in, set_aside
from draftdata.store.read import COMPLETIONS_PREFIX, FAILURES_PREFIX, parquet_file
from draftdata.store.store import open_store

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
    earlier: list[str] = field(default_factory=list)
    now: list[str] = field(default_factory=list)


def check_shard(store: Store, key: str) -> tuple[int | None, str | None]:
    """(rows, None) when shard ``key`` reads whole into records, else (rows or None, why)."""
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
        for key, (rows, why) in zip(
            todo, pool.map(lambda k: check_shard(store, k), todo), strict=True
        ):
            result.shards += 1
            if why is None:
                result.rows += rows or 0
            else:
                result.bad.append(BadShard(key, rows, why))
    if quarantine:
        for bad in result.bad:
            if set_aside(store, bad.key, bad.reason):
                result.now.append(bad.key)
    return result
