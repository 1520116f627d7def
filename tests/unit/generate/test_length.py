"""Length-aware scheduling: the length model, the look-ahead order, tail placement, hedging."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import cfg, endpoint, run_dispatch, write

from draftdata.generate.endpoint import Endpoint
from draftdata.generate.length import (
    LengthModel,
    LookAhead,
    prompt_tokens,
    run_history,
    token_cap,
)
from draftdata.generate.placement import BLIND_HEDGE_S, TailPlan, hedge_pays, job_cap
from draftdata.generate.work import Job
from draftdata.records import Completion, Message, Prompt, Turn, Usage

LENGTHS = {"math": 600, "code": 300, "general": 150, "tool": 30}


def job(domain: str = "", text: str = "q", max_tokens: int = 1000, pid: str = "a") -> Job:
    p = Prompt(id=pid, domain=domain, messages=[Message(role="user", content=text)])
    return Job(
        p,
        [0],
        [p.messages],
        sampling=cfg().sampling,
        max_tokens=max_tokens,
        reasoning="server",
        prefix=None,
        cost=len(text) // 4 + max_tokens,  # as work.plan counts it
    )


class DomainClient:
    """Answers with the output length of the prompt's domain (named in its text), after
    ``per_token`` s per output token; records the order prompts arrive in."""

    def __init__(self, per_token: float = 0.0) -> None:
        self.per_token = per_token
        self.order: list[str] = []
        self.token_ids_supported: bool | None = None

    async def chat(self, body: dict[str, Any]) -> list[Turn]:
        text = body["messages"][-1]["content"]
        self.order.append(text)
        tokens = LENGTHS[text.split()[0]]
        await asyncio.sleep(self.per_token * tokens)
        usage = Usage(prompt_tokens=5, completion_tokens=tokens)
        return [Turn(content="a", finish_reason="stop", usage=usage)]

    async def close(self) -> None:
        pass


def mixed_rows(n: int) -> list[dict[str, Any]]:
    names = list(LENGTHS)
    return [
        {
            "id": f"p{i}",
            "domain": names[(i * 7) % len(names)],
            "messages": [{"role": "user", "content": f"{names[(i * 7) % len(names)]} q{i}"}],
        }
        for i in range(n)
    ]


# -- the model --------------------------------------------------------------------------------


def test_model_learns_each_domain_and_keeps_the_cap() -> None:
    m = LengthModel()
    prior = m.expect("s", "math", 10, 900)
    assert prior == 300  # a third of the cap before anything is known
    for _ in range(50):
        m.observe("s", "math", 10, 800)
        m.observe("s", "tool", 10, 20)
    assert 700 < m.expect("s", "math", 10, 900) <= 800
    assert m.expect("s", "tool", 10, 900) < 60
    assert m.expect("s", "math", 10, 500) == 500  # never above the job's own cap
    # an unseen domain starts from the run's mean, not from the prior
    assert 300 < m.expect("s", "general", 10, 900) < 500


def test_model_uses_prompt_length_within_a_domain() -> None:
    m = LengthModel()
    for _ in range(40):
        m.observe("s", "d", 20, 100)
        m.observe("s", "d", 2000, 900)
    assert m.expect("s", "d", 2000, 4000) > 2 * m.expect("s", "d", 20, 4000)


def test_model_memory_is_bounded() -> None:
    m = LengthModel(max_keys=10)
    for i in range(1000):
        m.observe(f"s{i}", "d", i, 5)
    assert m.keys == 10
    assert m.expect("new", "d", 5, 100) < 33  # falls back to the run's mean


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 5000)), max_size=60))
def test_model_estimate_stays_within_zero_and_cap(obs: list[tuple[str, int]]) -> None:
    m = LengthModel()
    for domain, n in obs:
        m.observe("s", domain, n, n)
    for domain in "abcd":
        for cap in (1, 100, 9000):
            assert 0 <= m.expect("s", domain, 100, cap) <= cap


# -- the look-ahead ---------------------------------------------------------------------------


def test_lookahead_longest_first_ties_in_file_order_and_off_switch() -> None:
    m = LengthModel()
    for _ in range(20):
        m.observe("", "math", 0, 900)
        m.observe("", "tool", 0, 10)
    jobs = [job(d, pid=f"p{i}") for i, d in enumerate(["tool", "math", "tool", "math"])]
    on, off = LookAhead(m, ordered=True), LookAhead(m, ordered=False)
    for j in jobs:
        on.push(j)
        off.push(j)
    assert [on.pop().prompt.id for _ in range(4)] == ["p1", "p3", "p0", "p2"]
    assert [off.pop().prompt.id for _ in range(4)] == ["p0", "p1", "p2", "p3"]


def test_lookahead_rekeys_as_the_model_learns() -> None:
    m = LengthModel()
    q = LookAhead(m, ordered=True)
    jobs = [job(d, pid=f"p{i}") for i, d in enumerate(["tool", "math", "tool", "math"])]
    for j in jobs:
        q.push(j)  # all equal now: file order
    for _ in range(40):  # learnt while they wait
        m.observe("", "math", 0, 900)
        m.observe("", "tool", 0, 10)
    assert [q.pop().prompt.id for _ in range(4)] == ["p1", "p3", "p0", "p2"]


# -- in the dispatcher ------------------------------------------------------------------------


async def test_long_domains_go_first_once_learnt_and_order_is_deterministic(
    tmp_path: Path,
) -> None:
    prompts = write(tmp_path / "p.jsonl", mixed_rows(120))
    orders = []
    for _ in range(2):
        client = DomainClient()
        _, sink = await run_dispatch(cfg(), [endpoint(0, client, limit=1)], prompts)
        assert len(sink.completions) == 120
        orders.append(client.order)
    assert orders[0] == orders[1]  # same input, same seed: the same order
    # after a learning phase the rest goes longest-domain first
    later = [t.split()[0] for t in orders[0][40:]]
    ranks = [list(LENGTHS).index(x) for x in later]
    assert ranks == sorted(ranks)
    # with the off switch: file order
    client = DomainClient()
    await run_dispatch(cfg(order="file"), [endpoint(0, client, limit=1)], prompts)
    assert client.order == [r["messages"][0]["content"] for r in mixed_rows(120)]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ids=st.lists(st.integers(0, 40), min_size=1, max_size=80),
    limits=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    lookahead=st.integers(0, 50),
)
def test_ordering_keeps_exactly_once(
    tmp_path: Path, ids: list[int], limits: list[int], lookahead: int
) -> None:
    names = list(LENGTHS)
    rows = [
        {
            "id": f"p{i}",
            "domain": names[i % 4],
            "messages": [{"role": "user", "content": f"{names[i % 4]} {i}"}],
        }
        for i in ids
    ]
    prompts = write(tmp_path / "p.jsonl", rows)
    eps = [endpoint(k, DomainClient(0.00002 * (k + 1)), limit=n) for k, n in enumerate(limits)]
    _, sink = asyncio.run(run_dispatch(cfg(lookahead=lookahead), eps, prompts))
    assert Counter(c.id for c in sink.completions) == Counter(f"p{i}" for i in set(ids))


def test_history_of_a_run_seeds_the_model(tmp_path: Path) -> None:
    from draftdata.store.run import Run

    with Run.open(str(tmp_path / "run"), settings={"stage": "generate"}) as run:
        for i in range(30):
            d = "math" if i % 2 else "tool"
            run.add_completion(
                Completion(
                    id=f"p{i}",
                    domain=d,
                    messages=[Message(role="user", content="q")],
                    turns=[Turn(content="a", finish_reason="stop")],
                    usage=Usage(completion_tokens=LENGTHS[d]),
                )
            )
        run.flush()
        rows = list(run_history(run.store))
        assert len(list(run_history(run.store, rows=7))) == 7
    assert sorted(rows) == sorted(
        ("", "math" if i % 2 else "tool", LENGTHS["math" if i % 2 else "tool"]) for i in range(30)
    )
    m = LengthModel()
    for s, d, n in rows:
        m.observe(s, d, None, n)
    assert m.expect("", "math", 5, 4000) > 4 * m.expect("", "tool", 5, 4000)


# -- tail placement and hedging ---------------------------------------------------------------


class _D:
    """The parts of a Dispatcher a TailPlan reads."""

    def __init__(self, endpoints: list[Endpoint], queued: int) -> None:
        self.endpoints = endpoints
        self.queued = queued
        self.lengths = LengthModel()
        self.fresh = LookAhead(self.lengths, ordered=True)
        self.on_endpoint: dict[Endpoint, set[Any]] = {e: set() for e in endpoints}

    def cap(self, job: Job) -> int:
        return job_cap(job, self.endpoints)


def test_speed_plan_holds_long_work_for_the_fast_server() -> None:
    from draftdata.generate.work import Copy

    fast, slow = endpoint(0, DomainClient(), limit=2), endpoint(1, DomainClient(), limit=2)
    fast.meter.seq_rate, slow.meter.seq_rate = 100.0, 50.0
    d = _D([fast, slow], queued=3)
    # the fast server is full; its copies (expected 333 tokens: 3.3 s) are near their end
    for k in range(2):
        c = Copy(job(pid=f"r{k}"), fast, hedge=False, seqs=1, started=0.0)
        d.on_endpoint[fast].add(c)
        fast.acquire(1, 0)
    plan = TailPlan.make(d, now=3.0)
    assert plan is not None
    # 1000 expected tokens: 10 s on fast after ~0.3 s, 20 s on slow: held for fast
    assert plan.place(job(max_tokens=3000), slow, 1000.0) is None
    assert plan.place(job(max_tokens=3000), slow, 1000.0) is None
    # fast's two slots are now promised until ~10.3 s; a short job goes to slow at once
    assert plan.place(job(), slow, 20.0) is slow
    # no plan while the slow server has no free slot: a free fast slot is the place to go
    slow.acquire(2, 0)
    assert TailPlan.make(d, now=3.0) is None  # type: ignore[arg-type]
    slow.release(2, 0)
    # far from the end of the job (the queue drains long after a long answer on the slow
    # server would end) there is no plan either
    for _ in range(10):
        d.lengths.observe("", "", 10, 1000, 3000)
    d.queued = 10_000
    assert TailPlan.make(d, now=3.0) is None  # type: ignore[arg-type]
    d.queued = 3
    assert TailPlan.make(d, now=3.0) is not None  # type: ignore[arg-type]
    # with equal speeds there is no plan: greedy placement
    slow.meter.seq_rate = 95.0
    assert TailPlan.make(d, now=3.0) is None


def test_a_busy_slot_past_its_expected_length_is_never_a_free_one() -> None:
    """A copy that has run past its expected length (and its cap) still holds its slot: the
    plan must not send a job to a full endpoint (the old plan counted such a slot as free now
    and pushed the endpoint past its concurrency limit)."""
    from draftdata.generate.work import Copy

    fast, slow = endpoint(0, DomainClient(), limit=1), endpoint(1, DomainClient(), limit=1)
    fast.meter.seq_rate, slow.meter.seq_rate = 100.0, 50.0
    d = _D([fast, slow], queued=1)
    c = Copy(job(pid="long"), fast, hedge=False, seqs=1, started=0.0)
    d.on_endpoint[fast].add(c)
    fast.acquire(1, 0)
    plan = TailPlan.make(d, now=100.0)  # 10,000 tokens produced, cap 1,000
    assert plan is not None and fast.free == 0
    assert plan.place(job(pid="next"), slow, 100.0) is not fast


def test_the_context_filling_default_caps_a_job_at_the_fleet_context() -> None:
    """With no --max-tokens a request may fill the endpoint's context: the hedge and placement
    rules must not take the 4096 fallback in the job's cost for its cap."""
    a, b = endpoint(0, DomainClient()), endpoint(1, DomainClient())
    a.context_length, b.context_length = 8192, 32768
    d = _D([a, b], queued=1)
    auto = job(max_tokens=4096)
    auto.max_tokens = None  # as work.plan builds it without --max-tokens
    assert d.cap(auto) == 32768
    assert d.cap(job(max_tokens=1000)) == 1000


