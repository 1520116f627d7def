"""The committer: generate's commit path from the Run's buffers to the store, through outages.

``Committer.loop`` runs beside the dispatcher and calls ``Run.flush`` (in a worker thread)
whenever it is due. What it does when the store misbehaves, each said in one log line per change
of state, never one per retry:

- **Store outage.** A flush that fails with a StoreError that is an outage (throttling or 5xx
  after botocore's retries, a timeout, a connection error, a lease no heartbeat renews, a full
  disk) keeps its records in the Run and is retried with a capped exponential backoff (1 s
  doubling to ``store_retry_max``).
- **Bounded memory.** ``over_bound`` tells the engine to pause dispatch while more than
  ``max_uncommitted`` records wait, and to resume when they are committed.
- **No loss at the end.** ``drain`` keeps retrying after the last prompt is answered instead of
  closing with uncommitted records (a second interrupt, or the end of an interrupt's grace
  period, leaves; those are generated again on resume).
- **A refusal is not an outage.** A StoreError that waiting cannot cure (``outage`` False:
  access denied, missing, invalid or expired credentials, another writer started the run with
  other settings, a foreign object, a protected prefix)
  and any other DraftdataError (a run format this version does not read) stop the run at once
  with that error's one line, like a lost lease; nothing committed is lost.
- **A bug is not an outage.** Any other exception while committing calls ``abort`` with a
  RunAbortedError (one line, the run stops at once, the same command resumes).

It does not decide what is committed (the Run does) nor stop the dispatcher itself (the engine
does, through ``abort`` and the pause flag).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

from draftdata.errors import DraftdataError, RunAbortedError, StoreError
from draftdata.generate.config import GenerateConfig
from draftdata.store.run import Run

Abort = Callable[[DraftdataError, BaseException | None], None]


class Committer:
    """Commits ``run``'s buffers for one engine (see the module docstring)."""

    def __init__(
        self,
        run: Run,
        config: GenerateConfig,
        *,
        log: Callable[[str], None],
        clock: Callable[[], float],
        abort: Abort,
        rng: random.Random | None = None,
    ) -> None:
        self.run = run
        self.cfg = config
        self.log = log
        self.clock = clock
        self._abort = abort
        self.rng = rng or random.Random()
        self.down_since: float | None = None  # the store refuses writes since then
        self.peak_uncommitted = 0
        self.failed = False  # an unexpected error: nothing more is tried
        self._draining = False
        self.uncommitted = 0  # records the closing commit could not write (resume redoes them)
        self._paused = False

    @property
    def store_down(self) -> bool:
        """Whether the last flush failed (the store does not accept writes now)."""
        return self.down_since is not None

    def _backoff(self, delay: float) -> float:
        return min(self.cfg.store_retry_max, max(1.0, delay * 2))

    async def loop(self, stop: asyncio.Event) -> None:
        """Flush when due (or, in an outage, when the backoff allows) until ``stop`` is set."""
        delay = 0.0
        next_try = 0.0
        while not stop.is_set() and not self.failed and not self._draining:
            now = self.clock()
            retry = self.store_down and self.run.buffered > 0
            if now >= next_try and (retry or self.run.flush_due()):
                if await self.flush():
                    delay = next_try = 0.0
                else:
                    delay = self._backoff(delay)
                    next_try = self.clock() + delay * (0.75 + 0.5 * self.rng.random())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def flush(self) -> bool:
        """One flush; False when the store refused (its records are kept for the next)."""
        if self.failed:
            return False
        started = self.clock()
        try:
            await asyncio.to_thread(self.run.flush)
        except StoreError as exc:
            if not exc.outage:  # a refusal waiting cannot cure (a settings clash, ...)
                self._stop(exc)
                return False
            if self.down_since is None:
                self.down_since = started  # the flush may have retried for a while
                self.log(
                    f"generate: the store does not accept writes ({exc}); "
                    f"{self.run.buffered} records wait, retried with backoff up to "
                    f"{self.cfg.store_retry_max:g} s"
                )
            return False
        except DraftdataError as exc:
            # taken over (RunLeaseError: the other writer continues the run), or a user-facing
            # problem that no retry changes (a run format this version does not read, bad
            # settings)
            self._stop(exc)
            return False
        except Exception as exc:  # a bug, not an outage: stop now, keep what is committed
            self.failed = True
            self._abort(
                RunAbortedError(
                    f"generate: committing to {self.cfg.out} failed: {type(exc).__name__}: "
                    f"{exc}; stopped (committed work is kept; run the same command to resume)"
                ),
                exc,
            )
            return False
        if self.down_since is not None:
            down = self.clock() - self.down_since
            self.down_since = None
            self.log(
                f"generate: the store accepts writes again after {down:.0f} s; "
                "the waiting records are committed"
            )
        return True

    def _stop(self, exc: DraftdataError) -> None:
        """Stop the run on ``exc``, which no retry cures: it ends the command as one line
        (what is committed is kept; the records waiting are generated again on resume)."""
        self.failed = True
        cause: BaseException | None = None
        if isinstance(exc, StoreError):
            exc, cause = (
                type(exc)(f"generate: stopped: {exc} (what was committed is kept)"),
                exc,
            )
        self._abort(exc, cause)

    def over_bound(self) -> bool | None:
        """The new pause state when it changes (True: pause dispatch), else None."""
        waiting = self.run.buffered
        self.peak_uncommitted = max(self.peak_uncommitted, waiting)
        over = waiting > self.cfg.max_uncommitted
        if over == self._paused:
            return None
        self._paused = over
        if over:
            self.log(
                f"generate: dispatch paused: {waiting} records wait for the store "
                f"(more than --max-uncommitted {self.cfg.max_uncommitted})"
            )
        else:
            self.log(f"generate: dispatch resumed ({waiting} records uncommitted)")
        return over

    async def drain(self, leave: Callable[[], bool], *, stopping: bool = False) -> None:
        """Every prompt is settled (or, ``stopping``, the run is interrupted): commit what
        waits; while the store refuses, keep retrying (capped backoff) until it accepts or
        ``leave()`` (a second interrupt, the end of the grace period)."""
        self._draining = True  # the loop stands aside
        said = False
        delay = 0.0
        while self.run.buffered and not self.failed and not leave():
            if await self.flush():
                continue
            if self.failed:
                break
            if not said:
                said = True
                if stopping:
                    said_how = (
                        f"stopping; waiting for the store to accept {self.run.buffered} records "
                        "until the grace period ends (what it does not take is generated again "
                        "on resume)"
                    )
                else:
                    said_how = (
                        "every prompt is answered; waiting for the store to accept "
                        f"{self.run.buffered} records (interrupt twice to leave; they are "
                        "generated again on resume)"
                    )
                self.log(f"generate: {said_how}")
            delay = self._backoff(delay)
            until = self.clock() + delay
            while self.clock() < until and not leave():
                await asyncio.sleep(0.1)

    async def close(self, *, stopping: bool) -> None:
        """Commit what is left and close the run. ``stopping``: the run is already stopping on
        another error, so a failure here is only logged."""
        waiting = self.run.buffered
        try:
            await asyncio.to_thread(self.run.close)
        except StoreError as exc:
            if stopping:
                self.uncommitted = waiting
                self.log(
                    f"generate: could not commit {waiting} records ({exc}); they are "
                    "generated again when you run the same command"
                )
                return
            if not exc.outage:
                raise
            raise StoreError(
                f"generate: the store refused the last {waiting} records ({exc}); they were not "
                "committed and are generated again when you run the same command"
            ) from exc
        except Exception as exc:
            if not stopping:
                raise
            self.uncommitted = waiting
            self.log(f"generate: could not commit {waiting} records: {type(exc).__name__}")
