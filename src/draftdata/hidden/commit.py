"""The commit layer: sample files created once in the set's store, the done-set, bounded staging.

**Exactly once without a window.** Every sample's file name is fixed by its row before any
forward pass (``plan.py`` assigns rows; ``hidden_index.parquet``, committed before the first
sample file, says which row and file hold which sample id). A file is committed by the store's
create-only write (local: temp file, fsync, no-replace link; S3: ``If-None-Match: *``), so a
file is either whole at its name or absent, and **the done-set is the listing of those names**
(``done_rows``). There is no second record to write after the file, so there is no moment
between "file written" and "file recorded" for a kill -9 to fall in: a file a killed command
committed is done for the next one, which skips its row and never writes it again (no rewrite:
the name is taken, and the store refuses to replace it); a file it had not committed is absent
and is made again. Temp files a kill leaves locally (``.<name>.tmp-*``) are never listed, and
neither trainer's reader takes them (speculators opens ``hs_<row>.safetensors`` by name,
SpecForge's walk keeps only names ending ``.ckpt`` / ``.ckpt.gz``).

**Bounded staging.** Encoded files wait in memory for the store (S3 uploads run on threads)
up to ``staging_bytes``; ``Uploader.submit`` blocks the producer (the forward pass) while the
store is behind. Nothing is staged on local disk or ``/dev/shm``: a local store writes its temp
file beside the final one. A full, over-quota or read-only destination disk is one line
(``errors.disk_errors``: ``KEY: cannot write: no space left on the device; ...``) and stops the
command; what was committed stays and the same command resumes.

**One writer.** The caller holds the set's lease (``store/lease.py``); ``commit`` checks it
before every file, so a process that lost it (frozen, then taken over) writes nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from draftdata.errors import AlreadyExistsError, disk_errors
from draftdata.hidden.writer import HIDDEN_FOLDER, Writer
from draftdata.store.base import Store

ELSEWHERE = "choose another --out"


class LeaseCheck(Protocol):
    """What the commit layer needs of a lease: ``check`` raises once it is lost
    (``store.lease.Lease`` in the command's process, ``run.LeaseWatch`` in a worker)."""

    def check(self) -> None:
        """Raise LeaseLostError (or a StoreError) unless the lease is still held."""
        ...


class Commits:
    """The set's sample files in ``store``: what is done, and committing one more."""

    def __init__(self, store: Store, writer: Writer, lease: LeaseCheck | None = None) -> None:
        self.store = store
        self.writer = writer
        self.lease = lease

    def done_rows(self, listing: dict[str, int] | None = None) -> dict[int, int]:
        """row -> size of every sample file the store holds now (one listing; ``listing``:
        the folder's key -> size already made, the stage's start's)."""
        done: dict[int, int] = {}
        if listing is None:
            listing = self.store.list_sizes(HIDDEN_FOLDER)
        for key, size in listing.items():
            row = self.writer.row_of(key)
            if row is not None:
                done[row] = size
        return done

    def commit(self, row: int, data: bytes) -> bool:
        """Create row ``row``'s file holding ``data``: True when this call created it, False
        when the name was already taken (never replaced)."""
        if self.lease is not None:
            self.lease.check()
        key = self.writer.key(row)
        try:
            with disk_errors(self.store.key_url(key), ELSEWHERE):
                self.store.put_new(key, data)
        except AlreadyExistsError:
            return False
        return True


class Uploader:
    """Commits on ``threads`` threads with at most ``limit`` bytes of files waiting (see the
    module docstring). ``submit`` raises the first error a commit met; ``close`` waits for the
    rest and raises it too. ``on_done(row, size, created)`` is called from the commit thread."""

    def __init__(
        self,
        commits: Commits,
        limit: int,
        *,
        threads: int = 4,
        on_done: Callable[[int, int, bool], None] | None = None,
    ) -> None:
        self.commits = commits
        self.limit = limit
        self.on_done = on_done
        self.staged = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="draftdata-commit")
        self._futures: set[Future[None]] = set()

    def submit(self, row: int, data: bytes) -> None:
        """Queue row ``row``'s file; blocks while ``limit`` bytes are already waiting (one file
        larger than the limit goes alone)."""
        size = len(data)
        with self._cond:
            while self._error is None and self.staged > 0 and self.staged + size > self.limit:
                self._cond.wait()
            self._raise()
            self.staged += size
        fut = self._pool.submit(self._run, row, data)
        self._futures.add(fut)
        fut.add_done_callback(self._futures.discard)

    def _run(self, row: int, data: bytes) -> None:
        try:
            created = self.commits.commit(row, data)
            if self.on_done is not None:
                self.on_done(row, len(data), created)
        except BaseException as exc:
            with self._cond:
                if self._error is None:
                    self._error = exc
        finally:
            with self._cond:
                self.staged -= len(data)
                self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait for every queued file; raise the first error any met."""
        self._pool.shutdown(wait=True)
        with self._cond:
            self._raise()

    def abandon(self) -> None:
        """Stop without waiting for queued files (an error or interruption): they are not
        committed, and the next command makes them again."""
        self._pool.shutdown(wait=False, cancel_futures=True)
