"""The dispatcher over in-process fake endpoints: placement, retries, loss, n, multi-turn."""

from __future__ import annotations

import asyncio
import tempfile
import traceback
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import (
    FakeClient,
    cfg,
    dispatcher,
    endpoint,
    run_dispatch,
    until,
    user,
    write,
)

from draftdata.errors import (
    ConnectionLostError,
    ContextLengthError,
    RequestTimeoutError,
    RetryableServerError,
)
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.request import Request
from draftdata.generate.engine.work import Job
from draftdata.records import Message, Prompt, Turn
from draftdata.shared.conversation import TurnPlan


def job(prefix: str | None = None, cost: int = 10) -> Job:
    p = Prompt(id="a", messages=[Message(role="user", content="q")])
    return Job(
        p,
        [0],
        TurnPlan(p.messages),
        sampling=cfg().sampling,
        max_tokens=8,
        reasoning="server",
        prefix=prefix,
        cost=cost,
    )


def test_a_split_job_keeps_its_attempts() -> None:
    """A retried n-sample job split for a server without ``n`` must not start its samples'
    attempt count from zero (they could then exceed max_attempts in all)."""
    j = job().with_samples([0, 1, 2])
    j.attempts = 3
    assert [x.attempts for x in j.split()] == [3, 3, 3]
    assert [x.samples for x in j.split()] == [[0], [1], [2]]


async def test_pick_prefers_most_free_then_fewest_outstanding_tokens(tmp_path: Path) -> None:
    from draftdata.generate.engine.length import LengthModel
    from draftdata.generate.engine.placement import Placement

    a, b, c = (endpoint(i, FakeClient(), limit=8) for i in range(3))
    a.acquire(2, 100)
    b.acquire(1, 500)
    c.acquire(1, 50)
    place = Placement([a, b, c], LengthModel(), hedge_min_age=1.0)
    assert place.pick(job(), [a, b, c], now=0.0) is c  # b and c have 7 free; c fewer tokens
    j = job()
    j.avoid = {c.url}
    j.ready_since = 0.0
    assert place.pick(j, [a, b, c], now=0.0) is b  # a retry goes elsewhere
    assert place.pick(j, [c], now=1.0) is None  # ... waiting a moment for another one
    assert place.pick(j, [c], now=3.0) is c  # ... not for ever


async def test_every_prompt_once_and_slots_never_exceeded(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(60)] + [user(3)])
    clients = [FakeClient(0.01), FakeClient(0.03)]
    eps = [endpoint(i, c, limit=4) for i, c in enumerate(clients)]
    d, sink = await run_dispatch(cfg(), eps, prompts)
    assert Counter(c.id for c in sink.completions) == Counter(f"p{i}" for i in range(60))
    # the repeated id is answered once; its second line is a reject (duplicate_id)
    assert d.reader.duplicates == d.reader.invalid == 1
    assert d.duplicates == 0 and d.already_done == 0
    assert all(c.peak <= 4 for c in clients)
    # the faster endpoint answered more
    assert len(clients[0].bodies) > len(clients[1].bodies)
    assert all(e.slots.inflight == 0 and e.slots.outstanding_tokens == 0 for e in eps)


@pytest.mark.parametrize(
    ("settings", "bound"),
    [({"order": "file"}, 64), ({"lookahead": 100}, 64 + 100), ({"lookahead": 0}, 64)],
)
async def test_memory_window_bounds_what_is_read(
    tmp_path: Path, settings: dict[str, object], bound: int
) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(600)])
    seen: list[int] = []
    client = FakeClient(0.002)
    ep = endpoint(0, client, limit=2)
    original = client.chat

    async def chat(request: object) -> list[object]:
        seen.append(d_ref[0].pending)
        return await original(request)  # type: ignore[arg-type]

    client.chat = chat  # type: ignore[method-assign,assignment]
    d_ref: list[object] = []
    from draftdata.generate.engine import dispatch as dispatch_mod

    init = dispatch_mod.Dispatcher.__init__

    def capture(self: object, *a: object, **k: object) -> None:
        init(self, *a, **k)  # type: ignore[arg-type]
        d_ref.append(self)

    dispatch_mod.Dispatcher.__init__ = capture  # type: ignore[method-assign]
    try:
        _, sink = await run_dispatch(cfg(**settings), [ep], prompts)
    finally:
        dispatch_mod.Dispatcher.__init__ = init  # type: ignore[method-assign]
    assert len(sink.completions) == 600
    # the window (64, plus the look-ahead when ordering) plus at most one read batch
    assert bound <= max(seen) <= bound + 128


