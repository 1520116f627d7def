"""Expected output lengths: known before the run where there are figures, learnt as it goes.

``LengthModel`` estimates how many output tokens one sample of a prompt will take (all its
turns together). Its levels, each shrunk toward the one above it so that a key seen once does
not swing the estimate: a prior of a third of the job's own token cap (``max_tokens`` times its
turns: the limit is a feature too) -> the whole run's mean -> the domain's -> the source's within
its domain -> the prompt's length (a power-of-two bucket of its estimated tokens) within that,
as a factor (its bucket's answers against all the run's answers of the source/domain).
What is known before the first answer seeds it (``LengthPriors``, read by ``known_lengths``):

- this run's committed answers (a resumed run, or the rest after ``--pilot``, whose answers are
  in the run): the newest ``HISTORY_ROWS``, per source and domain, and how they spread;
- this run's newest ``forecast.json`` (a pilot's per-domain means), where the answers alone
  are fewer;
- prepare's expected tokens per domain (``prepare_report.json`` beside the prompts, when it
  planned in tokens), as a weak prior only (a few pseudo-answers: the run's own take over).

It learns from every answer the dispatcher settles, and from the requests running now. Short
answers finish first: the answers in so far of a domain whose requests are still running are
its short ones, so completions alone would rank a long domain low until its long answers are
in, and would judge a pilot's unbiased figure wrong as soon as the run's first, short answers
of the domain come back. So a source/domain's mean is that of every request started, the
running ones being censored observations: each counts for its expected length given what it
has produced so far (its age times its endpoint's per-sequence rate; ``expected_total`` under
the learnt spread's shape, centred on the mean being estimated: a few fixed-point steps). The
running part is reckoned afresh at most every ``_IMPUTE_S`` seconds (or 2% of a typical
request's time, where requests take minutes) and kept up to date as requests start and stop in
between. The number of keys is bounded, so memory does not grow with the job.

Its uncertainty is of two kinds. How lengths spread around their estimates (a histogram of
actual / expected, learnt) answers ``expected_total`` (how long a request is expected to be
*given* that it has produced some tokens: with long-tailed lengths one past its estimate is
expected to run on), ``long_total`` and ``long_draw`` (a high quantile: what placement and
hedging judge by). How well the mean itself is known (``stderr``: the spread over the square
root of the answers behind it) widens ``long_draw`` while few answers are in, and
``measured`` says whether a source/domain has any figure at all (an answer, a prior or a
running request): the queue (``queue.py``) sends one prompt of an unmeasured one at once, so a
new domain is measured early, never left for last.

It never decides where a job runs (``dispatch.py`` and ``placement.py`` do).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

from draftdata.errors import DraftdataError, StoreError
from draftdata.generate.engine.work import Job
from draftdata.shared.formats import COMPLETION_FORMAT, PREPARE_REPORT, PREPARE_SHARDS
from draftdata.store.forecast import Forecast, latest_forecast
from draftdata.store.opener import open_store
from draftdata.store.read import COMPLETIONS_PREFIX, output_tokens, read_shard, shard_keys

if TYPE_CHECKING:
    from draftdata.store.base import Store

_SHRINK = 4.0  # pseudo-observations of the level above that every level's mean starts from
_PRIOR_SHARE = 1 / 3  # the prior of a job nothing is known about: this share of its token cap
_MAX_KEYS = 4096
# the spread of lengths around their estimate: ratio actual / expected in log2 bins of 1/4
# from 1/64 to 64 (long tails: a request past its estimate is expected to run on)
_BINS_PER_OCTAVE = 4
_LOW_OCTAVE = -6
_BINS = 12 * _BINS_PER_OCTAVE
_MIN_SPREAD = 20  # observations before the learnt spread is used
_PREPARE_WEIGHT = 4.0  # pseudo-answers a prepare estimate counts for (the run's own take over)
_FORECAST_WEIGHT = 200.0  # at most this many for a pilot's per-domain mean
HISTORY_ROWS = 50_000  # a resumed run's newest completions that seed the model, at most
ANY_SOURCE = "\x00*"  # the source of the domain level's keys (no prompt has it)
_ONLINE = -3  # the bucket of a source/domain's key for the answers this run saw with a prompt
_IMPUTE_S = 0.05  # the running requests' part of a group's mean is reckoned afresh this often,
_IMPUTE_SHARE = 0.02  # or at this share of a typical request's time (mean length / rate)
_DISTINCT = 0.1  # means apart by more than this share tell their prompts apart (``ranks``)
_IMPUTE_STEPS = 3  # fixed-point steps of that reckoning (each running request's expected
# length depends on the mean it feeds)

# (source, domain, prompt-length bucket; -1: the source/domain level, _ONLINE: its answers seen
# with their prompt's length)
Key = tuple[str, str, int]


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


def lane_rate(lanes: Mapping[int, float], rate: float, lane: int) -> float:
    """The per-sequence rate of ``lane`` (an endpoint's index), else the fleet's ``rate``."""
    return lanes.get(lane, rate) if lane >= 0 else rate


def bucket(tokens: int) -> int:
    """The prompt-length bucket: powers of two from 16 tokens (0: under 32)."""
    return max(0, tokens.bit_length() - 5)


class _Running:
    """The requests of one source/domain running now: (start time, lane) -> their caps;
    their part of the group's mean (``total``: the sum of their expected lengths) as of the
    last reckoning at ``at`` (-1: never), with the rates, the group mean, the spread's centre
    and the cap it was reckoned with."""

    __slots__ = ("at", "cap", "centre", "lanes", "mean", "n", "rate", "starts", "total")

    def __init__(self) -> None:
        self.starts: dict[tuple[float, int], list[int]] = {}
        self.n = 0
        self.at = -1.0
        self.total = 0.0
        self.mean = 0.0
        self.rate = 0.0
        self.lanes: dict[int, float] = {}
        self.centre = 1.0
        self.cap = 0


@dataclass
class LengthPriors:
    """What is known of the answers' lengths before the run's first answer (``known_lengths``).

    ``answers``: (source, domain, output tokens) of answers already committed to the run;
    ``domains``: domain -> (mean output tokens, pseudo-answers it counts for) from a forecast
    or prepare's report; ``sources``: where each figure came from, for one log line.
    """

    answers: list[tuple[str, str, int]] = field(default_factory=list)
    domains: dict[str, tuple[float, float]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.answers or self.domains)


class LengthModel:
    """Mean output tokens per sample by domain, source and prompt length (module docstring)."""

    def __init__(self, *, max_keys: int = _MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._stats: dict[Key, list[float]] = {}  # key -> [count, sum of output tokens]
        self._count = 0.0
        self._sum = 0.0
        self.observed = 0  # observations so far (the queue refreshes on its growth)
        # ratio actual / expected of the answers: per log2 bin, [count, sum, sum of squares]
        self._spread = [[0.0, 0.0, 0.0] for _ in range(_BINS)]
        self._spread_n = 0
        # the spread with the running requests counted in (``_view``: Kaplan-Meier), as of
        # ``_view_at`` (None: to reckon); its (counts, sums) from bin i on (``_suffix``)
        self._viewed: list[list[float]] | None = None
        self._view_at = -1.0
        self._suffix: tuple[list[float], list[float]] | None = None
        # expect() per (source, domain, bucket, cap), valid until the model or the clock moves
        self._memo: dict[tuple[str, str, int, int], float] = {}
        # requests running now per (source, domain) (``_Running``); with the fleet's mean
        # per-sequence ``rate`` (tokens/s) and each lane's (endpoint's) at time ``now``, all set
        # by the dispatcher
        self._running: dict[tuple[str, str], _Running] = {}
        self._running_n = 0  # samples running now, all groups
        self.rate = 0.0
        self.lanes: Mapping[int, float] = {}
        self.now = 0.0

    # -- what is known before the run ------------------------------------------------------------

    def seed(self, priors: LengthPriors) -> None:
        """Take what was known before this command's first answer: the run's committed answers
        (per source and domain, and how they spread around their key's mean), then each
        domain's figure from a forecast or prepare, as pseudo-answers of the domain level."""
        for source, domain, tokens in priors.answers:
            self.observe(source, domain, None, tokens)
        if len(priors.answers) >= _MIN_SPREAD:
            for source, domain, tokens in priors.answers:
                s = self._stats.get((source, domain, -1))
                if s is not None and s[0] > 0 and s[1] > 0:
                    self._add_spread(tokens * s[0] / s[1])
        for domain, (mean, weight) in priors.domains.items():
            key = (ANY_SOURCE, domain, -1)
            s = self._stats.get(key)
            if s is None:
                if len(self._stats) >= self.max_keys:
                    continue
                s = self._stats[key] = [0.0, 0.0]
            # answers of the run already count for the domain: the figure fills up to ``weight``
            extra = max(0.0, weight - s[0])
            s[0] += extra
            s[1] += extra * mean
            self._count += extra
            self._sum += extra * mean
        self._memo.clear()

    # -- learning ----------------------------------------------------------------------------

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
            ((ANY_SOURCE, domain, -1), (source, domain, -1))
            if prompt is None
            else (
                (ANY_SOURCE, domain, -1),
                (source, domain, -1),
                (source, domain, _ONLINE),
                (source, domain, bucket(prompt)),
            )
        )
        for key in keys:
            s = self._stats.get(key)
            if s is None:
                if len(self._stats) >= self.max_keys:
                    continue  # bounded: new keys fall back to the levels above
                s = self._stats[key] = [0.0, 0.0]
            s[0] += 1
            s[1] += output

    def _add_spread(self, ratio: float) -> None:
        b = self._spread[_bin(ratio)]
        b[0] += 1
        b[1] += ratio
        b[2] += ratio * ratio
        self._spread_n += 1
        if not self._censored():
            self._viewed, self._suffix = None, None  # the view is the spread itself

    def _quantum(self) -> float:
        """How long a reckoning of the running requests holds: ``_IMPUTE_S``, or a small share
        of a typical request's time where requests take long (a request of minutes ages
        little in a second)."""
        if self.rate <= 0 or self._count <= 0:
            return _IMPUTE_S
        return max(_IMPUTE_S, _IMPUTE_SHARE * self._sum / self._count / self.rate)

    def _censored(self) -> bool:
        return self._running_n > 0

    def _view(self) -> list[list[float]]:
        """The spread of lengths around their estimates, the requests running now counted in.

        The answers in are biased short (a long one is still running), so the spread is the
        Kaplan-Meier estimate over the answers (events, at their ratio) and the running
        requests (censored: longer than what they produced over their source/domain's mean):
        per bin the answers in it over all still at risk there, their product the chance to
        get that far. Each answer in a bin is weighted by its bin's share; what survives past
        the last answer goes to the longest running request's bin (a lower bound). Reckoned
        afresh at most every ``_quantum`` (the running requests age); the plain spread while
        nothing runs."""
        if not self._censored():
            return self._spread
        if self._viewed is not None and 0 <= self.now - self._view_at < self._quantum():
            return self._viewed
        cens = [0.0] * _BINS
        for r in self._running.values():
            if not r.n or r.mean <= 0 or r.at < 0:
                continue
            for (start, lane), caps in r.starts.items():
                ratio = lane_rate(self.lanes, self.rate, lane) * (self.now - start) / r.mean
                cens[_bin(ratio)] += len(caps)
        events = [b[0] for b in self._spread]
        at_risk = 0.0
        risk = [0.0] * _BINS
        for i in range(_BINS - 1, -1, -1):
            at_risk += events[i] + cens[i]
            risk[i] = at_risk
        n = float(self._spread_n)
        out = [[0.0, 0.0, 0.0] for _ in range(_BINS)]
        alive = 1.0
        for i in range(_BINS):
            d = events[i]
            if d <= 0 or risk[i] <= 0:
                continue
            share = alive * d / risk[i]
            alive -= share
            w = share * n / d
            c, sr, sq = self._spread[i]
            out[i] = [c * w, sr * w, sq * w]
        last = max((i for i in range(_BINS) if cens[i] > 0), default=-1)
        if alive > 1e-9 and last >= 0:
            edge = 2.0 ** (_LOW_OCTAVE + (last + 1) / _BINS_PER_OCTAVE)
            k = alive * n
            b = out[last]
            b[0] += k
            b[1] += k * edge
            b[2] += k * edge * edge
        self._viewed, self._view_at, self._suffix = out, self.now, None
        return out

    def started(
        self, source: str, domain: str, at: float, lane: int = -1, cap: int = 0, seqs: int = 1
    ) -> None:
        """A request of this source/domain for ``seqs`` samples started at ``at`` on ``lane``
        (an endpoint's index: its per-sequence rate in ``lanes``; -1: the fleet's mean
        ``rate``), each sample's token cap ``cap`` (0: the cap of the job asked about)."""
        self._memo.clear()
        r = self._running.get((source, domain))
        if r is None:
            if len(self._running) >= self.max_keys:
                return
            r = self._running[(source, domain)] = _Running()
        r.starts.setdefault((at, lane), []).extend([cap] * seqs)
        r.n += seqs
        self._running_n += seqs
        if r.n == seqs:
            self._viewed, self._suffix = None, None
        if r.at >= 0:  # kept up to date until it is reckoned afresh
            r.total += seqs * self._share(r, at, lane, cap or r.cap)

    def stopped(
        self, source: str, domain: str, started: float, lane: int = -1, seqs: int = 1
    ) -> None:
        """The request reported started at ``started`` on ``lane`` for ``seqs`` samples ended
        (whatever the outcome)."""
        self._memo.clear()
        r = self._running.get((source, domain))
        caps = r.starts.get((started, lane)) if r is not None else None
        if r is None or not caps:
            return
        for _ in range(min(seqs, len(caps))):
            cap = caps.pop()
            r.n -= 1
            self._running_n -= 1
            if r.at >= 0 and r.n:
                r.total = max(0.0, r.total - self._share(r, started, lane, cap or r.cap))
        if not caps:
            del r.starts[(started, lane)]
        if not r.n:
            r.total, r.at, r.mean = 0.0, -1.0, 0.0
            self._viewed, self._suffix = None, None

    def at(self, now: float, rate: float, lanes: Mapping[int, float] | None = None) -> None:
        """The clock, the fleet's mean per-sequence rate (tokens/s) and each lane's (an
        endpoint's index -> its rate), for running requests."""
        if lanes is not None:
            self.lanes = lanes
        if now != self.now or rate != self.rate:
            self.now, self.rate = now, rate
            self._memo.clear()

    # -- running requests: censored observations --------------------------------------------

    def _share(self, r: _Running, start: float, lane: int, cap: int) -> float:
        """A running request's expected length given what it produced (its age times its
        lane's rate), as of ``r``'s last reckoning (with its mean ``r.mean``)."""
        produced = max(0.0, lane_rate(r.lanes, r.rate, lane) * (r.at - start))
        return self.expected_total(r.mean / r.centre, produced, cap)

    def _centre(self) -> float:
        """The learnt spread's mean ratio (actual / expected when sent; 1 before enough is
        seen): a running request's conditional length is taken from the spread's shape,
        centred on the mean being estimated."""
        if self._spread_n < _MIN_SPREAD:
            return 1.0
        view = self._view()
        n = sum(b[0] for b in view)
        mean = sum(b[1] for b in view) / n if n > 0 else 0.0
        return mean if mean > 0 else 1.0

    def _with_running(self, r: _Running, done: list[float] | None, above: float, cap: int) -> float:
        """The source/domain's mean over its answers (``done``: [count, sum]) and its running
        requests, each counted for its expected length given what it has produced; the
        running part reckoned afresh when ``_quantum`` old (module docstring)."""
        n0, s0 = (done[0], done[1]) if done is not None else (0.0, 0.0)
        if r.at < 0 or not 0 <= self.now - r.at < self._quantum():
            if r.mean <= 0:
                r.mean = (s0 + _SHRINK * above) / (n0 + _SHRINK)
            if r.at < 0:  # its requests were not in the spread's view yet
                self._viewed = None
            r.at, r.rate, r.lanes, r.cap = self.now, self.rate, dict(self.lanes), cap
            r.centre = self._centre()
            running = [
                (max(0.0, lane_rate(r.lanes, r.rate, lane) * (r.at - start)), c or cap)
                for (start, lane), caps in r.starts.items()
                for c in caps
            ]
            for _ in range(_IMPUTE_STEPS):
                r.total = self._expected_totals(r.mean / r.centre, running)
                r.mean = (s0 + r.total + _SHRINK * above) / (n0 + r.n + _SHRINK)
        return (s0 + r.total + _SHRINK * above) / (n0 + r.n + _SHRINK)

    # -- estimates ---------------------------------------------------------------------------

    def expect(self, source: str, domain: str, prompt: int, cap: int) -> float:
        """Expected output tokens of one sample (at most ``cap``)."""
        prior = cap * _PRIOR_SHARE
        mean = (self._sum + _SHRINK * prior) / (self._count + _SHRINK)
        s = self._stats.get((ANY_SOURCE, domain, -1))
        if s is not None:
            mean = (s[1] + _SHRINK * mean) / (s[0] + _SHRINK)
        above = mean
        s = self._stats.get((source, domain, -1))
        if s is not None:
            mean = (s[1] + _SHRINK * above) / (s[0] + _SHRINK)
        r = self._running.get((source, domain))
        if r is not None and r.n > 0 and self.rate > 0:
            # every request started counts, a running one for its expected length given what
            # it has produced (module docstring)
            mean = self._with_running(r, s, above, cap)
        # the prompt's length, as a factor: its bucket's answers against all of this run's
        # answers of the source/domain (both seen as this run goes, so both lean the same way
        # while the long answers are still running)
        s = self._stats.get((source, domain, bucket(prompt)))
        o = self._stats.get((source, domain, _ONLINE))
        if s is not None and o is not None and o[0] > 0 and o[1] > 0:
            seen = o[1] / o[0]
            mean *= (s[1] + _SHRINK * seen) / ((s[0] + _SHRINK) * seen)
        return min(float(cap), mean)

    def ranks(self) -> bool:
        """Whether what is known tells prompts apart: two sources or domains whose means
        differ by more than ``_DISTINCT`` (one domain's figure, or alike ones, order nothing:
        the first requests need not wait for the look-ahead)."""
        means = [s[1] / s[0] for k, s in self._stats.items() if k[2] == -1 and s[0] > 0]
        return bool(means) and max(means) > (1 + _DISTINCT) * min(means)

    def answers(self, source: str, domain: str) -> float:
        """The answers (and pseudo-answers) behind a source/domain's estimate: its own, else
        its domain's (0: only the run's mean and the prior)."""
        s = self._stats.get((source, domain, -1))
        if s is not None and s[0] > 0:
            return s[0]
        s = self._stats.get((ANY_SOURCE, domain, -1))
        return s[0] if s is not None else 0.0

    def measured(self, source: str, domain: str) -> bool:
        """Whether anything is known of this source/domain's lengths: an answer, a prior for
        it or its domain, or a request of it running now."""
        if self.answers(source, domain) > 0:
            return True
        r = self._running.get((source, domain))
        return r is not None and r.n > 0

    def stderr(self, source: str, domain: str) -> float:
        """The relative standard error of a source/domain's mean: the spread of lengths around
        their estimates (learnt; a lognormal's 0.8 before enough is seen) over the square root
        of the answers behind it (plus the shrinkage's pseudo-answers)."""
        view = self._view() if self._spread_n >= _MIN_SPREAD else None
        n = sum(b[0] for b in view) if view is not None else 0.0
        if view is not None and n > 0:
            mean = sum(b[1] for b in view) / n
            var = max(0.0, sum(b[2] for b in view) / n - mean * mean)
            cv = math.sqrt(var) / mean if mean > 0 else 1.0
        else:
            cv = 0.9  # a lognormal of sigma 0.8
        return cv / math.sqrt(self.answers(source, domain) + _SHRINK)

    def expected_total(self, expected: float, produced: float, cap: int) -> float:
        """The expected length of a request expected at ``expected`` tokens that has produced
        ``produced`` so far: E[L | L > produced], at most ``cap``. From the learnt spread of
        lengths around their estimates; before enough is seen, the estimate or 1.5x what is
        produced, whichever is more."""
        if expected <= 0:
            return float(min(cap, max(produced, 1.0)))
        if self._spread_n < _MIN_SPREAD:
            return float(min(cap, max(expected, 1.5 * produced)))
        return self._given(expected, produced, cap, *self._suffixes())

    def _suffixes(self) -> tuple[list[list[float]], list[float], list[float]]:
        """The spread's view and its (counts, sums) from each bin on."""
        view = self._view()
        if self._suffix is None:
            self._suffix = self._suffix_sums(view)
        return view, *self._suffix

    @staticmethod
    def _given(
        expected: float,
        produced: float,
        cap: int,
        view: list[list[float]],
        counts: list[float],
        sums: list[float],
    ) -> float:
        """E[L | L > produced] for an estimate ``expected`` under the spread ``view`` (with its
        suffix ``counts`` and ``sums``), at most ``cap``."""
        x = produced / expected
        i = _bin(x)
        c, sr = view[i][0], view[i][1]
        # every ratio in the bins above x's is above x; in x's own bin at least x
        count = counts[i]
        total = expected * (max(sr, x * c) + sums[i + 1]) / count if count else 1.5 * produced
        return float(min(cap, max(total, produced)))

    def _expected_totals(self, expected: float, running: list[tuple[float, int]]) -> float:
        """The sum of ``expected_total(expected, produced, cap)`` over ``running`` (produced,
        cap) pairs: one look at the spread for all of them."""
        if expected <= 0 or self._spread_n < _MIN_SPREAD:
            return sum(self.expected_total(expected, p, c) for p, c in running)
        view, counts, sums = self._suffixes()
        return sum(self._given(expected, p, c, view, counts, sums) for p, c in running)

    def long_total(self, expected: float, produced: float, cap: int, q: float = 0.9) -> float:
        """A long draw of the total length of a request expected at ``expected`` tokens that
        has produced ``produced``: the ``q`` quantile of L given L > produced (the mean ratio
        of the learnt spread's bin that holds it), at most ``cap``; before enough is seen,
        ``expected_total``."""
        if expected <= 0 or self._spread_n < _MIN_SPREAD:
            return self.expected_total(expected, produced, cap)
        x = produced / expected
        i = _bin(x)
        view = self._view()
        above = sum(b[0] for b in view[i:])
        if not above:
            return self.expected_total(expected, produced, cap)
        need, seen = q * above, 0.0
        for c, sr, _ in view[i:]:
            seen += c
            if c and seen >= need:
                return float(min(cap, max(expected * sr / c, produced)))
        return self.expected_total(expected, produced, cap)  # not reached

    def long_draw(self, key: JobKey, q: float = 0.95) -> float:
        """A long draw of the length of a job of ``key`` (``job_key``) before it starts: its
        estimate, widened by how well that is known (two standard errors), times the ``q``
        quantile of the learnt spread (``high_ratio``), at most its cap."""
        expected = self.expect_key(key) * (1 + 2 * self.stderr(key[0], key[1]))
        return min(float(key[3]), expected * self.high_ratio(q))

    @staticmethod
    def _suffix_sums(view: list[list[float]]) -> tuple[list[float], list[float]]:
        counts = [0.0] * (_BINS + 1)
        sums = [0.0] * (_BINS + 1)
        for i in range(_BINS - 1, -1, -1):
            counts[i] = counts[i + 1] + view[i][0]
            sums[i] = sums[i + 1] + view[i][1]
        return counts, sums

    def high_ratio(self, q: float = 0.9) -> float:
        """The ``q`` quantile of actual / expected lengths (2.0 before enough is seen): how
        much longer than its estimate an answer can well be."""
        if self._spread_n < _MIN_SPREAD:
            return 2.0
        view = self._view()
        need = q * sum(b[0] for b in view)
        seen = 0.0
        for i, (c, _, _) in enumerate(view):
            seen += c
            if seen >= need:
                return float(2.0 ** (_LOW_OCTAVE + (i + 1) / _BINS_PER_OCTAVE))
        return float(2.0 ** (_LOW_OCTAVE + _BINS / _BINS_PER_OCTAVE))

    def expect_job(self, job: Job) -> float:
        """Expected output tokens of one sample of ``job`` (memoised until the model, the
        running set or the clock changes: the queue or a plan asks for many alike jobs)."""
        return self.expect_key(job_key(job))

    def expect_key(self, key: JobKey) -> float:
        """``expect`` for a ``job_key``."""
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self.expect(key[0], key[1], key[2], key[3])
        return got

    @property
    def mean(self) -> float:
        """The run's mean output tokens per sample so far (0 before the first)."""
        return self._sum / self._count if self._count else 0.0

    @property
    def keys(self) -> int:
        """Keys held (bounded by ``max_keys``)."""
        return len(self._stats)


# -- what is known before the run ----------------------------------------------------------------


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


def forecast_lengths(data: Forecast) -> dict[str, tuple[float, float]]:
    """domain -> (mean output tokens, answers behind it) of a forecast's ``by_domain`` (the
    domains its pilot measured; ``(none)`` is the empty domain)."""
    out: dict[str, tuple[float, float]] = {}
    for name, row in data.by_domain.items():
        mean, n = row.mean_output_tokens, row.pilot_completions
        if mean is not None and mean > 0 and math.isfinite(mean):
            count = float(n) if n > 0 else _PREPARE_WEIGHT
            out["" if name == "(none)" else name] = (float(mean), min(count, _FORECAST_WEIGHT))
    return out


def prepare_lengths(data: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """domain -> (expected output tokens, weight) from prepare's report, where prepare planned
    with lengths (``lengths.tokens_per_row``): a weak prior."""
    lengths = data.get("lengths")
    per = lengths.get("tokens_per_row") if isinstance(lengths, dict) else None
    if not isinstance(per, dict):
        return {}
    return {
        str(d): (float(v), _PREPARE_WEIGHT)
        for d, v in per.items()
        if isinstance(v, int | float) and v > 0 and math.isfinite(v)
    }


def prompts_folder(prompts: str) -> str | None:
    """The folder ``--prompts`` names, or the folder of prepare's shard it names (where
    ``prepare_report.json`` would be); None for a lone file."""
    base = prompts.rstrip("/")
    parent, _, name = base.rpartition("/")
    if "://" in prompts:
        if not name.endswith(".jsonl"):
            return base
    elif os.path.isdir(base):
        return base
    return (parent or ".") if fnmatch(name, PREPARE_SHARDS) else None


def known_lengths(
    store: Store | None, prompts: str | None, *, history: bool, rows: int = HISTORY_ROWS
) -> LengthPriors:
    """What is known of the answers' lengths before this command's first answer (module
    docstring): ``store`` is the run (its answers when ``history``, its newest forecast),
    ``prompts`` the ``--prompts`` location (prepare's report beside them). Each read is
    best-effort: a figure that cannot be read is left out (the model learns online), never an
    error of the run."""
    priors = LengthPriors()
    folder = prompts_folder(prompts) if prompts else None
    try:
        prompts_dir = open_store(folder) if folder is not None else None
    except (DraftdataError, OSError):
        prompts_dir = None
    if store is not None and history:
        try:
            priors.answers = list(run_history(store, rows=rows))
        except (DraftdataError, OSError):
            priors.answers = []
        if priors.answers:
            priors.sources.append(f"{len(priors.answers):,} committed answers of the run")
    domains: dict[str, tuple[float, float]] = {}
    if prompts_dir is not None:
        try:
            if prompts_dir.exists(PREPARE_REPORT.name):
                raw = prompts_dir.read(PREPARE_REPORT.name)
                domains.update(prepare_lengths(PREPARE_REPORT.load(raw, PREPARE_REPORT.name)))
                if domains:
                    priors.sources.append("prepare's expected tokens per domain")
        except (DraftdataError, OSError):
            pass
    if store is not None:
        try:
            found = latest_forecast(store)
        except (DraftdataError, OSError):
            found = None
        if found is not None and (pilot := forecast_lengths(found[1])):
            domains.update(pilot)  # a pilot's measurement over prepare's estimate
            priors.sources.append("the pilot's forecast")
    priors.domains = domains
    return priors
