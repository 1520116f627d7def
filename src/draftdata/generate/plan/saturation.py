"""The fleet's saturated output rate, measured while a pilot runs (``generate --pilot``).

A pilot is small, so its wall clock is mostly ramp and tail; what the whole run sees for most of
its length is the fleet full: every endpoint at its concurrency, each sequence decoding at the
rate batching allows. ``Saturation`` measures that. It hears every answered request of each
endpoint (``Endpoint.on_answer``: start, end, output tokens) and samples every 0.1 s whether the
endpoint is full: up, with work still queued, and its slots taken. An endpoint's saturated rate
is the output tokens it produced while full (each request's tokens spread evenly over its life,
so the requests that straddle the edges count for their share) over the time it was full; the
fleet's is the sum. The measurement starts once the sample is read (a pilot reads the whole
prompt file to find its prompts, a cost the whole run does not pay per prompt it sends). An
endpoint full for less than one mean request life is measured but said to be rough; one never
full is counted at the measured ones' mean rate, and said.

The pilot runs without hedging and without the expected-finish placement (``run_pilot``): every
server, the slow ones too, runs full while work is queued, and every request it starts is
answered by it (a hedged original cancelled by its copy would take the tokens it produced with
it), so the rate is measured from whole requests.

Two more figures for the whole run's clock. The drain: when nothing is left to send, the run's
last requests finish at a falling batch; with the length ordering, the placement by expected
finish and hedging, the whole run's end takes about one request life beyond what its tokens
take at the full rate, so the drain is the measured endpoints' mean request life (weighted by
their rates). (The pilot's own tail, without placement and hedging, is longer and is only
recorded, as ``pilot_tail_s``.) And the command's fixed overhead: probes, the prompt scan and
opening the run before the engine starts, the commit and the figures after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from draftdata.generate.engine.loop import Engine

SAMPLE_INTERVAL_S = 0.1


@dataclass
class EndpointWatch:
    """What one endpoint did during the pilot (monotonic clock times)."""

    url: str
    gpus: int = 1
    answers: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, tokens)
    full: list[tuple[float, float]] = field(default_factory=list)  # its saturated stretches
    concurrency: list[int] = field(default_factory=list)  # in-flight sequences while full


@dataclass
class Throughput:
    """The fleet's measured saturated rate, the drain at the end and the command's overhead."""

    output_tokens_per_s: float | None
    endpoints: list[dict[str, Any]]
    drain_s: float
    overhead_s: float
    engine_s: float
    problems: list[str]
    pilot_tail_s: float = 0.0  # the pilot's own: from nothing queued to its last answer
    source: str = "measured"  # or where an earlier measurement was taken from

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        rate = self.output_tokens_per_s
        return {
            "output_tokens_per_s": None if rate is None else round(rate, 2),
            "source": self.source if rate is not None else None,
            "drain_s": round(self.drain_s, 3),
            "overhead_s": round(self.overhead_s, 3),
            "pilot_engine_s": round(self.engine_s, 3),
            "pilot_tail_s": round(self.pilot_tail_s, 3),
            "endpoints": self.endpoints,
        }


def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def spread_tokens(answers: list[tuple[float, float, int]], a: float, b: float) -> float:
    """The output tokens of ``answers`` produced within [a, b], each request's tokens spread
    evenly over its life (start, end)."""
    got = 0.0
    for s, e, tokens in answers:
        if e <= a or s >= b:
            continue
        life = e - s
        got += tokens if life <= 0 else tokens * (min(b, e) - max(a, s)) / life
    return got


class Saturation:
    """Watches an engine's endpoints while the pilot runs (module docstring)."""

    MIN_LIFETIMES = 1.0  # full for at least this many mean request lifetimes to be measured

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.clock = clock
        self.sleep = sleep  # the sampling pause (a test drives the clock with it)
        self.watches: dict[str, EndpointWatch] = {}
        self.started = clock()  # the command's start (before probing and the scan)
        self.engine_start: float | None = None
        self.engine_end: float | None = None
        self.queue_empty: float | None = None  # when nothing was left to dispatch
        self.task: asyncio.Task[None] | None = None

    def attach(self, engine: Engine, gpus: dict[str, int] | None = None) -> None:
        """Start watching ``engine`` (call on its event loop
        before it runs: ``generate(..., on_engine=saturation.attach)``)."""
        self.engine_start = self.clock()
        for ep in engine.endpoints:
            w = self.watches.setdefault(ep.url, EndpointWatch(ep.url, (gpus or {}).get(ep.url, 1)))

            def answered(end: float, latency: float, tokens: int, w: EndpointWatch = w) -> None:
                w.answers.append((end - latency, end, tokens))

            ep.on_answer = answered
        self.task = asyncio.get_running_loop().create_task(self._sample(engine))

    async def _sample(self, engine: Engine) -> None:
        d = engine.dispatcher
        open_at: dict[str, float] = {}  # url -> when its current full stretch began
        try:
            while True:
                now = self.clock()
                # measured once the sample is read: a pilot reads the whole prompt file to find
                # its prompts, a cost the whole run does not pay per prompt it sends
                queued = d.fed_all and d.queued > 0
                if self.queue_empty is None and d.fed_all and not d.queued and not d.waiting:
                    self.queue_empty = now
                for ep in engine.endpoints:
                    w = self.watches[ep.url]
                    cap = ep.capacity.max_running if ep.capacity is not None else None
                    slots = min(ep.concurrency.limit, cap) if cap else ep.concurrency.limit
                    if (
                        ep.breaker.state == "up"
                        and queued
                        and ep.slots.inflight >= max(1, slots - 1)
                    ):
                        w.concurrency.append(ep.slots.inflight)
                        open_at.setdefault(ep.url, now)
                    elif ep.url in open_at:
                        w.full.append((open_at.pop(ep.url), now))
                if d.stopping or (d.fed_all and not d.pending):
                    return
                await self.sleep(SAMPLE_INTERVAL_S)
        finally:
            now = self.clock()
            for url, since in open_at.items():
                self.watches[url].full.append((since, now))
            self.engine_end = now
            if self.queue_empty is None:
                self.queue_empty = now

    def result(self, finished: float | None = None) -> Throughput:
        """The measurement; ``finished``: when the command returned (default: now)."""
        end = finished if finished is not None else self.clock()
        engine_start = self.engine_start if self.engine_start is not None else self.started
        engine_end = self.engine_end if self.engine_end is not None else end
        problems: list[str] = []
        rows: list[dict[str, Any]] = []
        rates: list[float] = []  # of the endpoints measured: full at some point
        unmeasured = 0  # answered, but never full
        for w in self.watches.values():
            full_s = sum(b - a for a, b in w.full)
            lives = [e - s for s, e, _ in w.answers if e > s]
            mean_life = sum(lives) / len(lives) if lives else 0.0
            rate = (
                sum(spread_tokens(w.answers, a, b) for a, b in w.full) / full_s if full_s else None
            )
            lifetimes = full_s / mean_life if mean_life > 0 else 0.0
            conc = sum(w.concurrency) / len(w.concurrency) if w.concurrency else None
            ok = rate is not None and bool(w.answers)
            rows.append(
                {
                    "url": w.url,
                    "gpus": w.gpus,
                    "output_tokens_per_s": _r(rate),
                    "saturated_s": round(full_s, 3),
                    "request_lifetimes": round(lifetimes, 2),
                    "mean_life_s": round(mean_life, 3),
                    "mean_concurrency": _r(conc, 1),
                    "per_sequence_tokens_per_s": _r(rate / conc if rate and conc else None),
                    "answers": len(w.answers),
                    "measured": ok,
                }
            )
            if not w.answers:
                problems.append(
                    f"endpoint {w.url} answered no pilot request: counted as out of the fleet "
                    "(if it serves the run, the run goes faster)"
                )
            elif ok and rate is not None:
                rates.append(rate)
                if lifetimes < self.MIN_LIFETIMES:
                    problems.append(
                        f"endpoint {w.url} was full for only {full_s:.1f} s ({lifetimes:.1f} "
                        f"request lives, < {self.MIN_LIFETIMES:g}): its rate is rough"
                    )
            else:
                unmeasured += 1
                problems.append(
                    f"endpoint {w.url} was never full while work was queued: its saturated rate "
                    "is not measured; counted at the measured endpoints' mean"
                )
        fleet = sum(rates) / len(rates) * (len(rates) + unmeasured) if rates else None
        short = any(r["measured"] and r["request_lifetimes"] < self.MIN_LIFETIMES for r in rows)
        if short or unmeasured or not rates:
            slots = sum(max(w.concurrency, default=0) for w in self.watches.values())
            if slots:
                problems.append(
                    f"a pilot keeps the fleet full long enough with a few prompts per slot: "
                    f"--pilot {3 * slots} or more for these {slots} slots"
                )
        # the drain: the measured endpoints' mean request life, weighted by their rates
        weighted = [
            (float(r["output_tokens_per_s"]), float(r["mean_life_s"]))
            for r in rows
            if r["measured"]
        ]
        weight = sum(rate for rate, _ in weighted)
        drain = sum(rate * life for rate, life in weighted) / weight if weight else 0.0
        tail = engine_end - self.queue_empty if self.queue_empty is not None else 0.0
        return Throughput(
            output_tokens_per_s=fleet,
            endpoints=rows,
            drain_s=drain,
            pilot_tail_s=max(0.0, tail),
            overhead_s=max(0.0, (engine_start - self.started) + (end - engine_end)),
            engine_s=max(0.0, engine_end - engine_start),
            problems=problems,
        )