async def test_retry_moves_to_another_endpoint_then_exhausts(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(4)])
    bad = FakeClient(fail_all=RetryableServerError)
    good = FakeClient()
    _, sink = await run_dispatch(
        cfg(), [endpoint(0, bad, breaker_failures=99), endpoint(1, good)], prompts
    )
    assert len(sink.completions) == 4 and not sink.failures
    assert all(c.endpoint == "http://fake-1:8000" for c in sink.completions)
    only_bad = FakeClient(fail_all=RequestTimeoutError)
    _, sink = await run_dispatch(
        cfg(max_attempts=3), [endpoint(0, only_bad, breaker_failures=99)], prompts
    )
    assert {f.reason for f in sink.failures} == {"exhausted_retries"} and len(sink.failures) == 4
    assert len(only_bad.bodies) == 12 and all(f.attempts == 3 for f in sink.failures)


async def test_fatal_errors_are_not_retried(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(3)])
    client = FakeClient(fail={2: ContextLengthError})
    _, sink = await run_dispatch(cfg(), [endpoint(0, client, limit=1)], prompts)
    assert [f.reason for f in sink.failures] == ["context_length"]
    assert len(client.bodies) == 3 and len(sink.completions) == 2


async def test_breaker_takes_endpoint_out_and_requeues_its_work(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(30)])
    flaky = FakeClient(0.01, fail={i: ConnectionLostError for i in range(1, 4)})
    slow_ok = FakeClient(0.05)
    eps = [endpoint(0, flaky, breaker_failures=3), endpoint(1, slow_ok)]
    _, sink = await run_dispatch(cfg(), eps, prompts, alive=True)
    assert len(sink.completions) == 30 and not sink.failures
    assert eps[0].breaker.state == "down" and eps[0].breaker.downs == 1
    assert Counter(c.id for c in sink.completions).most_common(1)[0][1] == 1


async def test_server_without_n_gets_one_request_per_sample(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(5)])
    client = FakeClient(max_n=1)
    ep = endpoint(0, client)
    _, sink = await run_dispatch(cfg(n=3), [ep], prompts)
    assert Counter((c.id, c.sample) for c in sink.completions) == Counter(
        (f"p{i}", s) for i in range(5) for s in range(3)
    )
    assert not ep.server_n
    with_n = FakeClient()
    _, sink = await run_dispatch(cfg(n=3), [endpoint(0, with_n)], prompts)
    assert len(with_n.bodies) == 5 and all(b["n"] == 3 for b in with_n.bodies)
    assert len(sink.completions) == 15


async def test_resume_skips_settled_samples(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(3)])
    client = FakeClient()
    d, sink = await run_dispatch(
        cfg(n=2), [endpoint(0, client)], prompts, done={("p0", 0), ("p0", 1), ("p1", 0)}
    )
    assert sorted((c.id, c.sample) for c in sink.completions) == [("p1", 1), ("p2", 0), ("p2", 1)]
    assert d.already_done == 3


async def test_multi_turn_feeds_back_own_answers_in_order(tmp_path: Path) -> None:
    row = {
        "id": "m",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "original answer"},
            {"role": "user", "content": "second"},
        ],
    }
    prompts = write(tmp_path / "p.jsonl", [row])
    for keep in (False, True):
        client = FakeClient()
        _, sink = await run_dispatch(
            cfg(keep_reasoning_history=keep), [endpoint(0, client)], prompts
        )
        first, second = client.bodies
        assert [m["content"] for m in first["messages"]] == ["sys", "first"]
        msgs = second["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
        assert msgs[2]["content"] == "answer 0 to first"
        assert ("reasoning_content" in msgs[2]) == keep
        (c,) = sink.completions
        assert [t.content for t in c.turns] == ["answer 0 to first", "answer 0 to second"]
        assert c.usage.completion_tokens == 20


async def test_multi_turn_retry_continues_from_the_failed_turn(tmp_path: Path) -> None:
    row = {
        "id": "m",
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "second"},
        ],
    }
    prompts = write(tmp_path / "p.jsonl", [row])
    client = FakeClient(fail={2: RetryableServerError})
    _, sink = await run_dispatch(cfg(), [endpoint(0, client)], prompts)
    # turn 1, turn 2 (fails), turn 2 again: the first turn is not asked twice
    assert [b["messages"][-1]["content"] for b in client.bodies] == ["first", "second", "second"]
    assert sink.completions[0].attempts == 2