def test_hedge_pays_only_when_the_copy_should_win() -> None:
    m = LengthModel()
    slow, fast = endpoint(0, DomainClient()), endpoint(1, DomainClient())
    slow.meter.seq_rate, fast.meter.seq_rate = 10.0, 20.0
    # just started, 1000 expected: copy 50 s vs original ~99 s -> pays
    assert hedge_pays(1.0, 1000, 4000, slow, fast, m)
    # 700 of ~1050 done on a 2x slower server: the copy would finish later
    assert not hedge_pays(70.0, 1000, 4000, slow, fast, m)
    # never onto a server that is not faster
    assert not hedge_pays(1.0, 1000, 4000, fast, slow, m)
    assert not hedge_pays(1.0, 1000, 4000, slow, slow, m)
    # past its cap by half again: stuck, any copy beats it
    assert hedge_pays(700.0, 1000, 4000, slow, slow, m)
    # nothing known about speeds: only a request far past the usual latency
    a, b = endpoint(2, DomainClient()), endpoint(3, DomainClient())
    assert not hedge_pays(5.0, 1000, 4000, a, b, m)
    a.meter.latency = 1.0
    assert hedge_pays(5.0, 1000, 4000, a, b, m)


def test_a_request_on_a_server_that_never_answered_is_hedged_in_bounded_time() -> None:
    """Issue 24: a server that passes /health but never answers (or trickles) has no rate and
    no latency; its requests are still copied onto an idle server, judged by that server."""
    m = LengthModel()
    wedged, good = endpoint(0, DomainClient()), endpoint(1, DomainClient())
    good.meter.seq_rate, good.meter.latency = 100.0, 2.0
    # 400 tokens (before any spread is learnt, the long draw is the estimate) take 4 s at the
    # target's rate: not before twice that
    assert not hedge_pays(7.0, 400, 4000, wedged, good, m)
    assert hedge_pays(9.0, 400, 4000, wedged, good, m)
    good.meter.seq_rate = None  # only a latency known: three of them
    assert not hedge_pays(5.0, 200, 4000, wedged, good, m)
    assert hedge_pays(7.0, 200, 4000, wedged, good, m)
    good.meter.latency = None  # nothing measured anywhere: a minute
    assert not hedge_pays(BLIND_HEDGE_S - 1, 200, 4000, wedged, good, m)
    assert hedge_pays(BLIND_HEDGE_S + 1, 200, 4000, wedged, good, m)


