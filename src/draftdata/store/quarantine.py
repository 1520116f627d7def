"""Setting a run's unreadable shards aside, on a store that never deletes.

A shard whose bytes were damaged after it was committed (a bad disk, a copy cut short, a
flipped page) cannot be read; every reader of the run (export, stats, tokenize, merge, report)
then stops at it, and generate, which reads only the id columns on resume, still counts its
prompts done. The store has no delete and no overwrite (``base.py``), so the shard
stays where it is and a *marker* sets it aside:

    quarantine/<shard key>.json     {format, key, size, reason, time}   (create-only)

e.g. ``quarantine/completions/part-w-000003.parquet.json``. Every reader of a run's shards
honours it: ``read.shard_keys`` and the run dataset of ``stats.readers`` leave a set-aside shard
out, and resume (``resume.py``) does not count its pairs done, so the same generate command
regenerates exactly those prompts. The shard's bytes are kept for inspection; removing them by
hand later changes nothing (the marker still names the key).

``draftdata run check RUN --quarantine`` (``check.py``) is the way to write markers: it reads
every shard in full first. This module only names, reads and writes markers, and words the
message a reader gives when it meets an unreadable shard.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from draftdata.errors import (
    AlreadyExistsError,
    StoreAccessError,
    StoreError,
    TransientStoreError,
    UnreadableShardError,
)
from draftdata.store.base import Store
from draftdata.store.local import os_error

QUARANTINE_PREFIX = "quarantine/"
QUARANTINE_FORMAT = "draftdata.quarantine/1"
_RUN_SHARDS = ("completions/", "failures/")


def marker_key(key: str) -> str:
    """The marker that sets shard ``key`` aside."""
    return f"{QUARANTINE_PREFIX}{key}.json"


def quarantined_in(keys: Iterable[str]) -> set[str]:
    """The shard keys that markers among ``keys`` (a listing of the run) set aside."""
    n = len(QUARANTINE_PREFIX)
    return {k[n:-5] for k in keys if k.startswith(QUARANTINE_PREFIX) and k.endswith(".json")}


def quarantined(store: Store, prefix: str = "") -> set[str]:
    """The shard keys under ``prefix`` that are set aside in the run ``store``."""
    return quarantined_in(store.list(f"{QUARANTINE_PREFIX}{prefix}"))


def set_aside(store: Store, key: str, reason: str) -> bool:
    """Write the marker of ``key`` (create-only); False when it was set aside already."""
    try:
        size: int | None = store.size(key)
    except StoreError:
        size = None
    doc = {
        "format": QUARANTINE_FORMAT,
        "key": key,
        "size": size,
        "reason": reason,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        store.put_new(marker_key(key), (json.dumps(doc, indent=1) + "\n").encode())
    except AlreadyExistsError:
        return False
    return True


def store_condition(exc: BaseException) -> BaseException | None:
    """The error in ``exc`` or its causes that says the store failed a read, not the shard's
    bytes (a throttled or cut S3 request, a reset or timed-out connection, a file the OS cannot
    read now), or None when only the bytes are to blame (a bad footer or checksum, records
    that do not decode). A shard is damaged only on what its bytes show: a read that failed
    for the store is retried, never set aside."""
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, StoreError) and not isinstance(err, UnreadableShardError):
            return err
        if isinstance(err, ConnectionError | TimeoutError):
            return err
        # an OS error with an errno is the OS's or the socket's; pyarrow's own (a failed page
        # checksum is an OSError too) carry none
        if isinstance(err, OSError) and err.errno is not None and not _arrow_error(err):
            return err
        err = err.__cause__
    return None


def _arrow_error(exc: BaseException) -> bool:
    import pyarrow as pa

    return isinstance(exc, pa.ArrowException)


def not_read_now(store: Store, key: str, exc: BaseException) -> StoreError:
    """The error for a shard that could not be read now because of the store (``exc`` is the
    ``store_condition``): retry, the shard is not known to be damaged. A permission problem
    (access denied, a file mode: StoreAccessError or the OS's EACCES/EPERM) is no reason to
    retry: it is said as one, with the path, and raised as StoreAccessError."""
    if isinstance(exc, StoreAccessError):
        return exc
    if isinstance(exc, PermissionError):
        return os_error(exc, exc.filename or store.key_url(key), "read")
    detail = " ".join(str(exc).split()).replace(store.key_url(key) + ": ", "")
    if len(detail) > 240:
        detail = detail[:239] + "…"
    return TransientStoreError(
        f"{store.key_url(key)}: not read now ({detail or type(exc).__name__}): the store "
        "failed the read, not the shard; run the same command again"
    )


def read_error(store: Store, key: str, exc: BaseException, detail: str = "") -> StoreError:
    """The error for ``exc`` met reading shard ``key``: ``not_read_now`` when the store failed
    the read, else ``unreadable`` (``detail`` before the error's text)."""
    cause = store_condition(exc)
    if cause is not None:
        return not_read_now(store, key, cause)
    return unreadable(store, key, f"{detail}{exc}")


def unreadable(store: Store, key: str, detail: str) -> StoreError:
    """The error a reader raises for a shard it cannot read: for a run's completions or
    failures shard it says how to set it aside and regenerate what it held."""
    where = store.key_url(key)
    detail = " ".join(detail.split())  # pyarrow's messages run over several lines
    if len(detail) > 240:
        detail = detail[:239] + "…"
    if not key.startswith(_RUN_SHARDS):
        return StoreError(f"{where}: cannot read parquet ({detail})")
    return UnreadableShardError(
        f"{where}: unreadable shard ({detail}); set it aside with `draftdata run check "
        f"{store.url} --quarantine` (nothing is deleted), then run the same generate command: "
        "it generates that shard's prompts again"
    )