async def test_hedging_commits_one_answer(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(6)])
    slow = FakeClient(2.0)
    fast = FakeClient(0.01)
    eps = [endpoint(0, slow, limit=6), endpoint(1, fast, limit=1)]
    # speeds unknown at first (greedy placement sends most to the slow one); once the fast
    # one answers, the slow one is known to decode 1 token/s: copies there pay
    original = fast.chat

    async def chat(request: object) -> list[object]:
        eps[0].meter.seq_rate = 1.0
        return await original(request)  # type: ignore[arg-type]

    fast.chat = chat  # type: ignore[method-assign,assignment]
    d, sink = await run_dispatch(cfg(hedge=True, hedge_min_age=0.05), eps, prompts)
    assert Counter(c.id for c in sink.completions) == Counter(f"p{i}" for i in range(6))
    assert d.hedges >= 1 and d.hedges_won >= 1
    assert d.hedges == d.hedges_won + d.hedges_wasted
    assert all(e.slots.inflight == 0 for e in eps)


_BUGS = [RuntimeError("Session is closed"), KeyError("x"), AttributeError("y"), TypeError("z")]


@settings(max_examples=12, deadline=None)
@given(bug=st.sampled_from(_BUGS), at=st.integers(1, 6), limit=st.integers(1, 3))
def test_an_unmapped_exception_stops_the_run_with_its_traceback(
    bug: Exception, at: int, limit: int
) -> None:
    """An exception that is no ServerError is not a server's answer but a bug (errors.py):
    it is never retried as a malformed answer. The run stops with it, its traceback reaching
    where it was raised; what was answered before is kept, nothing is recorded as failed, and
    no other request is sent after it."""
    with tempfile.TemporaryDirectory() as tmp:
        prompts = write(Path(tmp) / "p.jsonl", [user(i) for i in range(12)])
        client = FakeClient(0.001)
        original = client.chat
        calls = [0]

        async def chat(request: object) -> list[object]:
            calls[0] += 1
            if calls[0] == at:
                raise bug
            return await original(request)  # type: ignore[arg-type]

        client.chat = chat  # type: ignore[method-assign,assignment]
        ep = endpoint(0, client, limit=limit)
        d, sink = dispatcher(cfg(), [ep], prompts)
        with pytest.raises(type(bug)) as info:
            asyncio.run(asyncio.wait_for(d.run(), 20))
        assert info.value is bug
        assert "chat" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert not sink.failures and not ep.meter.errors  # not a server's fault
        assert len(sink.completions) >= at - limit  # what finished before is kept
        assert calls[0] <= at + limit - 1  # stopped: nothing sent after the bug
        assert d.retries == 0 and ep.slots.inflight == 0


async def test_shared_prefixes_are_steered_to_one_endpoint_with_room(tmp_path: Path) -> None:
    rows = []
    for i in range(12):
        system = "You are a tool-using agent." if i % 2 else "You are a mathematician."
        rows.append(
            {
                "id": f"p{i}",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"q{i}"},
                ],
            }
        )
    prompts = write(tmp_path / "p.jsonl", rows)
    eps = [endpoint(i, FakeClient(0.01), limit=16) for i in range(3)]
    _, sink = await run_dispatch(cfg(), eps, prompts)
    where: dict[str, set[str]] = {}
    for c in sink.completions:
        where.setdefault(c.messages[0].content or "", set()).add(c.endpoint)
    assert len(sink.completions) == 12
    assert all(len(urls) == 1 for urls in where.values()), where  # each prefix stayed put
    _, sink = await run_dispatch(cfg(prefix_steering=False), eps, prompts)
    assert len({c.endpoint for c in sink.completions}) == 3  # without it: spread by free slots


