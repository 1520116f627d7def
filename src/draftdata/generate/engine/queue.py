"""The dispatcher's queue: which job goes next, longest expected answer first.

Three parts, served in this order:

- **ready**: jobs that come back -- a retry whose backoff is over, a job requeued from an
  endpoint taken out, the samples of a job split for a server without ``n``. They go first.
- **fresh**: jobs read from the prompts and never sent. With ``ordered`` (``--order length``)
  the one expected to answer longest goes first (the LPT rule: the long answers overlap with
  the rest of the job and its tail is short ones), ties in file order; else file order. Jobs
  are grouped by what their estimate depends on (``length.job_key``: source, domain,
  prompt-length bucket, token cap), so ordering costs a heap of keys, not of jobs, and the
  estimates are refreshed per key as the model learns (at geometrically spaced answer counts
  and at least every second of the clock). A source/domain with no figure at all (no answer,
  no prior, nothing running) sends one prompt at once, ahead of the order: it is measured at
  the start, never ranked by a guess and left for last (``LengthModel.measured``).
- **waiting**: jobs backing off, by when they are due; ``promote`` moves the due ones to ready.

``pop`` takes the next job; ``pop_fitting`` the first job in that order that a predicate
accepts (a slower endpoint near the end of the job takes the longest job that fits it,
``placement.TailPlan``); ``work`` is the expected output tokens of everything queued.

The look-ahead is bounded: the dispatcher reads prompts only while fewer than its window are
queued or running, so the order is longest-first *within the window*, not over the whole file.
That is the choice for a file of millions: over most of the run any order keeps the fleet full;
what a global order buys is a short tail, and the tail is the last window, which drains longest
first. In between, long prompts leave the window at once and short ones gather in it (each
waits at most about a window's worth of dispatches), so the last window is mostly short ones.
Memory stays the window plus one small entry per key.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterator

from draftdata.generate.engine.length import JobKey, LengthModel, job_key
from draftdata.generate.engine.work import Job

_FIRST_REKEY = 16  # answers before the first refresh of the keys' estimates
_REKEY_S = 1.0  # ... and at least this often (what running requests produced moves on)

Group = tuple[str, str]  # (source, domain)


class JobQueue:
    """Jobs waiting for an endpoint: ready, then fresh (longest expected first), and the
    backoff heap (module docstring)."""

    def __init__(self, lengths: LengthModel, *, ordered: bool) -> None:
        self.lengths = lengths
        self.ordered = ordered
        self.ready: deque[Job] = deque()
        self.waiting: list[tuple[float, int, Job]] = []  # (due at, seq, job): backoff heap
        self._seq = itertools.count()
        # fresh, ordered: per key its jobs in file order; a heap of (-expected, head seq, key)
        # with stale entries skipped (a key's head moved on, or it emptied)
        self._keys: dict[JobKey, deque[tuple[int, Job]]] = {}
        self._value: dict[JobKey, float] = {}  # -expected tokens per key, as of the last rekey
        self._heap: list[tuple[float, int, JobKey]] = []
        self._sorted: list[JobKey] | None = None  # keys, longest first (``pop_fitting``)
        self._unknown: dict[Group, set[JobKey]] = {}  # unmeasured groups with jobs queued
        self._fresh = 0
        self._samples: Counter[JobKey] = Counter()  # samples of the fresh jobs, per key
        self._fifo: deque[Job] = deque()  # fresh, unordered
        self._next_rekey = _FIRST_REKEY
        self._rekeyed = 0.0

    # -- sizes --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Jobs waiting for an endpoint (ready and fresh; not the ones backing off)."""
        return len(self.ready) + self.fresh

    def __bool__(self) -> bool:
        return bool(self.ready) or self.fresh > 0

    @property
    def fresh(self) -> int:
        """Jobs read and never sent."""
        return self._fresh if self.ordered else len(self._fifo)

    def backing_off(self) -> Iterator[Job]:
        """The jobs waiting for their backoff to end."""
        return (job for _, _, job in self.waiting)

    # -- ready and waiting --------------------------------------------------------------------

    def requeue(self, job: Job) -> None:
        """``job`` goes first in line (it came back)."""
        self.ready.appendleft(job)

    def put_back(self, jobs: list[Job]) -> None:
        """``jobs``, taken but not sent, go back first in line, in their order."""
        self.ready.extendleft(reversed(jobs))

    def later(self, job: Job, due: float) -> None:
        """``job`` waits for its backoff until ``due``."""
        heapq.heappush(self.waiting, (due, next(self._seq), job))

    def next_due(self) -> float | None:
        """When the next backoff ends (None: none waits)."""
        return self.waiting[0][0] if self.waiting else None

    def promote(self, now: float) -> None:
        """Jobs whose backoff is over go to ready."""
        while self.waiting and self.waiting[0][0] <= now:
            _, _, job = heapq.heappop(self.waiting)
            job.ready_since = now
            self.ready.appendleft(job)

    # -- fresh --------------------------------------------------------------------------------

    def push(self, job: Job) -> None:
        """Add a job read from the prompts."""
        self._fresh += 1
        key = job_key(job)
        self._samples[key] += len(job.samples)
        if not self.ordered:
            self._fifo.append(job)
            return
        jobs = self._keys.get(key)
        seq = next(self._seq)
        if jobs is None:
            jobs = self._keys[key] = deque()
        if not jobs:
            value = self._value.get(key)
            if value is None:
                value = self._value[key] = -self.lengths.expect_key(key)
                self._sorted = None
            heapq.heappush(self._heap, (value, seq, key))
            group = (key[0], key[1])
            if not self.lengths.measured(*group):
                self._unknown.setdefault(group, set()).add(key)
        jobs.append((seq, job))

    def pop(self) -> Job:
        """The next job: ready first, then an unmeasured group's, then the longest expected
        fresh one (IndexError when empty)."""
        if self.ready:
            return self.ready.popleft()
        if not self.ordered:
            job = self._fifo.popleft()
            self._gone(job_key(job), job)
            return job
        if not self._fresh:
            raise IndexError("pop from an empty queue")
        self._maybe_rekey()
        key = self._explore()
        if key is None:
            while True:
                value, seq, key = self._heap[0]
                jobs = self._keys.get(key)
                if jobs and jobs[0][0] == seq and self._value.get(key) == value:
                    break
                heapq.heappop(self._heap)  # stale
        return self._take(key)

    def pop_fitting(self, fits: Callable[[Job], bool]) -> Job | None:
        """The first job in ``pop``'s order for which ``fits(job)``, taken out; None when
        none fits. Fresh jobs are judged per key (its jobs expect the same), longest first."""
        for i, job in enumerate(self.ready):
            if fits(job):
                del self.ready[i]
                return job
        if not self.ordered:
            for i, job in enumerate(self._fifo):
                if fits(job):
                    del self._fifo[i]
                    self._gone(job_key(job), job)
                    return job
            return None
        if not self._fresh:
            return None
        self._maybe_rekey()
        if self._sorted is None:
            self._sorted = sorted(self._value, key=lambda k: (self._value[k], k))
        for key in self._sorted:
            jobs = self._keys.get(key)
            if jobs and fits(jobs[0][1]):
                return self._take(key)
        return None

    def _take(self, key: JobKey) -> Job:
        jobs = self._keys[key]
        _, job = jobs.popleft()
        self._gone(key, job)
        if jobs:
            heapq.heappush(self._heap, (self._value[key], jobs[0][0], key))
        return job

    def _gone(self, key: JobKey, job: Job) -> None:
        self._fresh -= 1
        self._samples[key] -= len(job.samples)
        if self._samples[key] <= 0:
            del self._samples[key]

    def _explore(self) -> JobKey | None:
        """The key of the earliest job of a group nothing is known about yet (None: none)."""
        best: tuple[int, JobKey] | None = None
        for group in list(self._unknown):
            if self.lengths.measured(*group):
                del self._unknown[group]
                continue
            keys = self._unknown[group]
            for key in list(keys):
                jobs = self._keys.get(key)
                if not jobs:
                    keys.discard(key)
                elif best is None or jobs[0][0] < best[0]:
                    best = (jobs[0][0], key)
            if not keys:
                del self._unknown[group]
        return None if best is None else best[1]

    def _maybe_rekey(self) -> None:
        m = self.lengths
        if m.observed >= self._next_rekey or m.now - self._rekeyed >= _REKEY_S:
            self.rekey()

    def rekey(self) -> None:
        """Recompute every queued key's expected length with what the model knows now (keys
        with no job left are dropped)."""
        self._next_rekey = max(_FIRST_REKEY, int(self.lengths.observed * 1.25) + 1)
        self._rekeyed = self.lengths.now
        for key in [k for k, jobs in self._keys.items() if not jobs]:
            del self._keys[key]
            self._value.pop(key, None)
        expect = self.lengths.expect_key
        self._value = {key: -expect(key) for key in self._keys}
        self._heap = [(self._value[k], jobs[0][0], k) for k, jobs in self._keys.items()]
        heapq.heapify(self._heap)
        self._sorted = None

    # -- figures ------------------------------------------------------------------------------

    def longest(self) -> float:
        """The expected tokens of the longest fresh job (0: none, or unordered)."""
        if not self.ordered or not self._fresh:
            return 0.0
        return max(-self._value[k] for k, jobs in self._keys.items() if jobs)

    def work(self) -> float:
        """Expected output tokens of every queued job (ready and fresh), all samples."""
        expect = self.lengths.expect_job
        total = sum(expect(job) * len(job.samples) for job in self.ready)
        return total + sum(self.lengths.expect_key(k) * n for k, n in self._samples.items())

    def shortest(self) -> JobKey | None:
        """The key of the queued job expected to be the shortest (None: none queued)."""
        keys = [job_key(job) for job in self.ready] + list(self._samples)
        return min(keys, key=self.lengths.expect_key, default=None)
