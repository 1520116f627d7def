"""An in-process transport for dispatcher tests (the seam ``endpoint.ChatClient``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftdata.errors import ServerError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.caller import Caller
from draftdata.generate.engine.client import request_body
from draftdata.generate.engine.dispatch import Dispatcher
from draftdata.generate.engine.endpoint import ChatClient, Endpoint
from draftdata.generate.engine.request import Request
from draftdata.generate.prompts.source import PromptReader
from draftdata.records import Completion, Failure, Turn, Usage


class FakeClient:
    """Answers after ``delay`` s with one Turn per asked choice (at most ``max_n``); ``fail``
    maps a request number (1-based) to the ServerError type it raises instead."""

    def __init__(
        self,
        delay: float = 0.0,
        *,
        max_n: int = 128,
        fail: dict[int, type[ServerError]] | None = None,
        fail_all: type[ServerError] | None = None,
    ) -> None:
        self.delay = delay
        self.max_n = max_n
        self.fail = fail or {}
        self.fail_all = fail_all
        self.bodies: list[dict[str, Any]] = []
        self.running = 0
        self.peak = 0
        self.token_ids_supported: bool | None = None

    async def chat(self, request: Request) -> list[Turn]:
        body = request_body(request)  # as the real client sends it
        self.bodies.append(body)
        number = len(self.bodies)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.running -= 1
        error = self.fail.get(number) or self.fail_all
        if error is not None:
            raise error(f"fake {error.reason}", status=500)
        last = body["messages"][-1]["content"]
        n = min(body.get("n", 1), self.max_n)
        return [
            Turn(
                content=f"answer {i} to {last}",
                reasoning=f"thinking {i}",
                finish_reason="stop",
                usage=Usage(prompt_tokens=5, completion_tokens=10),
            )
            for i in range(n)
        ]

    async def close(self) -> None:
        pass


class TickingClient(FakeClient):
    """A FakeClient whose answers take ``delay`` s on a fake clock (``now[0]``, moved when an
    answer comes back) instead of real time: a request's age is what the test says, whatever
    the machine's load."""

    def __init__(self, now: list[float], delay: float, **kw: Any) -> None:
        super().__init__(0.0, **kw)
        self.now = now
        self.took = delay

    async def chat(self, request: Request) -> list[Turn]:
        await asyncio.sleep(0)  # running, as seen by the dispatcher, for one turn of the loop
        self.now[0] += self.took
        return await super().chat(request)


async def until(what: str, cond: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait, on the event loop, until ``cond()`` holds (``timeout`` s is a bug's bound, not a
    pace: a loaded machine only takes longer to get there)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.001)


class ListSink:
    """Collects what the dispatcher settles."""

    def __init__(self) -> None:
        self.completions: list[Completion] = []
        self.failures: list[Failure] = []
        self.done: set[tuple[str, int]] = set()

    def completion(self, c: Completion) -> None:
        self.completions.append(c)
        self.done.add((c.id, c.sample))

    def failure(self, f: Failure) -> None:
        self.failures.append(f)
        self.done.add((f.id, f.sample))


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def user(i: int, text: str | None = None) -> dict[str, Any]:
    return {"id": f"p{i}", "messages": [{"role": "user", "content": text or f"q{i}"}]}


def endpoint(i: int, client: ChatClient, limit: int = 4, **kw: Any) -> Endpoint:
    ep = Endpoint(
        f"http://fake-{i}:8000",
        client,
        index=i,
        concurrency=kw.pop("concurrency", limit),
        default_concurrency=limit,
        breaker_failures=kw.pop("breaker_failures", 3),
    )
    ep.breaker.state = "up"
    ep.model = "m"
    return ep


def dispatcher(
    config: GenerateConfig,
    endpoints: list[Endpoint],
    prompts: Path,
    *,
    alive: bool = True,
    done: set[tuple[str, int]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Dispatcher, ListSink]:
    """A Dispatcher over ``prompts`` and ``endpoints`` into a ListSink, not yet running;
    ``clock`` is its clock and its caller's (a test's fake one decides when a backoff ends or
    how old a request is, whatever the machine's load)."""
    sink = ListSink()
    settled = done or set()

    async def check(ep: Endpoint) -> bool:
        return alive

    async def revive(ep: Endpoint) -> None:
        return None

    d = Dispatcher(
        config,
        endpoints,
        PromptReader([prompts], limit=config.limit, partition=config.partition),
        sink,
        model="m",
        is_done=lambda i, s: (i, s) in settled or (i, s) in sink.done,
        check_alive=check,
        revive=revive,
        log=lambda line: None,
        clock=clock,
        seed=0,
        caller=Caller(config, model="m", clock=clock),
    )
    return d, sink


async def run_dispatch(
    config: GenerateConfig,
    endpoints: list[Endpoint],
    prompts: Path,
    *,
    alive: bool = True,
    done: set[tuple[str, int]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Dispatcher, ListSink]:
    d, sink = dispatcher(config, endpoints, prompts, alive=alive, done=done, clock=clock)
    await asyncio.wait_for(d.run(), 20)
    return d, sink


def cfg(**kw: Any) -> GenerateConfig:
    """A config for in-process dispatcher tests: fast backoff, no hedging, ``kw`` on top."""
    base: dict[str, Any] = {
        "prompts": "p",
        "out": "o",
        "endpoints": ["x"],
        "backoff_base": 0.001,
        "backoff_max": 0.01,
        "hedge": False,
    }
    base.update(kw)
    return GenerateConfig(**base)
