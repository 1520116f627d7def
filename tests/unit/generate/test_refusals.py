"""Endpoint refusals in the dispatcher: the endpoint is taken out in one line, the prompt is
never charged (over in-process fake endpoints)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient, ListSink, endpoint, user, write

from draftdata.errors import EndpointRefusedError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.client import request_body
from draftdata.generate.engine.dispatch import Dispatcher
from draftdata.generate.engine.request import Request
from draftdata.generate.prompts.source import PromptReader
from draftdata.records import Turn


class Refusing(FakeClient):
    """Refuses every chat request with ``status`` after ``delay`` s."""

    def __init__(self, status: int, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.status = status

    async def chat(self, request: Request) -> list[Turn]:
        self.bodies.append(request_body(request))
        await asyncio.sleep(self.delay)
        raise EndpointRefusedError("refused (fake)", status=self.status)


async def dispatch(tmp: Path, eps: list[Any], n: int) -> tuple[Dispatcher, ListSink, list[str]]:
    prompts = write(tmp / "p.jsonl", [user(i) for i in range(n)])
    sink = ListSink()
    lines: list[str] = []

    async def alive(ep: Any) -> bool:
        return True

    async def revive(ep: Any) -> None:
        return None

    config = GenerateConfig(prompts="p", out="o", endpoints=["x"], hedge=False, max_attempts=2)
    d = Dispatcher(
        config,
        eps,
        PromptReader([prompts]),
        sink,
        model="m",
        is_done=lambda i, s: (i, s) in sink.done,
        check_alive=alive,
        revive=revive,
        log=lines.append,
        seed=0,
    )
    await asyncio.wait_for(d.run(), 20)
    return d, sink, lines


@settings(max_examples=15, deadline=None)
@given(
    statuses=st.lists(st.sampled_from([401, 403, 404, 405, 501]), min_size=1, max_size=3),
    good_delay=st.sampled_from([0.0, 0.002]),
)
def test_refusing_endpoints_never_fail_a_prompt(
    tmp_path_factory: Any, statuses: list[int], good_delay: float
) -> None:
    """Any number of fast-refusing endpoints beside one slow good one: every prompt completes
    there on its first charged attempt, each refusing endpoint is said once, with its status."""
    tmp = tmp_path_factory.mktemp("r")
    refusing = [endpoint(i, Refusing(s), limit=8) for i, s in enumerate(statuses)]
    good = endpoint(len(statuses), FakeClient(good_delay), limit=2)
    _, sink, lines = asyncio.run(dispatch(tmp, [*refusing, good], 30))
    assert sorted(c.id for c in sink.completions) == sorted(f"p{i}" for i in range(30))
    assert sink.failures == []
    assert {c.attempts for c in sink.completions} == {1}
    assert {c.endpoint for c in sink.completions} == {good.url}
    for ep, status in zip(refusing, statuses, strict=True):
        mine = [line for line in lines if ep.url + " " in line]
        assert len(mine) == 1 and f"HTTP {status}" in mine[0], lines
        assert (
            ep.breaker.state == "down"
            and ep.breaker.refusal is not None
            and ep.meter.errors["refused"] >= 1
        )
