"""Progress of a generate run: rates over a sliding window, the live display, the log line,
and the metrics snapshots written into the run.

``Progress.tick`` samples cumulative counters (records done, requests answered, output tokens,
per endpoint) on the event loop; rates are differences over ``window`` seconds (and since the
start); the clock is injectable. ``render`` builds the rich live view (totals, ETA and one row
per endpoint), ``line`` the plain log line used when stdout is not a terminal; both write numbers
with thousands separators, the look of every stage's progress (``draftdata/support/progress.py``:
the bold stage name first, ``fmt_duration`` times, a plain ``generate: ...`` line off a terminal).
When nothing can move (a Ctrl-C drain, no endpoint serving, dispatch paused for the store,
only the refusal check's canaries out) ``state()`` says which, and the views show that instead
of an ETA: a pace measured before it would count down to a time that is not coming.

Metrics snapshots (``snapshot``), written by the engine every ``metrics_interval`` seconds as
``metrics/<writer>-<seq>.json`` (``Run.write_metrics`` adds ``writer`` and ``run_id``)::

    {"kind": "progress",                 # the last one of a command is "summary" (see below)
     "time": 1764770000.0,               # unix seconds of the snapshot
     "elapsed_s": 60.0,                  # since this command started
     "done": 812, "total": 193010,       # settled (prompt, sample) pairs; total may be null
     "completed": 800, "failed": 12, "already_done": 0,
     "requests_per_s": {"window": 13.1, "lifetime": 13.5},
     "output_tokens_per_s": {"window": 35100.0, "lifetime": 36000.0},
     "eta_s": 14000.0,                   # null when unknown
     "endpoints": {URL: {"state": "up", "inflight": 66, "limit": 67, "capacity": 64,
                         "engine": "sglang", "requests": 120, "completed": 118,
                         "output_tokens": 300000, "tokens_per_s": 4500.0,
                         "errors": {"timeout": 1}, "waiting": 2}},
     "series": [[t, done, output_tokens, {URL: output_tokens}], ...]}
                                         # samples since the previous snapshot (t = elapsed_s),
                                         # cumulative: the report plots their differences

The final snapshot has ``"kind": "summary"`` and the GenerateSummary fields instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from draftdata.generate.engine.endpoint import Endpoint
from draftdata.support.progress import fmt_duration


class Progress:
    """Sliding-window rates over counters that ``counters()`` returns."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        counters: Callable[[], tuple[int, int, int, int]],
        *,
        total: int | None,
        window: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        state: Callable[[], str | None] | None = None,
        held: Callable[[Endpoint], bool] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.state = state or (lambda: None)  # why nothing moves now (None: it does)
        # whether an endpoint that is up gets no new work now (it refuses what the others
        # answer: ``opening.EndpointRefusals``): shown as "held"
        self.held = held or (lambda e: False)
        self.counters = counters  # -> (settled, requests answered, output tokens, failed)
        self.total = total
        self.window = window
        self.clock = clock
        self.started = clock()
        self.samples: deque[tuple[float, int, int, int]] = deque()
        self.series: list[list[Any]] = []
        self.already_done = 0
        self.failed = 0
        self.tick()

    def tick(self) -> None:
        """Sample the counters now (call about once a second)."""
        now = self.clock()
        done, reqs, toks, self.failed = self.counters()
        self.samples.append((now, done, reqs, toks))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()
        self.series.append(
            [
                round(now - self.started, 2),
                done,
                toks,
                {e.url: e.meter.output_tokens for e in self.endpoints},
            ]
        )

    def rates(self) -> tuple[float, float, float, float]:
        """(requests/s window, lifetime, output tokens/s window, lifetime)."""
        now, _, reqs, toks = self.samples[-1]
        t0, _, r0, k0 = self.samples[0]
        span = now - t0
        life = now - self.started
        rw = (reqs - r0) / span if span > 0 else 0.0
        tw = (toks - k0) / span if span > 0 else 0.0
        return rw, reqs / life if life > 0 else 0.0, tw, toks / life if life > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left at the window's pace of records (None when unknown)."""
        if self.total is None:
            return None
        now, done, _, _ = self.samples[-1]
        t0, d0, _, _ = self.samples[0]
        remaining = self.total - self.already_done - done
        if remaining <= 0:
            return 0.0
        pace = (done - d0) / (now - t0) if now > t0 else 0.0
        if pace <= 0:
            life = now - self.started
            pace = done / life if life > 0 else 0.0
        return remaining / pace if pace > 0 else None

    def _done_text(self) -> str:
        done = self.already_done + self.samples[-1][1]
        if self.total:
            return f"{done:,}/{self.total:,} ({done / self.total:.1%})"
        return f"{done:,}"

    def _eta_text(self) -> str:
        """``ETA 1h02m``, or the state when nothing can move."""
        state = self.state()
        return state if state is not None else f"ETA {fmt_duration(self.eta())}"

    def endpoint_state(self, e: Endpoint) -> str:
        """An endpoint's state for the views: its breaker's (up, down, half-open), or "held"
        while it is up but gets no new work (it refuses what the other servers answer)."""
        state = e.breaker.state
        return "held" if state == "up" and self.held(e) else state

    def line(self) -> str:
        """One plain log line: totals, rates, ETA, then each endpoint in short."""
        rw, rl, tw, tl = self.rates()
        eps = " ".join(
            f"[{e.name} {self.endpoint_state(e)} {e.slots.inflight}/{e.concurrency.limit} "
            f"{e.meter.tokens_per_s(self.window):,.0f}t/s"
            + (f" err {sum(e.meter.errors.values()):,}" if e.meter.errors else "")
            + "]"
            for e in self.endpoints
        )
        return (
            f"generate: {self._done_text()} done, failed {self.failed:,}, {rw:,.1f} req/s "
            f"({rl:,.1f} avg), {tw:,.0f} tok/s ({tl:,.0f} avg), {self._eta_text()} {eps}"
        )

    def render(self) -> Group:
        """The rich live view."""
        rw, rl, tw, tl = self.rates()
        head = Text.assemble(
            ("generate ", "bold"),
            f"{self._done_text()} done, {self.failed:,} failed   ",
            f"{rw:,.1f} req/s ({rl:,.1f} avg)   ",
            f"{tw:,.0f} output tok/s ({tl:,.0f} avg)   ",
            f"elapsed {fmt_duration(self.clock() - self.started)}   {self._eta_text()}",
        )
        table = Table(box=None, pad_edge=False, header_style="bold")
        cols = ("endpoint", "state", "in-flight/limit", "capacity", "waiting", "tok/s", "done")
        for col in (*cols, "errors"):
            table.add_column(col, justify="left" if col in ("endpoint", "state") else "right")
        for e in self.endpoints:
            errs = ", ".join(f"{k} {v}" for k, v in sorted(e.meter.errors.items())) or "-"
            waiting = str(e.concurrency.last_load.waiting) if e.concurrency.last_load else "-"
            state = self.endpoint_state(e)
            style = {"up": "green", "down": "red"}.get(state, "yellow")
            table.add_row(
                e.name,
                Text(state, style=style),
                f"{e.slots.inflight}/{e.concurrency.limit}",
                str(e.concurrency.fitted() or "?"),
                waiting,
                f"{e.meter.tokens_per_s(self.window):,.0f}",
                f"{e.meter.completed:,}",
                errs,
            )
        return Group(head, table)

    def snapshot(self) -> dict[str, Any]:
        """A metrics snapshot (module docstring); the series restarts after each one."""
        rw, rl, tw, tl = self.rates()
        _, done, _, _ = self.samples[-1]
        snap = {
            "kind": "progress",
            "time": time.time(),
            "elapsed_s": round(self.clock() - self.started, 3),
            "done": done + self.already_done,
            "total": self.total,
            "completed": done - self.failed,
            "failed": self.failed,
            "already_done": self.already_done,
            "requests_per_s": {"window": round(rw, 3), "lifetime": round(rl, 3)},
            "output_tokens_per_s": {"window": round(tw, 1), "lifetime": round(tl, 1)},
            "eta_s": self.eta() if self.state() is None else None,
            "endpoints": {
                e.url: {
                    k: (self.endpoint_state(e) if k == "state" else v)
                    for k, v in e.row(self.window).items()
                    if k != "url"
                }
                for e in self.endpoints
            },
            "series": self.series,
        }
        self.series = []
        return snap
