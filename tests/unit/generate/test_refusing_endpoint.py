"""Endpoints that refuse every request with one HTTP 400 (opening.EndpointRefusals), driven
through the dispatcher with in-process endpoints: a refusing server answers at once and the
others take their time, the way a misconfigured server of a real fleet does. Generated over
the fleet's size, which endpoints refuse and from when, their concurrency, ``n`` and
multi-turn prompts; plus the judge's own rules and a taken-out endpoint's trials."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient, cfg, dispatcher, endpoint, write

from draftdata.errors import FatalRequestError, FleetUnavailableError
from draftdata.generate.engine.dispatch import Dispatcher
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.opening import FIRST, OTHER, RECENT, EndpointRefusals, Verdict
from draftdata.generate.engine.request import Request
from draftdata.records import Turn

SAID = "Bad request: this chat template does not take tools"


class Refusing(FakeClient):
    """Answers after ``delay``; refuses every request after its first ``after`` with one 400,
    at once (``after`` None: never)."""

    def __init__(self, delay: float, after: int | None) -> None:
        super().__init__(delay)
        self.after = after
        self.seen = 0
        self.refused = 0

    async def chat(self, request: Request) -> list[Turn]:
        self.seen += 1
        if self.after is not None and self.seen > self.after:
            self.refused += 1
            await asyncio.sleep(0)
            raise FatalRequestError(SAID, status=400)
        return await super().chat(request)


def _rows(n: int, multi: bool) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"q{i}"}]
        if multi and i % 2:
            msgs += [{"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
        rows.append({"id": f"p{i}", "messages": msgs})
    return rows


def _run(
    tmp: Path,
    clients: list[Refusing],
    limits: list[int],
    rows: list[dict[str, Any]],
    n: int,
    done: set[tuple[str, int]] | None = None,
) -> tuple[Dispatcher, Any, list[str], BaseException | None]:
    prompts = write(tmp / "p.jsonl", rows)
    pairs = enumerate(zip(clients, limits, strict=True))
    eps = [endpoint(i, c, limit=lim) for i, (c, lim) in pairs]
    d, sink = dispatcher(cfg(n=n), eps, prompts, done=done)
    lines: list[str] = []
    d.log = lines.append
    raised: BaseException | None = None
    try:
        asyncio.run(asyncio.wait_for(d.run(), 30))
    except FleetUnavailableError as exc:
        raised = exc
    return d, sink, lines, raised


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    size=st.integers(1, 4),
    prompts_n=st.integers(1, 40),
    n=st.sampled_from([1, 2]),
    multi=st.booleans(),
)
def test_refusing_endpoints_never_cost_a_prompt(
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    size: int,
    prompts_n: int,
    n: int,
    multi: bool,
) -> None:
    """While one endpoint answers, no prompt is recorded as failed and every (prompt, sample)
    is answered once, however many endpoints refuse and from when, in a run started or
    resumed (its first prompts settled before); an endpoint refusing many times is taken out
    in one line quoting it. When every endpoint refuses from the start
    the run stops in one line and records no refusal (a resumed run's last few prompts, fewer
    than half of ``FIRST``, are recorded instead: the opening check's tail rule)."""
    refusing = data.draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=size))
    everyone = len(refusing) == size
    after = {i: 0 if everyone else data.draw(st.integers(0, 8)) for i in refusing}
    limits = [data.draw(st.integers(1, 4)) for _ in range(size)]
    resumed = data.draw(st.integers(0, prompts_n - 1), label="resumed")
    settled = {(f"p{i}", s) for i in range(resumed) for s in range(n)}
    left = range(resumed, prompts_n)
    clients = [Refusing(0.003, after.get(i)) for i in range(size)]
    _, sink, lines, raised = _run(
        tmp_path_factory.mktemp("r"), clients, limits, _rows(prompts_n, multi), n, settled
    )
    refused = [f for f in sink.failures if f.reason == "invalid_request"]
    jobs = sum(n if multi and i % 2 else 1 for i in left)  # a multi-turn job is one sample
    if everyone and resumed and 2 * jobs <= FIRST:
        assert raised is None and len(refused) == len(left) * n
        return
    assert refused == []
    if everyone:
        assert raised is not None and "\n" not in str(raised) and SAID in str(raised)
        return
    assert raised is None, str(raised)
    done = Counter((c.id, c.sample) for c in sink.completions)
    assert done == Counter({(f"p{i}", s): 1 for i in left for s in range(n)})
    for i, c in enumerate(clients):
        said = [ln for ln in lines if ln.startswith(f"endpoint http://fake-{i}:8000 taken out")]
        if i in refusing and c.refused >= 2 * RECENT:
            assert len(said) == 1 and SAID in said[0], lines
        if i not in refusing:
            assert said == [], lines


