"""Naming and writing one writer's create-only objects: shards, rollups and metrics snapshots.

Every object a writer makes is ``<kind>/part-<writer>-<seq>.parquet``,
``index/rollup-<writer>-<seq>.parquet`` or ``metrics/<writer>-<seq>.json`` with its own sequence
numbers, continued after what the run already holds. A name someone else's object holds is
never touched (the next number is taken); a transient store error is retried with backoff and
the same bytes. This module writes what it is given; what to write and when is ``run.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from typing import Any

from draftdata.errors import AlreadyExistsError, ConfigError, StoreError, TransientStoreError
from draftdata.store.base import Store
from draftdata.store.read import METRICS_PREFIX
from draftdata.store.rollup import ROLLUP_PREFIX, Entry, rollup_table
from draftdata.store.write import parquet_bytes
from draftdata.support.metrics import StageStats

WRITE_ATTEMPTS = 6
_SHARD_RE = re.compile(r"part-(?P<writer>.+)-(?P<seq>\d{6,})\.parquet$")
_ROLLUP_RE = re.compile(r"^index/rollup-(?P<writer>.+)-(?P<seq>\d{6,})\.parquet$")


def default_writer_id() -> str:
    """A writer id unique per process: ``<host>-<pid>-<random>``, safe in object names."""
    host = re.sub(r"[^A-Za-z0-9_.]+", "_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def check_writer_id(writer_id: str) -> str:
    """``writer_id`` if it is safe in object names, else ConfigError."""
    if not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,99}", writer_id):
        raise ConfigError(f"writer id {writer_id!r}: use 1-100 characters of A-Z a-z 0-9 _ . -")
    return writer_id


def shard_writer(key: str) -> str | None:
    """The writer id in a shard's key (``.../part-<writer>-<seq>.parquet``), None if it has none."""
    m = _SHARD_RE.search(key)
    return m.group("writer") if m else None


def next_seq(keys: list[str], writer_id: str, pattern: re.Pattern[str] | None = None) -> int:
    """The next free sequence number of ``writer_id`` among ``keys`` (shards by default)."""
    seq = 0
    for key in keys:
        m = (pattern or _SHARD_RE).search(key)
        if m and m.group("writer") == writer_id:
            seq = max(seq, int(m.group("seq")) + 1)
    return seq


class ShardWriter:
    """One writer's create-only objects in one run store, numbered after what ``keys`` hold."""

    def __init__(self, store: Store, writer_id: str, keys: list[str], stats: StageStats) -> None:
        self.store = store
        self.writer_id = writer_id
        self.stats = stats
        self._seq = next_seq(keys, writer_id)
        self._rollup_seq = next_seq(keys, writer_id, _ROLLUP_RE)
        self._metrics_seq = 0

    def write_shard(self, kind: str, data: bytes) -> str:
        """Write ``data`` as the next ``<kind>/part-...`` shard; returns its key
        (TransientStoreError after WRITE_ATTEMPTS failed tries)."""
        delay = 0.5
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            key = f"{kind}/part-{self.writer_id}-{self._seq:06d}.parquet"
            try:
                with self.stats.timed("store.write"):
                    self.store.put_new(key, data)
            except AlreadyExistsError:
                # Someone else's object holds this name: never touch it, take the next one.
                self.stats.add("store.name_collisions")
                self._seq += 1
                continue
            except TransientStoreError:
                self.stats.add("store.transient_errors")
                if attempt == WRITE_ATTEMPTS:
                    raise
                time.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
                delay = min(delay * 2, 8.0)
                continue
            self._seq += 1
            return key
        raise TransientStoreError(f"{self.store.url}: could not write a {kind} shard")

    def write_rollup(self, entries: list[Entry]) -> bool:
        """Write the ids of ``entries``' shards as one rollup; False when the store failed
        (best effort: a rollup only speeds resume, so the caller keeps the entries)."""
        data = parquet_bytes(rollup_table(entries))
        for _ in range(100):
            key = f"{ROLLUP_PREFIX}rollup-{self.writer_id}-{self._rollup_seq:06d}.parquet"
            self._rollup_seq += 1
            try:
                self.store.put_new(key, data)
            except AlreadyExistsError:
                self.stats.add("store.name_collisions")
                continue
            except StoreError:
                self.stats.add("store.rollup_errors")
                return False  # keep the entries: the next attempt covers them
            self.stats.add("store.rollups")
            return True
        return False

    def write_metrics(self, body: dict[str, Any]) -> str:
        """Write ``body`` as the next create-only ``metrics/<writer>-<seq>.json``; its key."""
        raw = json.dumps(body, indent=1, default=str).encode()
        while True:
            key = f"{METRICS_PREFIX}{self.writer_id}-{self._metrics_seq:06d}.json"
            self._metrics_seq += 1
            try:
                self.store.put_new(key, raw)
            except AlreadyExistsError:
                continue
            return key
