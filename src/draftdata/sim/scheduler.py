"""Continuous batching for one simulated server: one scheduler task advances every sequence.

At most ``max_running`` sequences decode together; the rest wait in FIFO order. A decode step
emits one token for every running sequence and lasts ``SimConfig.step_s(batch)``; admitting a
sequence stalls the batch for its prefill (``prefill_per_token_s`` per prompt token). The
scheduler is event driven rather than tick driven: it sleeps until the next sequence can finish
(or, with streaming sequences running, until the next ``stream_interval`` tokens are due), then
advances every running sequence by the number of whole steps that fit in the elapsed time. So
the cost is per event, not per token, and 8 servers x 64 sequences run on a loaded 2-core box.

The batcher knows token counts only; what the tokens say is the server's business.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from draftdata.sim.config import SimConfig

TICK_S = 0.2


class Seq:
    """One sequence (one choice of one request) inside the batcher."""

    __slots__ = ("done", "finished", "progress", "prompt_tokens", "total")

    def __init__(self, total: int, prompt_tokens: int, progress: asyncio.Event | None) -> None:
        self.total = total
        self.done = 0
        self.prompt_tokens = prompt_tokens
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # set after every advance; shared by the choices of one streaming request
        self.progress = progress


class Batcher:
    """The scheduler of one server; ``submit`` a Seq and await ``seq.finished``."""

    def __init__(self, config: SimConfig, slow: float = 1.0) -> None:
        self.config = config
        self.slow = slow
        self.running: list[Seq] = []
        self.waiting: collections.deque[Seq] = collections.deque()
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self._stall = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        # (monotonic time, tokens emitted then) over the last few seconds, for throughput
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def start(self) -> None:
        """Start the scheduler task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the scheduler and drop every sequence."""
        self.drop_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, seq: Seq) -> None:
        """Queue ``seq``; it starts decoding when a slot is free."""
        self.waiting.append(seq)
        self._wake()

    def cancel(self, seq: Seq) -> None:
        """Remove ``seq`` (the client went away): its slot is free at once."""
        if seq in self.running:
            self.running.remove(seq)
            self._wake()
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if not seq.finished.done():
            seq.finished.cancel()

    def drop_all(self) -> None:
        """Forget every sequence (a crash): their futures are cancelled."""
        for seq in [*self.running, *self.waiting]:
            if not seq.finished.done():
                seq.finished.cancel()
            if seq.progress is not None:
                seq.progress.set()
        self.running.clear()
        self.waiting.clear()
        self._stall = 0.0

    def throughput(self) -> float:
        """Output tokens per second over the last ~5 s of real time."""
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > 5.0:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0][0], 1e-3)
        return sum(n for _, n in self._recent) / span

    # -- internals -----------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _sleep(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        handle = None
        if timeout is not None:
            handle = loop.call_later(timeout, self._wake)
        try:
            await self._waiter
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running:
            seq = self.waiting.popleft()
            if seq.finished.done():
                continue
            self.running.append(seq)
            self._stall += (
                seq.prompt_tokens
                * self.config.prefill_per_token_s
                * (self.config.time_scale * self.slow)
            )
            self.prompt_tokens += seq.prompt_tokens

    def _advance(self, k: int) -> None:
        emitted = 0
        still: list[Seq] = []
        for seq in self.running:
            step = min(k, seq.total - seq.done)
            seq.done += step
            emitted += step
            if seq.progress is not None:
                seq.progress.set()
            if seq.done >= seq.total:
                if not seq.finished.done():
                    seq.finished.set_result(None)
            else:
                still.append(seq)
        self.running = still
        self.generated_tokens += emitted
        self._recent.append((time.monotonic(), emitted))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        budget = 0.0
        while True:
            self._admit()
            if not self.running:
                await self._sleep(None)
                last, budget = loop.time(), 0.0
                continue
            dt = self.config.step_s(len(self.running), self.slow)
            if dt <= 0:
                self._advance(max(s.total - s.done for s in self.running))
                self._stall = 0.0
                await asyncio.sleep(0)
                continue
            need = min(s.total - s.done for s in self.running)
            if any(s.progress is not None for s in self.running):
                need = min(need, self.config.stream_interval)
            # Wake at least every TICK_S so counters (/metrics, throughput) stay current.
            await self._sleep(min(TICK_S, max(0.0, self._stall + need * dt - budget)))
            now = loop.time()
            budget += now - last
            last = now
            used = min(budget, self._stall)
            self._stall -= used
            budget -= used
            while self.running and self._stall <= 0:
                dt = self.config.step_s(len(self.running), self.slow)
                k = min(min(s.total - s.done for s in self.running), int(budget / dt))
                if k <= 0:
                    break
                self._advance(k)
                budget -= k * dt
                self._admit()
            if not self.running:
                budget = 0.0
