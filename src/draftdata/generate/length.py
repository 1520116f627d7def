"""Expected output lengths, learned while a run goes, and the longest-first look-ahead queue.

``LengthModel`` estimates how many output tokens one sample of a prompt will take (all its
turns together), from what the run has seen so far: a mean per source and domain, refined by
the prompt's length (a power-of-two bucket of its estimated tokens), each level shrunk toward
the one above it (prompt-length bucket -> source/domain -> the whole run -> a prior of a third
of the job's own token cap) so that a key seen once does not swing the estimate. It learns from
every completion the dispatcher settles and is seeded, on resume, from the run's committed
completions (source/domain level only: their prompt lengths are not the same measure). The
number of keys is bounded, so memory does not grow with the job. It also learns how lengths
spread around their estimates (a histogram of actual / expected), so that ``expected_total``
answers how long a request is expected to be *given* that it has already produced some tokens:
with long-tailed lengths, a request past its estimate is expected to run on.

``LookAhead`` holds the jobs read ahead of dispatch (at most the look-ahead window) and hands
out the longest expected first (ties: file order), or plain file order with ``ordered=False``.
Long answers started early overlap with the rest of the job instead of running alone at its
end, which is what a file-order dispatcher loses on mixed-domain jobs. Keys are refreshed as
the model learns (at geometrically spaced observation counts, so the cost stays small).

Its one read is ``run_history``: the newest committed completions of a resumed run (source,
domain and output tokens only, at most ``HISTORY_ROWS``). It never decides where a job runs
(``dispatch.py`` does).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from draftdata.errors import StoreError
from draftdata.formats import COMPLETION_FORMAT
from draftdata.generate.work import Job
from draftdata.store.read import COMPLETIONS_PREFIX, output_tokens, read_shard, shard_keys

if TYPE_CHECKING:
    from draftdata.store.base import Store

_SHRINK = 4.0  # pseudo-observations of the level above that every level's mean starts from
_PRIOR_SHARE = 1 / 3  # the prior of a job nothing is known about: this share of its token cap
_MAX_KEYS = 4096
_FIRST_REKEY = 16
_REKEY_S = 1.0  # ... and at least this often (what running requests produced moves on)
# the spread of lengths around their estimate: ratio actual / expected in log2 bins of 1/4
# from 1/64 to 64 (long tails: a request past its estimate is expected to run on)
_BINS_PER_OCTAVE = 4
_LOW_OCTAVE = -6
_BINS = 12 * _BINS_PER_OCTAVE
_MIN_SPREAD = 20  # observations before the learnt spread is used
HISTORY_ROWS = 50_000  # a resumed run's newest completions that seed the model, at most

Key = tuple[str, str, int]  # (source, domain, prompt-length bucket; -1: the source/domain level)


def prompt_tokens(job: Job) -> int:
    """A cheap estimate of a job's prompt tokens: characters / 4, as ``work.plan`` counts them
    in the job's ``cost``. Counted once per job (asked for on every placement and answer)."""
    chars = job.prompt_chars
    if chars < 0:
        chars = job.prompt_chars = sum(len(m.content or "") for m in job.prompt.messages)
    return chars // 4


JobKey = tuple[str, str, int, int]  # (source, domain, prompt tokens rounded to its bucket, cap)


def job_key(job: Job) -> JobKey:
    """What a job's expected length depends on (jobs with the same key expect the same)."""
    p = job.prompt
    tokens = prompt_tokens(job)
    return (p.source, p.domain, 1 << (bucket(tokens) + 4), max(1, job.cost - tokens))


def token_cap(job: Job) -> int:
    """The most output tokens one sample of ``job`` can take: its ``cost`` (``work.plan``:
    estimated prompt tokens + max tokens x turns) less the prompt."""
    return max(1, job.cost - prompt_tokens(job))


def _bin(ratio: float) -> int:
    """The spread histogram's bin of ``ratio`` (actual / expected)."""
    if ratio <= 0:
        return 0
    return min(_BINS - 1, max(0, int((math.log2(ratio) - _LOW_OCTAVE) * _BINS_PER_OCTAVE)))


def bucket(tokens: int) -> int:
    """The prompt-length bucket: powers of two from 16 tokens (0: under 32)."""
    return max(0, tokens.bit_length() - 5)


