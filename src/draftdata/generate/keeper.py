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
  refusing one waits for its trial.

It holds no policy of its own beyond those probe intervals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import aiohttp

from draftdata.endpoints import Capacity, probe_capacity
from draftdata.generate.config import GenerateConfig
from draftdata.generate.endpoint import Endpoint, check_alive


class Dispatcher(Protocol):
    """What the keeper needs of the dispatcher (``dispatch.Dispatcher``)."""

    stopping: bool
    wake: asyncio.Event

    def take_out_dead(self, ep: Endpoint, why: str) -> None:
        """Take ``ep`` out now, its in-flight work requeued."""
        ...


_FAST_PROBE_S = 30.0  # a taken-out endpoint is probed every _FAST_PROBE_INTERVAL s this long
_FAST_PROBE_INTERVAL = 0.2


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
    ) -> None:
        self.cfg = config
        self.endpoints = endpoints
        self.session = session
        self.log = log
        self.clock = clock
        self.probe_timeout = min(5.0, config.connect_timeout)
        self._dispatcher: Dispatcher | None = None

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
        if not await check_alive(self.session, ep.address, self.probe_timeout):
            return False
        if not self.cfg.allow_mixed_models:
            cap = await probe_capacity(self.session, ep.address, timeout=self.probe_timeout)
            if (swap := self.model_swap(ep, cap)) is not None:
                self.dispatcher.take_out_dead(ep, swap)
        return True

    async def revive(self, ep: Endpoint) -> None:
        """Probe ``ep`` until it serves again, then put it back (module docstring)."""
        # probed often at first (most outages are restarts of seconds: every second late is a
        # server's share lost), every probe_interval after _FAST_PROBE_S
        since = self.clock()
        d = self.dispatcher
        while not d.stopping:
            fast = self.clock() - since < _FAST_PROBE_S
            await asyncio.sleep(min(self.cfg.probe_interval, _FAST_PROBE_INTERVAL if fast else 1e9))
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
            trial = ep.breaker.refusal is not None
            ep.breaker.mark_up(half_open=ep.breaker.downs > 0)
            if not trial:  # a trial is said only if it succeeds ("answers ... again")
                self.log(f"endpoint {ep.url} is back; concurrency {ep.concurrency.limit}")
            d.wake.set()
            return
