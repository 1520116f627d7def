"""The dispatcher's placement: which endpoint a job goes to, and which tail requests to copy.

- ``Placement.pick``: the endpoint with the most free slots, then the fewest outstanding
  tokens; a job sharing a system prompt / tools with recent ones goes where its prefix is
  cached when that endpoint has room; a retry waits a moment for an endpoint other than the one
  it failed on.
- ``TailPlan``: near the end of the job, what a clearly slower endpoint may start. Fast
  endpoints take the queue's head (the longest expected job); a slower one takes the longest
  job whose long draw it can finish by the time the fleet is expected to finish anyway, so a
  half-speed server gets ever shorter answers as the end nears and no long answer starts on
  it late.
- ``hedge_pays`` / ``Placement.hedges``: when nothing is queued, a running request is copied
  onto an idle, faster endpoint when the copy is expected to answer first for a long draw of
  its length.
- ``job_cap``: the most output tokens a job may take.

All judge a long draw of a job's length (``length.LengthModel``) over each endpoint's measured
per-sequence rate. Arithmetic over what the dispatcher holds: no I/O, nothing sent;
``dispatch.py`` asks and acts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.length import LengthModel, job_key, token_cap
from draftdata.generate.engine.queue import JobQueue
from draftdata.generate.engine.work import Copy, Job

_AFFINITY_SIZE = 4096  # shared prefixes remembered (least recently used go first)
_RETRY_PATIENCE_S = 2.0  # how long a retry waits for an endpoint other than the one it failed on


def job_cap(job: Job, endpoints: list[Endpoint]) -> int:
    """The most output tokens one sample of ``job`` may take: its ``--max-tokens``, or with
    the context-filling default (``limits.py``) the largest context in the fleet."""
    cap = token_cap(job)
    if job.max_tokens is None:
        cap = max(cap, max((e.context_length or 0 for e in endpoints), default=0))
    return cap


_SPEED_GAP = 1.5  # per-sequence rates closer than this: greedy placement is as good
_TAIL_Q = 0.99  # a slower endpoint's start is judged on this quantile of the length
_ALIKE = 1.05  # long draws within this factor of the shortest queued one count as as short
_ENDS_S = 0.25  # how often the running requests' expected ends are reckoned again
_HEDGE_Q = 0.9  # hedges are judged on this quantile of the length (a long draw)
BLIND_HEDGE_S = 60.0  # with no endpoint measured yet, a tail request this old is copied


def hedge_pays(
    age: float, expected: float, cap: int, origin: Endpoint, target: Endpoint, lengths: LengthModel
) -> bool:
    """Whether a copy on ``target`` of a request running on ``origin`` for ``age`` s is
    expected to answer before the original, for a long draw of its length.

    The original has produced about ``age * rate`` tokens. Hedges are only sent when nothing
    is queued, so what ends the job is the requests that turn out long: the copy must win
    when the length is a long draw given what is produced (the 90th percentile of the learnt
    spread above it, ``LengthModel.long_total``, at most the token cap), the kind of draw
    the ``TailPlan`` judges by too. A request past its cap by half again is stuck (a hung
    request, a server that slowed down): any copy beats it. The copy starts from nothing, so it pays
    only on a server that decodes enough faster: the whole length at the target's rate
    against what is left at the origin's. On an origin that has never answered (no rate, no
    latency: a server that passes its health check but never answers, or trickles), the copy
    pays once the request has run twice what the target needs for a long draw (three times its
    latency; ``BLIND_HEDGE_S`` when no endpoint has answered yet).
    """
    r_o, r_t = origin.meter.seq_rate, target.meter.seq_rate
    if r_o is None or r_o <= 0:
        if origin.meter.latency is not None:
            return age > 3 * origin.meter.latency
        # never answered (a wedged server passes /health too): judged by the target, a copy
        # pays once the original has run twice what the target needs for a long draw
        if r_t is not None and r_t > 0:
            return age > 2 * max(1.0, lengths.long_total(expected, 0.0, cap, _HEDGE_Q)) / r_t
        if target.meter.latency is not None:
            return age > 3 * target.meter.latency
        return age > BLIND_HEDGE_S  # nothing measured anywhere: the copy takes an idle slot
    produced = age * r_o
    if produced > 1.5 * cap:
        return True
    if r_t is None or r_t <= r_o:
        return False
    total = max(
        lengths.expected_total(expected, produced, cap),
        lengths.long_total(expected, produced, cap, _HEDGE_Q),
    )
    left = total - produced
    if left <= 0:
        return False
    return total / r_t < left / r_o


class TailPlan:
    """Near the end of the job, how long a job each clearly slower endpoint may start now.

    Made when every endpoint's per-sequence rate is measured, one is slower than the fastest
    by ``_SPEED_GAP``, and every prompt has been read (before that the end is not in sight and
    every endpoint takes the queue's head). The fleet is expected to finish at about the
    horizon: the queue's expected work over the fleet's rate (each endpoint's per-sequence
    rate times its slots), plus a long draw of the shortest queued job on the fastest endpoint
    (the job's own last answers), or when the request running now that is expected to end
    last does (one past its estimate runs on), whichever is later. A slower endpoint may start
    a job whose long draw (the ``_TAIL_Q`` quantile of the learnt spread, widened while its
    mean is uncertain: ``LengthModel.long_draw``) it finishes by then; otherwise a faster
    endpoint will, sooner.
    So the slow server takes the longest jobs early on and ever shorter ones as the end nears;
    it idles rather than start what would end the job late. With hedging on it may also start
    a job as short as the shortest queued one (on a one-domain job: any): should that one run
    long, once the queue is dry a copy on an idle fast endpoint ends it no later than the fast
    endpoints' own last answers. Fast endpoints are not limited: a job has nowhere faster to
    go.
    """

    def __init__(
        self, budgets: dict[Endpoint, float], lengths: LengthModel, shortest: float = 0.0
    ) -> None:
        self.budgets = budgets  # endpoint -> tokens of a long draw it may start now
        self.lengths = lengths
        # with hedging: the long draw of the shortest queued job (one as short as any queued
        # may start anywhere: if it runs long, a copy on an idle fast server once the queue is
        # dry ends no later than the fast servers' own last answers)
        self.shortest = shortest

    @classmethod
    def make(
        cls,
        endpoints: Iterable[Endpoint],
        queue: JobQueue,
        lengths: LengthModel,
        running: Mapping[Endpoint, Iterable[Copy]] | Callable[[dict[Endpoint, float]], float],
        *,
        read_all: bool,
        now: float,
        hedge: bool = True,
    ) -> TailPlan | None:
        """The plan now, or None where every endpoint may take the queue's head (also when no
        slower endpoint has a free slot: the plan would limit nothing). ``running``: the
        copies running on each endpoint, or what ``running_end`` says of them (cached)."""
        if not read_all or not queue:
            return None
        up = [e for e in endpoints if e.accepting]
        rates: dict[Endpoint, float] = {}
        for e in up:
            r = e.meter.seq_rate
            if r is None or r <= 0:
                return None
            rates[e] = r
        if len(rates) < 2:
            return None
        fastest = max(rates.values())
        slow = {e: r for e, r in rates.items() if _SPEED_GAP * r < fastest}
        if not any(e.free > 0 for e in slow):
            return None
        fleet = sum(r * max(1, e.concurrency.limit) for e, r in rates.items())
        key = queue.shortest()
        shortest = lengths.long_draw(key, _TAIL_Q) if key is not None else 0.0
        ends = running(rates) if callable(running) else running_end(running, rates, lengths, now)
        horizon = max(queue.work() / fleet + shortest / fastest, ends)
        return cls({e: r * horizon for e, r in slow.items()}, lengths, shortest if hedge else 0.0)

    def budget(self, ep: Endpoint) -> float | None:
        """The longest draw (tokens) ``ep`` may start now; None: any job."""
        return self.budgets.get(ep)

    def fits(self, job: Job, ep: Endpoint) -> bool:
        """Whether ``ep`` may start ``job`` now: it finishes a long draw of it in time, or
        (with hedging) no queued job is expected shorter."""
        budget = self.budgets.get(ep)
        if budget is None:
            return True
        draw = self.lengths.long_draw(job_key(job), _TAIL_Q)
        return draw <= budget or draw <= self.shortest * _ALIKE


def running_end(
    running: Mapping[Endpoint, Iterable[Copy]],
    rates: dict[Endpoint, float],
    lengths: LengthModel,
    now: float,
) -> float:
    """Seconds until the request running now that is expected to end last does: what each
    has left of its expected length given what it has produced (``expected_total``: one past
    its estimate runs on), at its endpoint's rate."""
    end = 0.0
    for ep, copies in running.items():
        rate = rates.get(ep)
        if rate is None:
            continue
        for copy in copies:
            job = copy.job
            produced = (now - copy.started) * rate
            total = lengths.expected_total(lengths.expect_job(job), produced, token_cap(job))
            end = max(end, (total - produced) / rate)
    return end


class Placement:
    """Which endpoint a job goes to (``pick``) and which running requests to copy at the tail
    (``hedges``), over the dispatcher's endpoints (module docstring)."""

    def __init__(
        self, endpoints: list[Endpoint], lengths: LengthModel, *, hedge_min_age: float
    ) -> None:
        self.endpoints = endpoints
        self.lengths = lengths
        self.hedge_min_age = hedge_min_age
        self.affinity: OrderedDict[str, Endpoint] = OrderedDict()  # prefix -> endpoint
        self._ends: tuple[float, float] = (-1.0, 0.0)  # (when, running_end then)

    def tail_plan(
        self,
        queue: JobQueue,
        running: Mapping[Endpoint, Iterable[Copy]],
        *,
        read_all: bool,
        now: float,
        hedge: bool,
    ) -> TailPlan | None:
        """``TailPlan.make`` for this fleet now; what the running requests have left
        (``running_end``, a pass over every running copy) is reckoned at most every
        ``_ENDS_S`` seconds and counted down in between."""

        def ends(rates: dict[Endpoint, float]) -> float:
            at, end = self._ends
            if at < 0 or now - at >= _ENDS_S:
                at, end = now, running_end(running, rates, self.lengths, now)
                self._ends = (at, end)
            return max(0.0, end - (now - at))

        return TailPlan.make(
            self.endpoints, queue, self.lengths, ends, read_all=read_all, now=now, hedge=hedge
        )

    def cap(self, job: Job) -> int:
        """The most output tokens one sample of ``job`` may take (``job_cap``)."""
        return job_cap(job, self.endpoints)

    def pick(self, job: Job, free: list[Endpoint], now: float) -> Endpoint | None:
        """Where ``job`` goes among the endpoints with a free slot, or None to hold it (a
        retry waiting for an endpoint other than the one it failed on)."""
        cands = [e for e in free if e.url not in job.avoid]
        if not cands:
            others = any(e.accepting and e.url not in job.avoid for e in self.endpoints)
            if others and now - job.ready_since < _RETRY_PATIENCE_S:
                return None
            cands = free
        if job.prefix is not None:
            ep = self.affinity.get(job.prefix)
            if ep is not None and ep in cands:
                self.affinity.move_to_end(job.prefix)
                return ep
        best = max(cands, key=lambda e: (e.free, -e.slots.outstanding_tokens, -e.index))
        if job.prefix is not None:
            self.affinity[job.prefix] = best
            if len(self.affinity) > _AFFINITY_SIZE:
                self.affinity.popitem(last=False)
        return best

    def may_take(self, job: Job, ep: Endpoint, now: float) -> bool:
        """Whether ``job`` may go to ``ep`` although it failed there (its patience is over,
        or no other endpoint can take it)."""
        if ep.url not in job.avoid:
            return True
        others = any(e.accepting and e.url not in job.avoid for e in self.endpoints)
        return not others or now - job.ready_since >= _RETRY_PATIENCE_S

    def fit(
        self, tail: TailPlan, queue: JobQueue, free: list[Endpoint], now: float
    ) -> tuple[Job, Endpoint] | None:
        """The longest queued job one of the slower endpoints in ``free`` may start now
        (``TailPlan.fits``), taken out of ``queue``, with its endpoint; None when none may."""
        for ep in sorted(free, key=lambda e: -(e.meter.seq_rate or 0.0)):

            def fits(job: Job, ep: Endpoint = ep) -> bool:
                return tail.fits(job, ep) and self.may_take(job, ep, now)

            found = queue.pop_fitting(fits)
            if found is not None:
                return found, ep
        return None

    def hedges(
        self,
        running: Iterable[Job],
        now: float,
        usable: Callable[[Endpoint], bool] = lambda e: True,
    ) -> list[tuple[Job, Endpoint]]:
        """Copies worth sending now: for each job running as one copy for at least
        ``hedge_min_age``, the fastest idle endpoint where ``hedge_pays`` (each endpoint's
        free slots taken at most once), among those ``usable`` says may take new work (a
        server held out for its refusals may not)."""
        free = {e: e.free for e in self.endpoints if e.accepting and e.free > 0 and usable(e)}
        out: list[tuple[Job, Endpoint]] = []
        for job in running:
            if job.hedged or job.done or len(job.copies) != 1:
                continue
            first = job.copies[0]
            age = now - first.sent  # of the request running now, not of the conversation
            if age < self.hedge_min_age:
                continue
            targets = [e for e, n in free.items() if n > 0 and e is not first.endpoint]
            if not targets:
                break
            ep = max(targets, key=lambda e: (e.meter.seq_rate or 0.0, free[e], -e.index))
            expected = self.lengths.expect_job(job)
            if not hedge_pays(age, expected, self.cap(job), first.endpoint, ep, self.lengths):
                continue
            free[ep] -= len(job.samples)
            out.append((job, ep))
        return out