class LengthModel:
    """Online mean output tokens per sample by source/domain and prompt length (bounded)."""

    def __init__(self, *, max_keys: int = _MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._stats: dict[Key, list[float]] = {}  # key -> [count, sum of output tokens]
        self._count = 0
        self._sum = 0.0
        self.observed = 0  # observations so far (the LookAhead refreshes on its growth)
        # ratio actual / expected: per log2 bin, [count, sum of ratios]
        self._spread = [[0, 0.0] for _ in range(_BINS)]
        self._spread_n = 0
        self._suffix: tuple[list[float], list[float]] | None = None  # (counts, sums) from bin i
        # expect() per (source, domain, bucket, cap), valid until the model or the clock moves
        self._memo: dict[tuple[str, str, int, int], float] = {}
        # requests running now per (source, domain): [count, sum of start times]; with the
        # fleet's per-sequence ``rate`` (tokens/s) at time ``now`` (set by the dispatcher)
        self._running: dict[tuple[str, str], list[float]] = {}
        self.rate = 0.0
        self.now = 0.0

    def observe(
        self, source: str, domain: str, prompt: int | None, output: int, cap: int | None = None
    ) -> None:
        """Learn one sample's output tokens (``prompt`` None: source/domain level only; with
        the job's token ``cap`` also how far it was from its estimate)."""
        if prompt is not None and cap is not None and self._count:
            expected = self.expect(source, domain, prompt, cap)
            if expected > 0:
                self._add_spread(output / expected)
        self.observed += 1
        self._memo.clear()
        self._count += 1
        self._sum += output
        keys: Iterable[Key] = (
            ((source, domain, -1),)
            if prompt is None
            else ((source, domain, -1), (source, domain, bucket(prompt)))
        )
        for key in keys:
            s = self._stats.get(key)
            if s is None:
                if len(self._stats) >= self.max_keys:
                    continue  # bounded: new keys fall back to the levels above
                s = self._stats[key] = [0.0, 0.0]
            s[0] += 1
            s[1] += output

    def expect(self, source: str, domain: str, prompt: int, cap: int) -> float:
        """Expected output tokens of one sample (at most ``cap``)."""
        prior = cap * _PRIOR_SHARE
        mean = (self._sum + _SHRINK * prior) / (self._count + _SHRINK)
        above = mean
        s = self._stats.get((source, domain, -1))
        if s is not None:
            mean = (s[1] + _SHRINK * above) / (s[0] + _SHRINK)
        r = self._running.get((source, domain))
        if r is not None and r[0] > 0 and self.rate > 0:
            # what the running requests of this key have produced so far is a lower bound on
            # their lengths: the short answers finish first, so completions alone would rank a
            # long domain low until its first answers arrive
            n = r[0] + (s[0] if s is not None else 0.0)
            total = self.rate * (r[0] * self.now - r[1]) + (s[1] if s is not None else 0.0)
            mean = max(mean, (total + _SHRINK * above) / (n + _SHRINK))
        s = self._stats.get((source, domain, bucket(prompt)))
        if s is not None:
            mean = (s[1] + _SHRINK * mean) / (s[0] + _SHRINK)
        return min(float(cap), mean)

    def started(self, source: str, domain: str, at: float) -> None:
        """A request of this source/domain started at ``at`` (see ``rate``, ``now``)."""
        self._memo.clear()
        r = self._running.get((source, domain))
        if r is None:
            if len(self._running) >= self.max_keys:
                return
            r = self._running[(source, domain)] = [0.0, 0.0]
        r[0] += 1
        r[1] += at

    def stopped(self, source: str, domain: str, started: float) -> None:
        """The request started at ``started`` ended (whatever the outcome)."""
        self._memo.clear()
        r = self._running.get((source, domain))
        if r is not None and r[0] > 0:
            r[0] -= 1
            r[1] = r[1] - started if r[0] else 0.0

    def _add_spread(self, ratio: float) -> None:
        self._suffix = None
        b = self._spread[_bin(ratio)]
        b[0] += 1
        b[1] += ratio
        self._spread_n += 1

    def expected_total(self, expected: float, produced: float, cap: int) -> float:
        """The expected length of a request expected at ``expected`` tokens that has produced
        ``produced`` so far: E[L | L > produced], at most ``cap``. From the learnt spread of
        lengths around their estimates; before enough is seen, the estimate or 1.5x what is
        produced, whichever is more."""
        if expected <= 0:
            return float(min(cap, max(produced, 1.0)))
        x = produced / expected
        if self._spread_n < _MIN_SPREAD:
            total = max(expected, 1.5 * produced)
        else:
            if self._suffix is None:
                self._suffix = self._suffix_sums()
            counts, sums = self._suffix
            i = _bin(x)
            c, sr = self._spread[i]
            # every ratio in the bins above x's is above x; in x's own bin at least x
            count = counts[i]
            weighted = max(sr, x * c) + sums[i + 1]
            total = expected * (weighted / count) if count else 1.5 * produced
        return float(min(cap, max(total, produced)))

    def long_total(self, expected: float, produced: float, cap: int, q: float = 0.9) -> float:
        """A long draw of the total length of a request expected at ``expected`` tokens that
        has produced ``produced``: the ``q`` quantile of L given L > produced (the mean ratio
        of the learnt spread's bin that holds it), at most ``cap``; before enough is seen,
        ``expected_total``."""
        if expected <= 0 or self._spread_n < _MIN_SPREAD:
            return self.expected_total(expected, produced, cap)
        x = produced / expected
        i = _bin(x)
        above = sum(c for c, _ in self._spread[i:])
        if not above:
            return self.expected_total(expected, produced, cap)
        need, seen = q * above, 0.0
        for c, sr in self._spread[i:]:
            seen += c
            if c and seen >= need:
                return float(min(cap, max(expected * sr / c, produced)))
        return self.expected_total(expected, produced, cap)  # not reached

    def _suffix_sums(self) -> tuple[list[float], list[float]]:
        counts = [0.0] * (_BINS + 1)
        sums = [0.0] * (_BINS + 1)
        for i in range(_BINS - 1, -1, -1):
            counts[i] = counts[i + 1] + self._spread[i][0]
            sums[i] = sums[i + 1] + self._spread[i][1]
        return counts, sums

    def high_ratio(self, q: float = 0.9) -> float:
        """The ``q`` quantile of actual / expected lengths (2.0 before enough is seen): how
        much longer than its estimate an answer can well be."""
        if self._spread_n < _MIN_SPREAD:
            return 2.0
        need = q * self._spread_n
        seen = 0.0
        for i, (c, _) in enumerate(self._spread):
            seen += c
            if seen >= need:
                return float(2.0 ** (_LOW_OCTAVE + (i + 1) / _BINS_PER_OCTAVE))
        return float(2.0 ** (_LOW_OCTAVE + _BINS / _BINS_PER_OCTAVE))

    def expect_job(self, job: Job) -> float:
        """Expected output tokens of one sample of ``job`` (memoised until the model, the
        running set or the clock changes: a rekey or a plan asks for many alike jobs)."""
        return self.expect_key(job_key(job))

    def expect_key(self, key: JobKey) -> float:
        """``expect`` for a ``job_key``."""
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self.expect(key[0], key[1], key[2], key[3])
        return got

    def at(self, now: float, rate: float) -> None:
        """The clock and the fleet's mean per-sequence rate (tokens/s), for running requests."""
        if now != self.now or rate != self.rate:
            self.now, self.rate = now, rate
            self._memo.clear()

    @property
    def mean(self) -> float:
        """The run's mean output tokens per sample so far (0 before the first)."""
        return self._sum / self._count if self._count else 0.0

    @property
    def keys(self) -> int:
        """Keys held (bounded by ``max_keys``)."""
        return len(self._stats)


class LookAhead:
    """Jobs not yet dispatched, longest expected first (``ordered``) or in file order."""

    def __init__(self, model: LengthModel, *, ordered: bool) -> None:
        self.model = model
        self.ordered = ordered
        # (-expected tokens, file position, what the estimate depends on, job)
        self._heap: list[tuple[float, int, JobKey, Job]] = []
        self._fifo: deque[Job] = deque()
        self._seq = itertools.count()
        self._next_rekey = _FIRST_REKEY
        self._rekeyed = 0.0

    def __len__(self) -> int:
        return len(self._heap) if self.ordered else len(self._fifo)

    def __bool__(self) -> bool:
        return bool(self._heap) if self.ordered else bool(self._fifo)

    def push(self, job: Job) -> None:
        """Add a job read from the prompts."""
        if self.ordered:
            key = job_key(job)
            heapq.heappush(self._heap, (-self.model.expect_key(key), next(self._seq), key, job))
        else:
            self._fifo.append(job)

    def longest(self) -> float:
        """The expected tokens of the job ``pop`` would hand out next (0: none, or unordered)."""
        return -self._heap[0][0] if self.ordered and self._heap else 0.0

    def pop(self) -> Job:
        """The next job to dispatch (IndexError when empty)."""
        if not self.ordered:
            return self._fifo.popleft()
        m = self.model
        if m.observed >= self._next_rekey or m.now - self._rekeyed >= _REKEY_S:
            self.rekey()
        return heapq.heappop(self._heap)[3]

    def rekey(self) -> None:
        """Recompute every held job's expected length with what the model knows now."""
        self._next_rekey = max(_FIRST_REKEY, int(self.model.observed * 1.25) + 1)
        self._rekeyed = self.model.now
        expect = self.model.expect_key
        # one estimate per distinct key (few), then a dict look-up per held job (many)
        value = {key: -expect(key) for key in {entry[2] for entry in self._heap}}
        self._heap = [(value[key], seq, key, job) for _, seq, key, job in self._heap]
        heapq.heapify(self._heap)


def run_history(store: Store, *, rows: int = HISTORY_ROWS) -> Iterator[tuple[str, str, int]]:
    """(source, domain, output tokens) of a run's newest committed completions, at most
    ``rows`` of them (newest shards first); a shard that cannot be read is skipped."""

    left = rows
    for key in reversed(shard_keys(store, COMPLETIONS_PREFIX)):
        if left <= 0:
            return
        try:
            table = read_shard(store, key, COMPLETION_FORMAT, ["source", "domain", "usage"])
            counted, _ = output_tokens(store, key, table)  # usage, else ids, else the text
        except StoreError:
            continue
        table = table.slice(0, left)
        tokens = counted[:left]
        left -= table.num_rows
        sources = table.column("source").to_pylist()
        domains = table.column("domain").to_pylist()
        for s, d, n in zip(sources, domains, tokens, strict=True):
            yield s or "", d or "", int(n or 0)