def test_sample_k_sends_seed_plus_k() -> None:
    """Multi-turn prompts are one job per sample, each with its own seed; a job for all samples
    at once sends the seed itself; no seed stays no seed."""
    from draftdata.generate.config import Sampling
    from draftdata.generate.engine.work import plan

    multi = Prompt(
        id="m",
        messages=[Message(role="user", content="a"), Message(role="user", content="b")],
    )
    single = Prompt(id="s", messages=[Message(role="user", content="a")])
    seeded = cfg(n=3, sampling=Sampling(seed=10))
    jobs, _ = plan(multi, seeded, lambda _i, _s: False)
    assert [(j.samples, j.request_sampling.seed) for j in jobs] == [
        ([0], 10),
        ([1], 11),
        ([2], 12),
    ]
    (whole,), _ = plan(single, seeded, lambda _i, _s: False)
    assert whole.request_sampling.seed == 10
    assert [j.request_sampling.seed for j in whole.split()] == [10, 11, 12]
    (rest,), _ = plan(single, seeded, lambda _i, s: s == 0)  # sample 0 already settled
    assert rest.samples == [1, 2] and rest.request_sampling.seed == 11
    (unseeded,), _ = plan(single, cfg(n=3), lambda _i, _s: False)
    assert [j.request_sampling.seed for j in unseeded.split()] == [None, None, None]


class _CountingEvent(asyncio.Event):
    """An asyncio.Event that counts the dispatcher's loop passes (one ``clear`` each)."""

    passes = 0

    def clear(self) -> None:
        type(self).passes += 1
        super().clear()


class _FirstHeld(FakeClient):
    """Request 1 arrives (``sent``) and fails, retryably, when the test lets it (``release``);
    the others answer at once."""

    def __init__(self) -> None:
        super().__init__(fail={1: RetryableServerError})
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    async def chat(self, request: Request) -> list[Turn]:
        if not self.sent.is_set():
            self.sent.set()
            await self.release.wait()
        return await super().chat(request)


async def test_a_paused_dispatcher_does_not_spin_on_a_due_retry(tmp_path: Path) -> None:
    """While the engine pauses dispatch (the store holds too many records), a retry that is due
    cannot be promoted: the loop must wait for a wake-up, not pass with a zero timeout (the old
    code ran ~125,000 passes a second for as long as a store outage lasted)."""
    from tests.unit.generate.fakes import dispatcher

    prompts = write(tmp_path / "p.jsonl", [user(i) for i in range(2)])
    client = _FirstHeld()
    config = GenerateConfig(prompts="x", endpoints=["x"], out="x", hedge=False, backoff_base=0.01)
    now = [0.0]  # the dispatcher's clock: the retry falls due when the test says
    d, sink = dispatcher(config, [endpoint(0, client, limit=1)], prompts, clock=lambda: now[0])
    d.wake = _CountingEvent()
    task = asyncio.create_task(d.run())
    await asyncio.wait_for(client.sent.wait(), 10)
    d.paused = True  # the engine's state while the store is down
    client.release.set()  # request 1 fails: its retry waits out its backoff
    await until("request 1 backs off", lambda: d.waiting and not d.running)
    now[0] += 60.0  # ... and is due, and cannot be sent
    d.wake.set()  # a pass sees it due (an answer, the engine, its own timer would wake it)
    await until("a pass after the retry fell due", lambda: not d.wake.is_set())
    before = _CountingEvent.passes
    # a spinning loop passes once or twice per turn of the event loop; a waiting one only on
    # its 20 ms timer, which a thousand turns (~10 ms here) reach a few times at most
    for _ in range(1000):
        await asyncio.sleep(0)
    paused_passes = _CountingEvent.passes - before
    d.paused = False
    d.wake.set()
    await asyncio.wait_for(task, 10)
    assert paused_passes < 100, paused_passes
    assert {c.id for c in sink.completions} == {"p0", "p1"}
