"""The opening check (issue 31): when one request refusal ends most of a command's first
requests the dispatcher stops in one line quoting the server and records none of them; a few
refusals among answers are each recorded, as before. Generated over sequences of outcomes (an
answer, two different 400s, a context-length 400), driven through the dispatcher with an
in-process endpoint that answers one request at a time, so the order of outcomes is known."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient, cfg, dispatcher, endpoint, user, write

from draftdata.errors import ContextLengthError, FatalRequestError, FleetUnavailableError
from draftdata.generate.engine.opening import FIRST
from draftdata.generate.engine.request import Request
from draftdata.records import Turn

# outcome -> (error type, the server's message); "ok" answers
ERRORS: dict[str, tuple[type[FatalRequestError], str]] = {
    "top_k": (FatalRequestError, "Unsupported parameter: top_k"),
    "image": (FatalRequestError, "messages.0: images are not supported"),
    "ctx": (ContextLengthError, "The input (9000 tokens) is longer than the model's context"),
}


class Scripted(FakeClient):
    """Answers or refuses each prompt as ``script`` says (by the prompt's text); a prompt
    asked again after its answer is a canary (``recheck.py``), answered, kept apart."""

    def __init__(self, script: dict[str, str]) -> None:
        super().__init__()
        self.script = script
        self.order: list[str] = []  # the outcomes in the order they were given
        self.answered: set[str] = set()
        self.canaries = 0

    async def chat(self, request: Request) -> list[Turn]:
        text = str(request.messages[-1].content)
        if text in self.answered:
            self.canaries += 1
            return await super().chat(request)
        outcome = self.script[text]
        self.order.append(outcome)
        if outcome == "ok":
            self.answered.add(text)
            return await super().chat(request)
        kind, message = ERRORS[outcome]
        raise kind(message, status=400)


def _run(tmp: Path, outcomes: list[str]) -> tuple[Scripted, Any, Any, BaseException | None]:
    rows = [user(i, f"q{i}") for i in range(len(outcomes))]
    prompts = write(tmp / "p.jsonl", rows)
    client = Scripted({f"q{i}": o for i, o in enumerate(outcomes)})
    d, sink = dispatcher(cfg(order="file"), [endpoint(0, client, limit=1)], prompts)
    raised: BaseException | None = None
    try:
        asyncio.run(asyncio.wait_for(d.run(), 20))
    except FleetUnavailableError as exc:
        raised = exc
    return client, d, sink, raised


@settings(max_examples=120, deadline=None)
@given(
    outcomes=st.lists(
        st.sampled_from(["ok", "top_k", "image", "ctx"]), min_size=1, max_size=2 * FIRST + 5
    )
)
def test_one_refusal_of_most_first_requests_stops_and_records_none(
    tmp_path_factory: pytest.TempPathFactory, outcomes: list[str]
) -> None:
    """Stop iff one refusal (not a context length) ended more than half of the first
    ``FIRST`` requests (all of them in a shorter command) and none of them was answered: one
    line quoting the server, no ``invalid_request`` failure recorded; else every prompt
    settled once, as before (each refusal after an answer once a canary is answered)."""
    client, _, sink, raised = _run(tmp_path_factory.mktemp("o"), outcomes)
    first = outcomes[:FIRST]
    said = Counter(o for o in first if o in ("top_k", "image"))
    top, count = said.most_common(1)[0] if said else ("", 0)
    if 2 * count > len(first) and "ok" not in first:
        assert raised is not None, client.order
        line = str(raised)
        assert "\n" not in line and f"HTTP 400: {ERRORS[top][1]}" in line
        assert f"{count} of the first {len(first)} requests" in line
        assert client.order == first and client.canaries == 0
        assert [f for f in sink.failures if f.reason == "invalid_request"] == []
        assert len(sink.completions) == client.order.count("ok")
    else:
        assert raised is None, str(raised)
        assert client.order == outcomes  # one at a time, in file order
        refusals = sum(o in ("top_k", "image") for o in outcomes)
        if not refusals or "ok" not in outcomes:  # a canary asks again an answered request
            assert client.canaries == 0
        got = Counter(f.reason for f in sink.failures)
        assert (
            got
            == Counter(
                {
                    "invalid_request": sum(o in ("top_k", "image") for o in outcomes),
                    "context_length": outcomes.count("ctx"),
                }
            )
            - Counter()
        )
        settled = [c.id for c in sink.completions] + [f.id for f in sink.failures]
        assert sorted(settled) == sorted(f"p{i}" for i in range(len(outcomes)))
        for f in sink.failures:
            if f.reason == "invalid_request":
                assert f.message in {m for _, m in ERRORS.values()}


def _resume(
    tmp: Path, answered: int, outcomes: list[str]
) -> tuple[Scripted, Any, BaseException | None]:
    """A run whose earlier commands answered its first ``answered`` prompts; this command
    meets the rest, answered or refused as ``outcomes`` says."""
    rows = [user(i, f"q{i}") for i in range(answered + len(outcomes))]
    prompts = write(tmp / "p.jsonl", rows)
    script = {f"q{i}": "ok" for i in range(answered)}
    script |= {f"q{answered + i}": o for i, o in enumerate(outcomes)}
    client = Scripted(script)
    done = {(f"p{i}", 0) for i in range(answered)}
    d, sink = dispatcher(cfg(order="file"), [endpoint(0, client, limit=1)], prompts, done=done)
    raised: BaseException | None = None
    try:
        asyncio.run(asyncio.wait_for(d.run(), 20))
    except FleetUnavailableError as exc:
        raised = exc
    return client, sink, raised


@settings(max_examples=60, deadline=None)
@given(
    answered=st.integers(1, 3 * FIRST),
    outcomes=st.lists(
        st.sampled_from(["ok", "top_k", "image", "ctx"]), min_size=1, max_size=FIRST - 1
    ).filter(lambda o: 2 * max(o.count("top_k"), o.count("image")) <= FIRST),
)
def test_a_resumed_runs_last_few_prompts_are_settled_not_stopped_on(
    tmp_path_factory: pytest.TempPathFactory, answered: int, outcomes: list[str]
) -> None:
    """A command that resumes a run with answers and meets fewer than ``FIRST`` prompts (the
    tail of an interrupted run) records their refusals: stopping there would record nothing,
    and the same command would stop again on the same prompts, so the run could never end. A
    refusal of more than half of ``FIRST`` still stops it."""
    client, sink, raised = _resume(tmp_path_factory.mktemp("r"), answered, outcomes)
    assert raised is None, str(raised)
    assert client.order == outcomes
    settled = [c.id for c in sink.completions] + [f.id for f in sink.failures]
    assert sorted(settled) == sorted(f"p{answered + i}" for i in range(len(outcomes)))