def test_a_request_past_its_estimate_is_expected_to_run_on() -> None:
    m = LengthModel()
    for i in range(400):  # one key: half the answers 50 tokens, half 150
        m.observe("s", "d", 10, 50 if i % 2 else 150, 10_000)
    expected = m.expect("s", "d", 10, 10_000)
    assert 90 < expected < 110
    assert m.expected_total(expected, 0, 10_000) == pytest.approx(expected, rel=0.15)
    # past 60 tokens only the long half is left: ~150 expected in all
    assert m.expected_total(expected, 60, 10_000) == pytest.approx(150, rel=0.1)
    assert m.expected_total(expected, 60, 120) == 120  # never past the cap
    assert m.expected_total(expected, 400, 10_000) >= 400
    # so a 2x faster server pays for a request 60 tokens in (copy 75 s vs ~90 s left)...
    slow, fast = endpoint(0, DomainClient()), endpoint(1, DomainClient())
    slow.meter.seq_rate, fast.meter.seq_rate = 1.0, 2.0
    assert hedge_pays(60.0, expected, 10_000, slow, fast, m)
    # ...but not for one 80 tokens in (copy 75 s vs ~70 s left)
    assert not hedge_pays(80.0, expected, 10_000, slow, fast, m)


async def test_no_hedges_between_equal_servers(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", mixed_rows(40))
    eps = [endpoint(k, DomainClient(0.0002), limit=4) for k in range(2)]
    d, sink = await run_dispatch(cfg(hedge=True, hedge_min_age=0.01), eps, prompts)
    assert len(sink.completions) == 40
    assert d.hedges == 0 == d.hedges_wasted


@given(st.integers(0, 1 << 16), st.integers(1, 10_000))
def test_memoised_estimate_is_the_estimate(chars: int, max_tokens: int) -> None:
    m = LengthModel()
    for n in (20, 200, 2000, 20000):
        m.observe("s", "d", n, n // 10 + 1, 10_000)
    j = job("d", text="x" * (4 * chars), max_tokens=max_tokens)
    j.cost = chars + max_tokens  # what work.plan puts there: prompt tokens + the token cap
    j.prompt = Prompt(id="a", source="s", domain="d", messages=j.prompt.messages)
    assert prompt_tokens(j) == chars
    assert token_cap(j) == max_tokens
    assert m.expect_job(j) == m.expect("s", "d", chars, max_tokens)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), sigma=st.floats(0.3, 1.2), cap=st.integers(200, 4000))
