"""Keeping a fleet's endpoints in service: the health check and the reviver the dispatcher calls.

The dispatcher decides when an endpoint goes out (``dispatch.py``); this module is the I/O it
asks for around that, shared by every engine that runs a ``Dispatcher`` (generate's ``Engine``;
``hidden-states --engine vllm``):

- ``check_alive(ep)``: after a connection error or an opened breaker, whether the server still
  answers (``/health``), and still serves the model it served (a server restarted with another
  model on the same URL is taken out here, naming both; ``allow_mixed_models`` lets it serve);
- ``revive(ep)``: an endpoint out of service is probed every 0.2 s for its first 30 s out (most
  outages are restarts of seconds), then every ``probe_interval`` s, and re-admitted with its
  probed capacity (half-open after an earlier fall: one more failure takes it out again); a
  refusing one waits for its trial;
- the default thinking mode of each endpoint where answers need it (``thinking.py``): asked
  before an endpoint's first request that may come back without token ids
  (``ThinkingMode.first`` calls ``ask_thinking``), put in doubt by a health check or a fall (a
  restart may bring other kwargs: ``ThinkingMode.suspect``) and asked again when it answers or
  comes back (``learn_thinking``), and again, a few times, while a probe got no answer
  (``untold``).

It holds no policy of its own beyond those probe intervals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

import aiohttp

from draftdata.generate.answers.thinking import RETRIES, needs_probe, probe_thinking
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.endpoint import Endpoint, check_alive
from draftdata.shared.endpoints import Capacity, probe_capacity


class Dispatcher(Protocol):
    """What the keeper needs of the dispatcher (``dispatch.Dispatcher``)."""

    stopping: bool
    wake: asyncio.Event

    def take_out_dead(self, ep: Endpoint, why: str) -> None:
        """Take ``ep`` out now, its in-flight work requeued."""
        ...


_FAST_PROBE_S = 30.0  # a taken-out endpoint is probed every _FAST_PROBE_INTERVAL s this long
_FAST_PROBE_INTERVAL = 0.2


def probe_pause(out_for: float, probe_interval: float) -> float:
    """Seconds before the next probe of a server out of service for ``out_for`` seconds:
    ``_FAST_PROBE_INTERVAL`` for its first ``_FAST_PROBE_S`` (most outages are restarts of
    seconds: every second late is a server's share lost), then ``probe_interval``. Generate's
    reviver and acceptance's probe the same."""
    fast = out_for < _FAST_PROBE_S
    return min(probe_interval, _FAST_PROBE_INTERVAL if fast else 1e9)


class EndpointKeeper:
    """Health checks and revival of ``endpoints`` for one dispatcher (``attach`` it first)."""

    def __init__(
        self,
        config: GenerateConfig,
        endpoints: list[Endpoint],
        session: aiohttp.ClientSession,
        *,
        log: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        model: str = "default",
    ) -> None:
        self.cfg = config
        self.model = model  # the run's model, for an endpoint that reports none
        self.endpoints = endpoints
        self.session = session
        self.log = log
        self.clock = clock
        self.probe_timeout = min(5.0, config.connect_timeout)
        self._dispatcher: Dispatcher | None = None
        # whether answers need their server's default thinking mode (thinking.py)
        overrides = [o.reasoning for o in config.overrides]
        self.thinking = needs_probe(config.reasoning, overrides, config.token_ids)
        self._thinking_probes: set[Endpoint] = set()  # endpoints being asked now
        if self.thinking:
            for e in endpoints:
                e.thinking.probe = partial(self.ask_thinking, e)

    def attach(self, dispatcher: Dispatcher) -> None:
        """The dispatcher whose endpoints this keeper takes out and brings back."""
        self._dispatcher = dispatcher

    @property
    def dispatcher(self) -> Dispatcher:
        """The attached dispatcher."""
        assert self._dispatcher is not None, "EndpointKeeper.attach was not called"
        return self._dispatcher

    def model_swap(self, ep: Endpoint, cap: Capacity | None) -> str | None:
        """Why ``ep`` may not serve this run (None when it may): it reports another model
        than it served before (or, never seen, than the fleet served), a server restarted
        with another model on the same URL. ``--allow-mixed-models`` lets it serve."""
        if self.cfg.allow_mixed_models or cap is None or not cap.model:
            return None
        expected = ep.model or next((e.model for e in self.endpoints if e.model), None)
        if expected is None or cap.model == expected:
            return None
        return (
            f"it now serves model {cap.model!r}, not {expected!r} as before (a server "
            "restarted with another model?); a run is one model's answers: it stays out "
            "until it serves that model again (--allow-mixed-models takes both)"
        )

    async def check_alive(self, ep: Endpoint) -> bool:
        """The dispatcher's health check: the server answers, and still serves the run's
        model (else it is taken out here, saying both models)."""
        ep.thinking.suspect()  # after a connection error or timeout: restarted?
        if not await check_alive(self.session, ep.address, self.probe_timeout):
            return False
        if not self.cfg.allow_mixed_models:
            cap = await probe_capacity(self.session, ep.address, timeout=self.probe_timeout)
            if (swap := self.model_swap(ep, cap)) is not None:
                self.dispatcher.take_out_dead(ep, swap)
        await self.learn_thinking(ep)  # restarted with other kwargs?
        return True

    async def ask_thinking(self, ep: Endpoint) -> bool | None:
        """``ep``'s default thinking mode now (None: it did not tell). A busy server queues
        the probe's one-token requests behind its batch: they get longer than a health probe."""
        model = self.cfg.model or ep.model or self.model
        timeout = max(self.probe_timeout, 30.0)
        return await probe_thinking(self.session, ep.address, model, timeout=timeout)

    async def learn_thinking(self, ep: Endpoint) -> None:
        """Ask ``ep``'s default thinking mode again, where answers need it and it was asked
        before (its first requests ask: ``ThinkingMode.first``)."""
        if not self.thinking or not ep.thinking.asked or ep in self._thinking_probes:
            return
        self._thinking_probes.add(ep)
        try:
            at = ep.thinking.changes
            ep.thinking.learn(await self.ask_thinking(ep), at)
        finally:
            self._thinking_probes.discard(ep)

    def untold(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Those of ``endpoints`` whose mode a probe could not learn, to ask again (at most
        ``thinking.RETRIES`` times in a row)."""
        if not self.thinking:
            return []
        return [
            e
            for e in endpoints
            if e.thinking.asked
            and e.thinking.value is None
            and e.thinking.untold < RETRIES
            and e not in self._thinking_probes
        ]

    async def revive(self, ep: Endpoint) -> None:
        """Probe ``ep`` until it serves again, then put it back (module docstring)."""
        # probed often at first (most outages are restarts of seconds: every second late is a
        # server's share lost), every probe_interval after _FAST_PROBE_S
        ep.thinking.suspect()  # out of service: it may come back with other kwargs
        since = self.clock()
        d = self.dispatcher
        while not d.stopping:
            await asyncio.sleep(probe_pause(self.clock() - since, self.cfg.probe_interval))
            if ep.breaker.refusal is not None and self.clock() < ep.breaker.retry_refused_at:
                continue  # a refusing endpoint passes /health: wait for its trial
            if not await check_alive(self.session, ep.address, self.probe_timeout):
                continue
            cap = await probe_capacity(self.session, ep.address, timeout=self.probe_timeout)
            if (swap := self.model_swap(ep, cap)) is not None:
                if ep.breaker.fault != swap:  # said once, not at every probe
                    ep.breaker.fault = swap
                    self.log(f"endpoint {ep.url} stays out: {swap}")
                continue
            if cap is not None:
                ep.set_capacity(cap)
            await self.learn_thinking(ep)  # back: maybe restarted with other kwargs
            trial = ep.breaker.refusal is not None
            ep.breaker.mark_up(half_open=ep.breaker.downs > 0)
            if not trial:  # a trial is said only if it succeeds ("answers ... again")
                self.log(f"endpoint {ep.url} is back; concurrency {ep.concurrency.limit}")
            d.wake.set()
            return
