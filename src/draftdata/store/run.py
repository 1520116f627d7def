"""The Run writer: open or resume a run, buffer results, commit them as create-only shards.

``Run`` holds the buffers and the done-sets and decides when to commit; its parts live beside
it: the manifest (``manifest.py``: create or check, record a change), the done-set rebuild on
resume (``resume.py``), naming and writing shards, rollups and metrics (``shards.py``), the
rollup format (``rollup.py``) and the run lease (``lease.py``).

Layout under the output prefix::

    manifest.json                         written once (manifest.py)
    manifest-history/000001.json          one per allowed config change
    completions/part-<writer>-<seq>.parquet
    failures/part-<writer>-<seq>.parquet
    metrics/<writer>-<seq>.json           progress / summary snapshots
    index/rollup-<writer>-<seq>.parquet   ids of many shards, for a fast resume (rollup.py)

Commit protocol: ``add_completion`` / ``add_failure`` only buffer (thread-safe, no I/O). Every
``flush_records`` records or ``flush_seconds`` seconds the caller runs ``flush()``, which writes
one shard per kind with ``put_new``. A record is committed when its shard object exists whole;
what a crash loses is at most the unflushed buffer, which the next run regenerates. A shard
whose write failed is kept as (key, bytes) and retried with the same key and bytes, so a write
that landed although its response was lost is recognised (identical bytes) and never duplicated.

Resume: ``Run.open`` validates everything before the caller sends a request: protected
prefixes, that the prefix is empty or holds a manifest, that the settings hash matches (or the
change is allowed and recorded: ``--allow-config-change``, or freely while the run holds no
completion, since nothing committed can disagree with the new settings). A change recorded by
this open retries the run's earlier fatal failures once: they were the servers' answer to the
other settings. It then rebuilds the done-set from the rollups and the ``id`` / ``sample``
columns of the shards no rollup covers (parallel column reads; on S3 the footer and id chunks),
and rolls those up when there are many. Writer ids are unique per process (host-pid-random),
so several processes or nodes can write one run as long as they work on disjoint prompts
(e.g. partitioned by id hash).

Nothing before the first commit (``defer_manifest``): a new run's manifest is written with its
first shard, not at open, and no metrics object is written before it; so a command that never
got an answer (a wrong URL, every endpoint refusing, prompts in another schema) leaves no run
behind and the next command starts fresh. Until then the pending settings may still be
completed (``settle``: generate fills in the model from the first completion).

One writer per scope: with ``lease=`` (generate always passes one), ``Run.open`` takes the run
lease of the whole run or of its partition (``lease.py``) before it reads the done-set, and
every shard write first checks that the lease is still held; ``close`` releases it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from draftdata.errors import (
    AlreadyExistsError,
    ConfigError,
    RunMismatchError,
)
from draftdata.records import FATAL_REASONS, Completion, Failure
from draftdata.shared.formats import completions_table, failures_table
from draftdata.store.base import Store
from draftdata.store.doneset import hash_pairs, pair_hash
from draftdata.store.lease import Lease, LeaseOptions, acquire
from draftdata.store.manifest import (
    MANIFEST_KEY,
    check_empty,
    load_manifest,
    manifest_bytes,
    new_manifest,
    open_manifest,
    settings_hash,
)
from draftdata.store.opener import open_store
from draftdata.store.protect import check_not_protected
from draftdata.store.read import COMPLETIONS_PREFIX
from draftdata.store.resume import rebuild_done_sets
from draftdata.store.rollup import (
    ROLLUP_EVERY,
    Entry,
)
from draftdata.store.shards import ShardWriter, check_writer_id, default_writer_id
from draftdata.store.write import parquet_bytes
from draftdata.support.metrics import StageStats

_Rows = tuple[list[str], list[int], list[str | None] | None]

DEFAULT_FLUSH_RECORDS = 256
DEFAULT_FLUSH_SECONDS = 5.0


class Run:
    """An open run: the done-set, the write buffers and the shard writer. Use ``Run.open``."""

    def __init__(
        self,
        store: Store,
        manifest: dict[str, Any],
        *,
        writer_id: str,
        retry_failed: bool,
        flush_records: int,
        flush_seconds: float,
        clock: Callable[[], float],
        keys: list[str],
        stats: StageStats,
        written: bool = True,
        changes: list[str] | None = None,
    ) -> None:
        self.store = store
        self.manifest = manifest
        self.manifest_written = written  # False: written with the first shard (``settle``)
        self._manifest_frozen = written
        self.changes = changes or []  # settings changes this open recorded
        self.writer_id = writer_id
        self.retry_failed = retry_failed
        self.flush_records = flush_records
        self.flush_seconds = flush_seconds
        self.stats = stats
        self._clock = clock
        self._lock = threading.Lock()  # guards buffers and done-sets
        self._flush_lock = threading.Lock()  # one flush at a time
        self._completions: list[Completion] = []
        self._failures: list[Failure] = []
        # (kind, parquet bytes, records, (ids, samples, reasons or None)) waiting to be written
        self._pending: list[tuple[str, bytes, int, _Rows]] = []
        self._encoding = 0  # records taken from the buffers, not yet in _pending (a flush)
        self._recent: list[Entry] = []  # committed shards not yet in a rollup of ours
        self._last_flush = clock()
        self._closed = False
        self._writer = ShardWriter(store, writer_id, keys, stats)
        self.lease: Lease | None = None
        with stats.timed("store.done_set_rebuild"):
            self._completed, self._fatal, uncovered = rebuild_done_sets(store, keys, stats)
        self.resumed_done = len(self._completed)
        self.resumed_fatal = len(self._fatal)
        if len(uncovered) >= ROLLUP_EVERY:
            # many shards no rollup covers (a writer killed often, or an older draftdata):
            # roll them up now so that the next start reads one object instead of them all
            self._recent = uncovered
            with stats.timed("store.write_rollup"):
                self._write_rollup()
            self._recent = []

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str,
        *,
        settings: dict[str, Any],
        protect: Sequence[str] = (),
        allow_config_change: bool = False,
        retry_failed: bool = False,
        flush_records: int = DEFAULT_FLUSH_RECORDS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        writer_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        lease: LeaseOptions | None = None,
        log: Callable[[str], None] | None = None,
        defer_manifest: bool = False,
    ) -> Run:
        """Create or resume the run at ``url``; every safety check happens here, before any
        request is sent.

        Refuses (ProtectedPrefixError) an output overlapping a protected prefix; refuses
        (RunMismatchError) a non-empty prefix without a manifest, and a manifest whose settings
        hash differs unless ``allow_config_change`` or the run holds no completion (then the
        change is recorded in ``changes``, and the fatal failures are retried once). Committed
        (id, sample) pairs, and fatal failures unless ``retry_failed``, count as done. With
        ``lease``, takes the run lease first (LeaseHeldError when a live process holds it).
        ``defer_manifest``: a new run's manifest is written with its first shard (module doc).
        """
        if flush_records < 1:
            raise ConfigError(f"flush_records: {flush_records}; must be at least 1")
        if not flush_seconds > 0:
            raise ConfigError(f"flush_seconds: {flush_seconds}; must be greater than 0")
        wid = check_writer_id(writer_id or default_writer_id())
        check_not_protected(url, protect, what="output prefix", describe=True)
        store = open_store(url, protect=protect)
        stats = StageStats("store")
        held = None
        if lease is not None:
            if not store.exists(MANIFEST_KEY):  # never write a lease into a foreign prefix
                check_empty(store, store.list())
            held = acquire(
                store,
                lease.scope,
                ttl=lease.ttl,
                wait=lease.wait,
                on_lost=lease.on_lost,
                log=log,
                writer_id=wid,
            )
        try:
            with stats.timed("store.list"):
                keys = store.list()
            written = True
            before: str | None = None
            if defer_manifest and MANIFEST_KEY not in keys:
                check_empty(store, keys)
                manifest = new_manifest(settings)
                manifest.update(history=[], effective_settings=settings)
                manifest["effective_hash"] = manifest["settings_hash"]
                written = False
            else:
                if MANIFEST_KEY in keys:
                    before = load_manifest(store)["effective_hash"]
                # a run without a completion takes new settings: nothing can disagree with them
                free = not any(k.startswith(COMPLETIONS_PREFIX) for k in keys)
                manifest = open_manifest(store, keys, settings, allow_config_change or free)
            changes: list[str] = []
            if before is not None and before != manifest["effective_hash"]:
                changes = list(manifest["history"][-1].get("changes") or [])
                retry_failed = True  # earlier fatal failures answered other settings
            run = cls(
                store,
                manifest,
                writer_id=wid,
                retry_failed=retry_failed,
                flush_records=flush_records,
                flush_seconds=flush_seconds,
                clock=clock,
                keys=keys,
                stats=stats,
                written=written,
                changes=changes,
            )
        except BaseException:
            if held is not None:
                held.release()
            raise
        run.lease = held
        return run

    def settle(self, **settings: object) -> None:
        """Complete the settings of a run whose manifest is not written yet (``defer_manifest``):
        ``settle(model=...)``. Nothing once it is written (the run is what it recorded)."""
        with self._lock:
            if self._manifest_frozen:
                return
            merged = {**self.manifest["settings"], **settings}
            fresh = new_manifest(merged)
            fresh["run_id"] = self.manifest["run_id"]  # the metrics name one run id
            fresh.update(history=[], effective_settings=merged)
            fresh["effective_hash"] = fresh["settings_hash"]
            self.manifest = fresh

    def _write_manifest(self) -> None:
        """(under the flush lock) Write the deferred manifest before the first shard; a run
        created meanwhile by another writer (a partition) must have the same settings."""
        if self.manifest_written:
            return
        if self.lease is not None:
            self.lease.check()
        with self._lock:
            self._manifest_frozen = True  # ``settle`` changes nothing from here on
            manifest = self.manifest
        mine = {k: v for k, v in manifest.items() if not k.startswith(("effective", "hist"))}
        try:
            self.store.put_new(MANIFEST_KEY, manifest_bytes(mine))
        except AlreadyExistsError:
            theirs = load_manifest(self.store)
            if theirs["effective_hash"] != settings_hash(manifest["settings"]):
                raise RunMismatchError(
                    f"{self.store.url}: another writer (a partition) started this run with "
                    "other settings meanwhile; run the same command again to see what differs, "
                    "then use the same settings as the other writer or another --out"
                ) from None
            self.manifest = theirs
        self.manifest_written = True

    # -- the done-set -------------------------------------------------------------------------

    def is_done(self, id: str, sample: int = 0) -> bool:
        """Whether (id, sample) is settled: completed, or failed fatally (unless retry_failed)."""
        h = pair_hash(id, sample)
        with self._lock:
            if self._completed.contains_hash(h):
                return True
            return not self.retry_failed and self._fatal.contains_hash(h)

    def done_mask(
        self, ids: Sequence[str], samples: Sequence[int] | None = None
    ) -> npt.NDArray[np.bool_]:
        """``is_done`` for many pairs at once (a numpy bool array): the fast way to skip the
        settled prompts of a large file on resume, a batch of ids at a time."""
        hashes = hash_pairs(list(ids), None if samples is None else list(samples))
        with self._lock:
            done = self._completed.contains_many(hashes)
            if not self.retry_failed:
                done |= self._fatal.contains_many(hashes)
        return done

    @property
    def buffered(self) -> int:
        """Records added but not yet committed (including shards waiting for a retry)."""
        with self._lock:
            return (
                len(self._completions)
                + len(self._failures)
                + self._encoding
                + sum(p[2] for p in self._pending)
            )

    # -- buffering ----------------------------------------------------------------------------

    def add_completion(self, c: Completion) -> bool:
        """Buffer a completion (no I/O); False (and dropped) if its pair is already completed."""
        h = pair_hash(c.id, c.sample)
        with self._lock:
            self._check_open()
            if not self._completed.add_hash(h):
                self.stats.add("store.duplicates_dropped")
                return False
            self._completions.append(c)
        return True

    def add_failure(self, f: Failure) -> bool:
        """Buffer a failure (no I/O); False (and dropped) if the pair is already completed."""
        h = pair_hash(f.id, f.sample)
        with self._lock:
            self._check_open()
            if self._completed.contains_hash(h):
                self.stats.add("store.duplicates_dropped")
                return False
            if f.reason in FATAL_REASONS:
                self._fatal.add_hash(h)
            self._failures.append(f)
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Run is closed")

    def flush_due(self) -> bool:
        """Whether ``flush()`` should run now (K records buffered, or T seconds since the last)."""
        n = self.buffered
        if n == 0:
            return False
        return n >= self.flush_records or self._clock() - self._last_flush >= self.flush_seconds

    # -- committing ---------------------------------------------------------------------------

    def flush(self) -> int:
        """Commit the buffers as one shard per kind (blocking I/O); returns records committed.

        Transient store errors are retried with backoff; if the store still fails, the shard is
        kept and retried (same bytes) by the next flush, and the error is raised.
        """
        with self._flush_lock:
            with self._lock:
                comps, self._completions = self._completions, []
                fails, self._failures = self._failures, []
                self._encoding = len(comps) + len(fails)  # still counted by ``buffered``
                self._last_flush = self._clock()
            shards: list[tuple[str, bytes, int, _Rows]] = []
            try:
                if comps:
                    table = completions_table(comps)
                    rows: _Rows = ([c.id for c in comps], [c.sample for c in comps], None)
                    shards.append(
                        ("completions", parquet_bytes(table, checksums=True), len(comps), rows)
                    )
                if fails:
                    table = failures_table(fails)
                    ids = [f.id for f in fails]
                    rows = (ids, [f.sample for f in fails], [f.reason for f in fails])
                    shards.append(
                        ("failures", parquet_bytes(table, checksums=True), len(fails), rows)
                    )
            finally:
                with self._lock:
                    self._pending.extend(shards)
                    self._encoding = 0
            committed = 0
            if self._pending:
                self._write_manifest()
            while self._pending:
                kind, data, n, rows = self._pending[0]
                if self.lease is not None:
                    self.lease.check()  # LeaseLostError: another process took the run over
                key = self._writer.write_shard(kind, data)
                with self._lock:
                    self._pending.pop(0)
                self._recent.append((key, *rows))
                self.stats.add(f"store.{kind}_shards")
                self.stats.add(f"store.{kind}_records", n)
                self.stats.add("store.bytes_written", len(data))
                self.stats.add("store.committed", n)
                committed += n
            if len(self._recent) >= ROLLUP_EVERY:
                self._write_rollup()
            return committed

    def _write_rollup(self) -> None:
        """Roll our recent shards up into one object (best effort: it only speeds resume)."""
        if self._recent and self._writer.write_rollup(self._recent):
            self._recent = []

    def write_metrics(self, data: dict[str, Any]) -> str | None:
        """Write a create-only ``metrics/<writer>-<seq>.json`` object; returns its key (None,
        writing nothing, while the run's manifest is not written: nothing is recorded yet)."""
        if not self.manifest_written:
            return None
        run_id = self.manifest.get("run_id")
        return self._writer.write_metrics({"writer": self.writer_id, "run_id": run_id, **data})

    def close(self) -> None:
        """Flush what is buffered and close the run (further adds raise)."""
        if self._closed:
            return
        try:
            self.flush()
            if len(self._recent) >= 2:  # a rollup of one shard would save nothing
                with self._flush_lock:
                    self._write_rollup()
            with self._lock:
                self._closed = True
        finally:  # a flush that failed (the store is down) must not leave the lease held
            self.release_lease()

    def release_lease(self) -> None:
        """Release the run lease, if held (idempotent; ``close`` does it)."""
        if self.lease is not None:
            self.lease.release()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