def test_the_instant_refuser_takes_a_window_not_the_queue(tmp_path: Path) -> None:
    """The refusing endpoint answers at once, so it is free first and would take every job
    of the run before the others answer one: it takes a window's worth and its in-flight
    ones, is held out, then taken out once another endpoint answers what it refused."""
    bad, good = Refusing(0.0, 0), Refusing(0.02, None)
    _, sink, lines, raised = _run(tmp_path, [bad, good], [4, 4], _rows(200, False), 1)
    assert raised is None and sink.failures == [] and len(sink.completions) == 200
    assert bad.refused <= RECENT + 4, bad.refused
    said = [ln for ln in lines if "taken out" in ln]
    assert len(said) == 1 and said[0].startswith("endpoint http://fake-0:8000 taken out: it ")
    assert f"(HTTP 400: {SAID}); its requests: " in said[0]
    assert "requeued on the other endpoints" in said[0]  # the ones it refused, asked there


def test_a_taken_out_endpoint_on_trial_refusing_again_is_out_again_silently(
    tmp_path: Path,
) -> None:
    """Re-admitted for a trial (here at once, over and over), the endpoint that still refuses
    the same way is taken out again at its first refusal, without another line, its trial
    jobs answered elsewhere; one that answers on its trial serves again."""
    bad, good = Refusing(0.0, 0), Refusing(0.01, None)
    prompts = write(tmp_path / "p.jsonl", _rows(120, False))
    eps = [endpoint(0, bad, limit=4), endpoint(1, good, limit=4)]
    d, sink = dispatcher(cfg(), eps, prompts)
    lines: list[str] = []
    d.log = lines.append
    trials = 0

    async def revive(ep: Endpoint) -> None:
        nonlocal trials
        await asyncio.sleep(0.02)
        trials += 1
        ep.breaker.mark_up(half_open=True)
        d.wake.set()

    d._revive = revive
    asyncio.run(asyncio.wait_for(d.run(), 30))
    assert sink.failures == [] and len(sink.completions) == 120
    assert trials >= 2
    assert len([ln for ln in lines if "taken out" in ln]) == 1, lines
    assert bad.refused <= RECENT + 4 + trials * 4


def _refuse(
    j: EndpointRefusals,
    url: str,
    refusers: dict[str, str],
    serving: list[str],
    back: list[str] | None = None,
) -> Verdict:
    j.came(url, j.sent(url), SAID)
    return j.refused(url, SAID, refusers, serving, back or [])


def _answer(j: EndpointRefusals, url: str, refusers: dict[str, str]) -> tuple[Any, ...]:
    j.came(url, j.sent(url), None)
    return j.answered(url, refusers)


def test_the_judge_over_outcome_sequences() -> None:
    """The rules alone: a fleet of one has nobody else to ask; a refusal is asked elsewhere
    while a trusted endpoint in service has not refused the job, later while only one out of
    service has not; a window mostly of one refusal makes a suspect, held out only while
    another endpoint is trusted; an answer elsewhere to what it refused takes it out; answers
    of its own end the suspicion, and so do the same refusal from one in good standing and a
    refused job found the prompt's."""
    j = EndpointRefusals()
    assert _refuse(j, "a", {"a": SAID}, ["a"]).job == "prompts"
    assert _refuse(j, "a", {"a": SAID}, ["a", "b"]).job == "elsewhere"
    assert _refuse(j, "a", {"a": SAID}, ["a"], ["b"]).job == "later"
    assert _refuse(j, "b", {"a": SAID, "b": SAID}, ["a", "b"]).job == "prompts"
    j = EndpointRefusals()
    for _ in range(RECENT):
        _refuse(j, "a", {"a": SAID}, ["a", "b"])
    assert j.held_out("a", ["a", "b"]) and not j.held_out("a", ["a"])
    assert _refuse(j, "a", {"a": SAID}, ["a", "b"]).job == "elsewhere"
    assert _refuse(j, "b", {"a": SAID, "b": SAID}, ["a", "b"]).job == "prompts"
    assert _answer(j, "b", {"a": SAID}) == (("a", SAID),)
    assert j.faulty == {"a": SAID} and j.suspects == {}
    assert _refuse(j, "a", {"a": SAID}, ["a", "b"]).out == (("a", SAID),)  # on trial
    _answer(j, "a", {})
    assert j.faulty == {}
    j = EndpointRefusals()
    for _ in range(RECENT):
        _refuse(j, "c", {"c": SAID}, ["c", "d"])
    assert "c" in j.suspects
    for _ in range(3):
        _answer(j, "c", {})
    assert "c" not in j.suspects  # its answers came: it answers
    assert _answer(j, "d", {"c": SAID}) == ()
    j = EndpointRefusals()
    for _ in range(RECENT):
        _refuse(j, "e", {"e": SAID}, ["e", "f"])
    _answer(j, "f", {})
    assert j.witness({"f": "x", "e": SAID}) == "f"
    assert j.witness({"e": SAID, "f": "x"}) == "f"
    _refuse(j, "f", {"f": SAID}, ["e", "f"])  # one in good standing refuses the same way
    assert j.suspects == {}
    j = EndpointRefusals()
    for _ in range(RECENT):
        _refuse(j, "g", {"g": SAID}, ["g", "h"])
    assert _refuse(j, "g", {"h": SAID, "g": SAID}, ["g", "h"]).job == "prompts"
    assert j.suspects == {}  # what it refused was the prompt's


