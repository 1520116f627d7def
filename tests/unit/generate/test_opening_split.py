"""A job among the command's first ones that is asked again split (one request per sample,
once the server is found to ignore ``n``) ends through its parts: the opening check closes
when they have, and a fleet that changes afterwards is caught by the canary at once, not
after every prompt left was refused (the opening held every refusal until the command ended,
and a changed fleet was asked the whole file before the command stopped)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient, cfg, dispatcher, endpoint, user, write

from draftdata.errors import FatalRequestError, FleetUnavailableError, RetryableServerError
from draftdata.generate.engine.request import Request
from draftdata.records import Turn

PROMPTS = 300
CHANGED = "Bad request: this server is configured differently"


class Changing(FakeClient):
    """Answers one choice whatever ``n`` asks (a server that ignores it), fails request
    ``flaky`` with a 5xx, and refuses every request after its first ``after``."""

    def __init__(self, after: int, flaky: int) -> None:
        super().__init__(max_n=1, fail={flaky: RetryableServerError})
        self.after = after
        self.refused = 0

    async def chat(self, request: Request) -> list[Turn]:
        if len(self.bodies) >= self.after:
            self.bodies.append({})
            self.refused += 1
            raise FatalRequestError(CHANGED, status=400)
        return await super().chat(request)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flaky=st.integers(1, 6), after=st.integers(40, 80), limit=st.sampled_from([2, 4, 8]))
def test_a_split_job_of_the_opening_does_not_keep_it_open(
    tmp_path_factory: pytest.TempPathFactory, flaky: int, after: int, limit: int
) -> None:
    tmp: Path = tmp_path_factory.mktemp("s")
    prompts = write(tmp / "p.jsonl", [user(i) for i in range(PROMPTS)])
    client = Changing(after, flaky)
    d, sink = dispatcher(cfg(order="file", n=2), [endpoint(0, client, limit=limit)], prompts)
    with pytest.raises(FleetUnavailableError, match="answered earlier in this run"):
        asyncio.run(asyncio.wait_for(d.run(), 20))
    assert not d.opening.open
    assert sink.failures == []  # none of the changed fleet's refusals is recorded
    # stopped at once: not every prompt left was asked of the changed fleet
    assert client.refused < PROMPTS // 3, client.refused
