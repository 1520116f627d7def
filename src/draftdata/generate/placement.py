"""Where a job goes when servers differ in speed: placement by expected finish time, hedging.

``TailPlan`` is made whenever a clearly slower server has a free slot: each job goes where it is
expected to finish first, a free slot now or a faster server's slot that frees soon.
``hedge_pays`` says whether a copy of a tail request on an idle server is expected to answer
before the original. Both judge a long draw of a job's length (``length.LengthModel``) over each
endpoint's per-sequence rate. ``job_cap`` is the most output tokens a job may take.

Pure arithmetic over what the dispatcher holds (``Fleet``, below): no I/O, no queue, nothing
sent; ``dispatch.py`` asks and acts.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from draftdata.generate.endpoint import Endpoint
from draftdata.generate.length import LengthModel, LookAhead, token_cap
from draftdata.generate.work import Copy, Job


class Fleet(Protocol):
    """What a ``TailPlan`` reads of the dispatcher."""

    endpoints: list[Endpoint]
    lengths: LengthModel
    fresh: LookAhead
    on_endpoint: dict[Endpoint, set[Copy]]

    @property
    def queued(self) -> int:
        """Jobs waiting for an endpoint."""
        ...

    def cap(self, job: Job) -> int:
        """The most output tokens one sample of ``job`` may take."""
        ...


def job_cap(job: Job, endpoints: list[Endpoint]) -> int:
    """The most output tokens one sample of ``job`` may take: its ``--max-tokens``, or with
    the context-filling default (``limits.py``) the largest context in the fleet."""
    cap = token_cap(job)
    if job.max_tokens is None:
        cap = max(cap, max((e.context_length or 0 for e in endpoints), default=0))
    return cap


_SPEED_GAP = 1.5  # per-sequence rates closer than this: greedy placement is as good
_BUSY_S = 1e-3  # the least time a busy slot is expected to stay busy
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
    spread above it, ``LengthModel.long_total``, at most the token cap), the draw the
    ``TailPlan`` places by too. A request past its cap by half again is stuck (a hung request,
    a server that slowed down): any copy beats it. The copy starts from nothing, so it pays
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
    """Placement by expected finish time, made whenever a slower server has a free slot: each
    job (longest expected first) goes where it is expected to finish first -- a free slot now,
    or a faster server's slot that frees soon. Long answers go to fast servers, the slow ones
    take the short answers, and no long answer starts on a slow server at the end of the job.

    Every endpoint's slots are a heap of the times (from now) they are expected to free: 0 for
    a free slot, for a busy one what its copy is expected to have left at the endpoint's
    per-sequence rate (``LengthModel.expected_total``, given what it has produced). A job takes
    the slot that minimises free time + its length / that endpoint's rate (a long draw: its
    estimate times the 90th percentile of the learnt spread, since a long answer on a slow
    server is what ends a job late); if that
    slot is free now the job goes there, else it is held for it (and the slot counts as taken
    by it, so the next job plans around it). With similar rates everywhere this is plain greedy
    placement, so the plan is only made when the per-sequence rates differ by ``_SPEED_GAP``.
    """

    def __init__(
        self, slots: dict[Endpoint, list[float]], rates: dict[Endpoint, float], high: float
    ) -> None:
        self.slots = slots
        self.rates = rates
        self.high = high

    @classmethod
    def make(cls, d: Fleet, now: float) -> TailPlan | None:
        """The plan for ``d``'s fleet now, or None where greedy placement is as good: when all
        rates are not known yet, or no endpoint slower than the fastest has a free slot (a
        free slot on a fast server is always the place to go)."""
        up = [e for e in d.endpoints if e.accepting]
        rates = {e: e.meter.seq_rate for e in up}
        if len(up) < 2 or any(r is None or r <= 0 for r in rates.values()):
            return None
        known: dict[Endpoint, float] = {e: r for e, r in rates.items() if r is not None}
        fastest, slowest = max(known.values()), min(known.values())
        if not any(e.free > 0 and _SPEED_GAP * r < fastest for e, r in known.items()):
            return None
        # far from the end of the job a long answer on a slow server is harmless (it ends
        # before the rest does): plan only once the queue drains sooner than the longest
        # queued answer would take on the slowest server
        high = d.lengths.high_ratio()
        drain = d.queued * d.lengths.mean / sum(r * e.concurrency.limit for e, r in known.items())
        longest = max(d.fresh.longest(), d.lengths.mean) * high
        if drain > longest / slowest:
            return None
        slots: dict[Endpoint, list[float]] = {}
        for e in up:
            heap = [0.0] * max(0, e.free)
            rate = known[e]
            for copy in d.on_endpoint[e]:
                job = copy.job
                produced = (now - copy.started) * rate
                total = d.lengths.expected_total(d.lengths.expect_job(job), produced, d.cap(job))
                # a busy slot is never free now, even for a copy past its expected length
                left = max(_BUSY_S, (total - produced) / rate)
                heap.extend([left] * copy.seqs)
            heapq.heapify(heap)
            slots[e] = heap
        return cls(slots, known, high)

    def place(self, job: Job, pick: Endpoint, expected: float) -> Endpoint | None:
        """Where ``job`` goes now: ``pick`` (greedy's choice) or another free endpoint, or None
        to hold it for a faster server's next free slot."""
        best: tuple[float, int, Endpoint] | None = None
        # plan for a long draw (the 90th percentile of the learnt spread): lengths are
        # long-tailed, and a long answer on a slow server is what ends a job late
        length = expected * self.high
        for e, heap in self.slots.items():
            if not heap or (e.url in job.avoid and e is not pick):
                continue
            finish = heap[0] + length / self.rates[e]
            if best is None or (finish, e is not pick) < best[:2]:
                best = (finish, int(e is not pick), e)
        if best is None:
            return pick
        finish, _, ep = best
        start = heapq.heapreplace(self.slots[ep], finish)
        if start > 0:
            return None
        return ep