@settings(max_examples=300, deadline=None)
@given(
    refused=st.lists(st.booleans(), min_size=1, max_size=4 * RECENT),
    order=st.randoms(use_true_random=False),
    back=st.floats(0.0, 1.0),
)
def test_the_window_is_the_requests_as_they_were_sent(
    refused: list[bool], order: Any, back: float
) -> None:
    """Requests come back in any order (a refusal at once, an answer in its time) and some are
    still out: an endpoint is judged on the ``RECENT`` requests sent last before the newest
    that came back, those still out counting as answers to come. So a healthy server, never
    refusing 6 of 8 requests sent in a row, is never ``mostly`` refusing, whichever of its
    requests came back first; one refusing everything from some request on is, once 8 of
    those are back, whatever older requests are still out."""
    j = EndpointRefusals()
    numbers = [j.sent("a") for _ in refused]
    returned = list(numbers)
    order.shuffle(returned)
    returned = returned[: max(1, round(back * len(returned)))]
    for number in returned:
        j.came("a", number, SAID if refused[number] else (None if number % 3 else OTHER))
    top = max(returned) + 1
    window = [n for n in range(top - RECENT, top) if n >= 0 and n in returned and refused[n]]
    assert j.mostly("a", SAID) == (top >= RECENT and 4 * len(window) >= 3 * RECENT)
    runs = [sum(refused[i : i + RECENT]) for i in range(max(1, len(refused) - RECENT + 1))]
    if max(runs) < 3 * RECENT // 4:
        assert not j.mostly("a", SAID)
    j = EndpointRefusals()
    old = [j.sent("b") for _ in range(RECENT)]  # still out: a server that turned wrong
    new = [j.sent("b") for _ in range(RECENT)]
    for number in new:
        j.came("b", number, SAID)
    assert j.mostly("b", SAID)
    for number in old:  # its older requests' answers come back late
        j.came("b", number, None)
    assert j.mostly("b", SAID)


class Picky(FakeClient):
    """Answers after ``delay``; refuses at once, with one 400, every prompt whose text starts
    with "bad" (a prompt every server refuses: a request field some prompts carry)."""

    async def chat(self, request: Request) -> list[Turn]:
        if str(request.messages[-1].content).startswith("bad"):
            await asyncio.sleep(0)
            raise FatalRequestError(SAID, status=400)
        return await super().chat(request)


@settings(max_examples=8, deadline=None)
@given(size=st.integers(2, 3), bad=st.integers(RECENT, 2 * RECENT), limit=st.integers(1, 4))
def test_prompts_every_server_refuses_suspect_no_server(
    tmp_path_factory: pytest.TempPathFactory, size: int, bad: int, limit: int
) -> None:
    """A run of prompts every server refuses the same way (after the opening window) fills
    each server's latest outcomes with that refusal: the prompts are recorded as failed, and
    no server stays held out or is taken out for them (a refusal the servers in good standing
    give too is not one server's), so the good prompts after them go to every server."""
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(20)]
    rows += [
        {"id": f"b{i}", "messages": [{"role": "user", "content": f"bad {i}"}]} for i in range(bad)
    ]
    rows += [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(60)]
    clients = [Picky(0.003) for _ in range(size)]
    prompts = write(tmp_path_factory.mktemp("p") / "p.jsonl", rows)
    d, sink = dispatcher(
        cfg(order="file"), [endpoint(i, c, limit=limit) for i, c in enumerate(clients)], prompts
    )
    lines: list[str] = []
    d.log = lines.append
    asyncio.run(asyncio.wait_for(d.run(), 30))
    assert sorted(f.id for f in sink.failures) == sorted(f"b{i}" for i in range(bad))
    assert len(sink.completions) == 80
    assert [ln for ln in lines if "taken out" in ln] == []
    assert d.refusals.suspects == {}