def test_long_draw_lies_between_the_expectation_and_the_cap(
    seed: int, sigma: float, cap: int
) -> None:
    m = LengthModel()
    rng = random.Random(seed)
    mu = math.log(192) - sigma * sigma / 2
    for _ in range(500):
        m.observe("s", "d", 10, min(cap, max(1, round(rng.lognormvariate(mu, sigma)))), cap)
    e = m.expect("s", "d", 10, cap)
    for produced in (min(cap, f * e) for f in (0.0, 0.5, 1.0, 2.0, 4.0)):
        low = m.long_total(e, produced, cap, 0.5)
        high = m.long_total(e, produced, cap, 0.9)
        assert produced <= low <= high <= cap
        assert high >= min(cap, m.expected_total(e, produced, cap)) * 0.8


def test_hedges_are_judged_on_a_long_draw() -> None:
    """Long-tailed lengths (the job's shape): a request 200 tokens into a 2x slower server is
    expected to end at ~310 tokens, where the copy would lose, but the requests that end a job
    late are the long draws (~550), where the copy wins: it is hedged. Past half the long
    draw it is not."""
    m = LengthModel()
    rng = random.Random(3)
    mu = math.log(192) - 0.32
    for _ in range(2000):
        m.observe("s", "d", 10, min(580, round(rng.lognormvariate(mu, 0.8))), 580)
    e = m.expect("s", "d", 10, 580)
    slow, fast = endpoint(0, DomainClient()), endpoint(1, DomainClient())
    slow.meter.seq_rate, fast.meter.seq_rate = 1.0, 2.0
    total = m.expected_total(e, 200, 580)
    assert total / 2 > total - 200  # on the expectation alone the copy would lose
    assert m.long_total(e, 200, 580) > 400
    assert hedge_pays(200.0, e, 580, slow, fast, m)
    assert not hedge_pays(300.0, e, 580, slow, fast, m)
    assert not hedge_pays(200.0, e, 580, fast, slow, m)  # never onto a slower server
