"""Length-aware scheduling: the length model, the queue's order, tail placement, hedging."""

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

from draftdata.generate.engine.length import (
    LengthModel,
    LengthPriors,
    known_lengths,
    prompt_tokens,
    prompts_folder,
    run_history,
    token_cap,
)
from draftdata.generate.engine.placement import BLIND_HEDGE_S, TailPlan, hedge_pays, job_cap
from draftdata.generate.engine.queue import JobQueue
from draftdata.generate.engine.request import Request
from draftdata.generate.engine.work import Job
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

    async def chat(self, request: Request) -> list[Turn]:
        text = request.messages[-1].content or ""
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
    on, off = JobQueue(m, ordered=True), JobQueue(m, ordered=False)
    for j in jobs:
        on.push(j)
        off.push(j)
    assert [on.pop().prompt.id for _ in range(4)] == ["p1", "p3", "p0", "p2"]
    assert [off.pop().prompt.id for _ in range(4)] == ["p0", "p1", "p2", "p3"]


def test_lookahead_rekeys_as_the_model_learns() -> None:
    m = LengthModel()
    q = JobQueue(m, ordered=True)
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


def _learnt(m: LengthModel, n: int = 40) -> None:
    """``m`` knows each domain of LENGTHS well (and the spread: none)."""
    for _ in range(n):
        for d, tokens in LENGTHS.items():
            m.observe("", d, 0, tokens, 1000)


def test_tail_plan_gives_a_slow_server_ever_shorter_jobs() -> None:
    """Near the end a server half as fast takes only the jobs it can finish by the time the
    fleet is expected to finish anyway; the fast one is never limited."""
    fast, slow = endpoint(0, DomainClient(), limit=10), endpoint(1, DomainClient(), limit=10)
    fast.meter.seq_rate, slow.meter.seq_rate = 100.0, 50.0
    m = LengthModel()
    _learnt(m)
    q = JobQueue(m, ordered=True)
    for i in range(4):
        for d in LENGTHS:
            q.push(job(d, pid=f"{d}{i}"))
    plan = TailPlan.make([fast, slow], q, m, {}, read_all=True, now=0.0)
    assert plan is not None and plan.budget(fast) is None
    budget = plan.budget(slow)
    assert budget is not None
    # the queue holds 4 x 1,080 tokens for 1,500 tok/s (~2.9 s), plus the last tool answer
    # on the fast server: the slow one may start what it finishes in ~3.2 s (~160 tokens)
    assert 120 < budget < 220, budget
    assert not plan.fits(job("math"), slow) and not plan.fits(job("code"), slow)
    assert plan.fits(job("tool"), slow)
    assert plan.fits(job("math"), fast)
    got = q.pop_fitting(lambda j: plan.fits(j, slow))
    assert got is not None and got.prompt.domain in ("general", "tool")
    # far from the end (prompts still unread), similar speeds, an unmeasured rate: no plan
    assert TailPlan.make([fast, slow], q, m, {}, read_all=False, now=0.0) is None
    slow.meter.seq_rate = 80.0
    assert TailPlan.make([fast, slow], q, m, {}, read_all=True, now=0.0) is None
    slow.meter.seq_rate = None
    assert TailPlan.make([fast, slow], q, m, {}, read_all=True, now=0.0) is None


async def test_a_slow_server_starts_no_long_answer_at_the_end(tmp_path: Path) -> None:
    """Through the dispatcher, on a generated mix: the last job the half-speed endpoint
    starts is never one of the long domains, and every prompt is answered once."""
    prompts = write(tmp_path / "p.jsonl", mixed_rows(160))
    fast = endpoint(0, DomainClient(0.00004), limit=4)
    slow = endpoint(1, DomainClient(0.00008), limit=4)
    d, sink = await run_dispatch(cfg(hedge=False), [fast, slow], prompts)
    assert Counter(c.id for c in sink.completions) == Counter(f"p{i}" for i in range(160))
    slow_order = [t.split()[0] for t in slow.client.order]  # type: ignore[attr-defined]
    assert slow_order and slow_order[-1] not in ("math", "code"), slow_order[-8:]
    assert d.lengths.measured("", "tool") and d.lengths.measured("", "math")


def test_the_context_filling_default_caps_a_job_at_the_fleet_context() -> None:
    """With no --max-tokens a request may fill the endpoint's context: the hedge and placement
    rules must not take the 4096 fallback in the job's cost for its cap."""
    a, b = endpoint(0, DomainClient()), endpoint(1, DomainClient())
    a.context_length, b.context_length = 8192, 32768
    auto = job(max_tokens=4096)
    auto.max_tokens = None  # as work.plan builds it without --max-tokens
    assert job_cap(auto, [a, b]) == 32768
    assert job_cap(job(max_tokens=1000), [a, b]) == 1000


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


# -- the order, what is known before the run, resume -----------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    means=st.dictionaries(st.sampled_from("abcdefg"), st.integers(1, 3000), min_size=1),
    rows=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 3000), st.sampled_from([64, 512, 4096])),
        max_size=60,
    ),
)
def test_queue_pops_longest_expected_first_on_a_generated_mix(
    means: dict[str, int], rows: list[tuple[int, int, int]]
) -> None:
    """Whatever the mix of domains, prompt lengths and caps: the queue hands out the job
    expected to answer longest first, equal estimates in file order."""
    m = LengthModel()
    names = sorted(means)
    for _ in range(30):
        for d, mean in means.items():
            m.observe("", d, 10, mean, 4096)
    q = JobQueue(m, ordered=True)
    for i, (k, chars, cap) in enumerate(rows):
        q.push(job(names[k % len(names)], text="x" * chars, max_tokens=cap, pid=f"p{i:03d}"))
    got = []
    while q:
        j = q.pop()
        got.append((-m.expect_job(j), j.prompt.id))
    assert got == sorted(got)
    assert len(got) == len(rows)


def test_an_unmeasured_domain_is_neither_starved_nor_sent_last() -> None:
    """A domain nothing is known about (no answer, no prior, nothing running) sends one prompt
    at once, ahead of the known long ones; from then on it ranks by what is known (the run's
    mean and what its running request produced), above the short domains."""
    m = LengthModel()
    for _ in range(40):
        m.observe("", "math", 0, 600, 1000)
        m.observe("", "tool", 0, 30, 1000)
    q = JobQueue(m, ordered=True)
    for i in range(10):
        q.push(job("math", pid=f"m{i}"))
        q.push(job("tool", pid=f"t{i}"))
    for i in range(5):
        q.push(job("new", pid=f"n{i}"))  # last in the file, and never seen
    first = q.pop()
    assert first.prompt.id == "n0"  # its measurement starts at once
    m.started("", "new", 0.0)
    order = [q.pop().prompt.id for _ in range(24)]
    assert [x for x in order if x.startswith("n")] == ["n1", "n2", "n3", "n4"]
    assert max(order.index(f"n{i}") for i in range(1, 5)) < min(
        order.index(f"t{i}") for i in range(10)
    )  # not last: before every short one


async def test_an_unmeasured_domain_is_measured_within_the_first_wave(tmp_path: Path) -> None:
    """Through the dispatcher: a domain that only appears at the end of a long look-ahead,
    with every other domain known before the run, still gets its first request sent in the
    first wave of requests."""
    rows = mixed_rows(80) + [
        {"id": f"x{i}", "domain": "general", "messages": [{"role": "user", "content": "general"}]}
        for i in range(3)
    ]
    known = LengthPriors(
        domains={d: (float(n), 50.0) for d, n in LENGTHS.items() if d != "general"}
    )
    for r in rows[:80]:
        if r["domain"] == "general":
            r["domain"] = "code"
            r["messages"][0]["content"] = "code " + r["messages"][0]["content"].split()[1]
    prompts = write(tmp_path / "p.jsonl", rows)
    client = DomainClient(0.00002)
    from tests.unit.generate.fakes import dispatcher

    d, sink = dispatcher(cfg(), [endpoint(0, client, limit=4)], prompts)
    d._priors = lambda: known
    d._seeded = False
    await asyncio.wait_for(d.run(), 20)
    assert len(sink.completions) == 83
    first_wave = [t.split()[0] for t in client.order[:4]]
    assert "general" in first_wave, first_wave
    assert first_wave.count("math") == 3  # the rest of the wave: the longest known


def _run_with_answers(path: Path, counts: dict[str, int]) -> Any:
    from draftdata.store.run import Run

    run = Run.open(str(path), settings={"stage": "generate"})
    i = 0
    for d, k in counts.items():
        for _ in range(k):
            run.add_completion(
                Completion(
                    id=f"h{i}",
                    domain=d,
                    messages=[Message(role="user", content="q")],
                    turns=[Turn(content="a", finish_reason="stop")],
                    usage=Usage(completion_tokens=LENGTHS[d] + (i % 7)),
                )
            )
            i += 1
    run.flush()
    return run


async def test_resume_keeps_the_learnt_lengths(tmp_path: Path) -> None:
    """A resumed run's first requests are already longest-first: its committed answers seed
    the model before anything is sent (and how they spread); a run whose answers cannot be
    read relearns them online and answers everything all the same."""
    run = _run_with_answers(tmp_path / "run", {"math": 30, "tool": 30, "code": 30, "general": 30})
    known = known_lengths(run.store, None, history=True)
    run.close()
    assert len(known.answers) == 120 and known.sources
    m = LengthModel()
    m.seed(known)
    assert m.ranks() and m.measured("", "math")  # it orders the first requests
    assert m.expect("", "math", 5, 4000) > 15 * m.expect("", "tool", 5, 4000)
    assert m.high_ratio(0.95) < 1.2  # the spread is learnt too (these answers vary little)

    prompts = write(tmp_path / "p.jsonl", mixed_rows(40))
    from tests.unit.generate.fakes import dispatcher

    for priors, first in ((lambda: known, "math"), (None, None)):
        client = DomainClient(0.00002)
        d, sink = dispatcher(cfg(), [endpoint(0, client, limit=4)], prompts)
        if priors is None:

            def broken() -> LengthPriors:
                raise OSError("unreadable")

            d._priors, d._seeded = broken, False
        else:
            d._priors, d._seeded = priors, False
        await asyncio.wait_for(d.run(), 20)
        assert Counter(c.id for c in sink.completions) == Counter(f"p{i}" for i in range(40))
        if first is not None:
            assert [t.split()[0] for t in client.order[:8]] == ["math"] * 8
            shown = d.figures.to_dict()["math"]
            assert shown["answers"] == 10
            assert shown["expected"] / 10 == pytest.approx(603, rel=0.05)  # known when sent


def test_lengths_known_from_a_forecast_and_from_prepare(tmp_path: Path) -> None:
    """A pilot's forecast.json (in the run) and prepare's report (beside the prompts) seed
    each domain; the pilot's measurement wins over prepare's estimate."""
    import json

    import msgspec

    from draftdata.store.forecast import FORECAST_FORMAT, Forecast, write_forecast
    from draftdata.store.opener import open_store

    run = open_store(str(tmp_path / "run"))
    write_forecast(
        run,
        msgspec.convert(
            {
                "format": FORECAST_FORMAT,
                "by_domain": {
                    "math": {"mean_output_tokens": 640.0, "pilot_completions": 12},
                    "(none)": {"mean_output_tokens": 90.0, "pilot_completions": 3},
                    "tool": {"mean_output_tokens": None, "pilot_completions": 0},
                },
            },
            Forecast,
        ),
    )
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "prompts-00000.jsonl").write_text("")
    (folder / "prepare_report.json").write_text(
        json.dumps(
            {
                "format": "draftdata.prepare_report/1",
                "lengths": {"tokens_per_row": {"math": 100.0, "code": 300.0}},
            }
        )
    )
    assert prompts_folder(str(folder)) == str(folder)
    assert prompts_folder(str(folder / "prompts-00000.jsonl")) == str(folder)
    assert prompts_folder(str(tmp_path / "mine.jsonl")) is None
    known = known_lengths(run, str(folder), history=False)
    assert known.domains == {"math": (640.0, 12.0), "": (90.0, 3.0), "code": (300.0, 4.0)}
    m = LengthModel()
    m.seed(known)
    assert (
        m.expect("s", "math", 5, 4000) > m.expect("s", "code", 5, 4000) > m.expect("s", "", 5, 4000)
    )
    # nothing there: nothing known, no error
    assert not known_lengths(open_store(str(tmp_path / "empty")), None, history=True)


def test_queue_parts_ready_first_then_fitting_then_backoff() -> None:
    """Ready jobs go before fresh ones (in their order); ``pop_fitting`` takes the first job
    in that order a predicate accepts; ``work`` counts every queued sample's expected tokens;
    due backoffs come back first in line."""
    m = LengthModel()
    _learnt(m)
    for ordered in (True, False):
        q = JobQueue(m, ordered=ordered)
        for i, d in enumerate(["tool", "math", "code", "tool"]):
            q.push(job(d, pid=f"f{i}"))
        multi = job("general", pid="n3")
        multi.samples = [0, 1, 2]
        q.push(multi)
        back = [job("agent", pid="r0"), job("math", pid="r1")]
        q.put_back(back)
        assert len(q) == 7 and q.fresh == 5
        expected = sum(LENGTHS[d] for d in ["tool", "math", "code", "tool", "math"])
        expected += 3 * LENGTHS["general"] + 0  # (agent: unknown to _learnt, its prior)
        assert q.work() == pytest.approx(expected + m.expect("", "agent", 0, 1000), rel=0.05)
        got = q.pop_fitting(lambda j: j.prompt.domain == "math")
        assert got is not None and got.prompt.id == "r1"  # ready first
        got = q.pop_fitting(lambda j: j.prompt.domain in ("tool", "code"))
        assert got is not None
        assert got.prompt.id == ("f2" if ordered else "f0")  # longest first / file order
        taken = got.prompt.id
        assert q.pop_fitting(lambda j: False) is None
        assert q.pop().prompt.id == "r0"
        q.later(job("code", pid="w0"), due=5.0)
        q.promote(4.0)
        assert [j.prompt.id for j in q.backing_off()] == ["w0"] and q.next_due() == 5.0
        q.promote(5.0)
        assert q.pop().prompt.id == "w0" and not list(q.backing_off())
        rest = []
        while q:
            rest.append(q.pop().prompt.id)
        assert sorted(rest) == sorted({"f0", "f1", "f2", "f3", "n3"} - {taken})
        if ordered:
            assert rest == ["f1", "n3", "f0", "f3"]


def test_a_slow_server_may_start_a_job_as_short_as_any_queued_when_hedging() -> None:
    """On a one-domain job every queued job is alike: with hedging the slower server keeps
    taking them (one that runs long is copied to a fast idle server once the queue is dry);
    without hedging it stops when a long draw no longer ends in time. A request running now
    that is expected to end late pushes the horizon out."""
    from draftdata.generate.engine.work import Copy

    fast, slow = endpoint(0, DomainClient(), limit=10), endpoint(1, DomainClient(), limit=10)
    fast.meter.seq_rate, slow.meter.seq_rate = 100.0, 50.0
    m = LengthModel()
    _learnt(m)
    q = JobQueue(m, ordered=True)
    for i in range(4):
        q.push(job("code", pid=f"c{i}"))
    hedged = TailPlan.make([fast, slow], q, m, {}, read_all=True, now=0.0)
    plain = TailPlan.make([fast, slow], q, m, {}, read_all=True, now=0.0, hedge=False)
    assert hedged is not None and plain is not None
    assert hedged.fits(job("code"), slow) and not plain.fits(job("code"), slow)
    assert not hedged.fits(job("math"), slow)  # longer than any queued: not that
    # a math answer running for 20 s on the fast server (2,000 tokens of a 4,000 cap, far past
    # its estimate): the fleet is not done before it, so the slow server has time
    running = Copy(job("math", max_tokens=4000, pid="m0"), fast, hedge=False, seqs=1, started=0.0)
    late = TailPlan.make(
        [fast, slow], q, m, {fast: [running]}, read_all=True, now=20.0, hedge=False
    )
    assert late is not None and late.fits(job("code"), slow)


def test_a_short_answer_moves_the_per_sequence_rate_little() -> None:
    """The rate is tokens over latency averaged apart: a 20-token answer whose latency is
    mostly prefill and queueing does not make a fast server look slow."""
    from draftdata.generate.engine.endpoint import Meter

    m = Meter()
    for _ in range(20):
        m.answered(0.0, 1000, 10, 10.0, 1)  # 100 tokens/s
    for _ in range(3):
        m.answered(0.0, 20, 10, 1.0, 1)  # 20 tokens/s, mostly waiting
    assert m.seq_rate is not None and m.seq_rate > 90  # an average of the rates: 78


def _fleet_stream(
    seed: int, mean: float, sigma: float, slots: int, horizon: float, rate: float, lanes: int
) -> tuple[list[tuple[float, int, int, float, int]], list[int]]:
    """Requests of one domain back to back on ``slots`` slots from time 0 to ``horizon`` (in
    mean request times), lognormal lengths (capped at 4x the mean), each slot on one of
    ``lanes`` endpoints (lane k decodes at ``rate / (k + 1)``): the events (time, 0 start / 1
    end, length, start time, lane) up to the horizon, and every started request's length."""
    rng = random.Random(seed)
    cap = int(4 * mean)
    mu = math.log(mean) - sigma**2 / 2
    end_at = horizon * mean / rate
    events: list[tuple[float, int, int, float, int]] = []
    started: list[int] = []
    for slot in range(slots):
        lane = slot % lanes
        speed = rate / (lane + 1)
        t = 0.0
        while t < end_at:
            length = min(cap, max(1, round(rng.lognormvariate(mu, sigma))))
            started.append(length)
            events.append((t, 0, length, t, lane))
            done = t + length / speed
            if done <= end_at:
                events.append((done, 1, length, t, lane))
            t = done
    events.sort()
    return events, started


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mean=st.sampled_from([30, 200, 1000, 4000]),
    sigma=st.floats(0.3, 1.1),
    slots=st.sampled_from([64, 200]),  # enough requests that a mean says something
    horizon=st.floats(2.0, 8.0),  # mean request times since the start
    lanes=st.sampled_from([1, 2, 4]),
)
def test_a_domain_mean_counts_its_running_requests(
    seed: int, mean: int, sigma: float, slots: int, horizon: float, lanes: int
) -> None:
    """Short answers finish first: while a domain's requests run, the answers in are its short
    ones. The estimate counts every request started (a running one for its expected length
    given what it produced at its endpoint's rate), so it lies near the mean of all of them,
    far nearer than the answers in (the old estimate: the answers in, or what the running ones
    produced, a lower bound: 20% low on average over these shapes, up to 43%)."""
    rate = 50.0
    events, lengths = _fleet_stream(seed, mean, sigma, slots, horizon, rate, lanes)
    speeds = {k: rate / (k + 1) for k in range(lanes)}
    mean_rate = sum(speeds.values()) / lanes
    cap = int(4 * mean)
    m = LengthModel()
    answers: list[int] = []
    for t, kind, length, start, lane in events:
        m.at(t, mean_rate, speeds)
        if kind == 0:
            m.started("s", "d", start, lane, cap)
            m.expect("s", "d", 100, cap)  # the dispatcher asks at every placement
        else:
            m.observe("s", "d", 100, length, cap)
            m.stopped("s", "d", start, lane)
            answers.append(length)
    end = horizon * mean / rate
    m.at(end, mean_rate, speeds)
    truth = sum(lengths) / len(lengths)
    got = m.expect("s", "d", 100, cap)
    seen = sum(answers) / len(answers) if answers else 0.0
    assert 0.7 * truth <= got <= 1.2 * truth
    assert abs(got - truth) <= max(0.6 * abs(seen - truth), 0.12 * truth)


def test_a_pilot_figure_is_not_undone_by_the_first_short_answers() -> None:
    """A pilot measured a domain at 400 tokens on average; the run sends 200 of its prompts at
    once and the first 60 answers back are the short ones (< 200). The estimate stays near
    the pilot's figure instead of dropping toward the short answers' mean."""
    m = LengthModel()
    m.seed(LengthPriors(domains={"math": (400.0, 30.0)}))
    rng = random.Random(3)
    mu = math.log(400) - 0.32
    lengths = sorted(min(1600, round(rng.lognormvariate(mu, 0.8))) for _ in range(200))
    for _ in range(200):
        m.started("s", "math", 0.0, 0, 1600)
    now = lengths[59] / 50.0  # the 60th shortest has just finished
    m.at(now, 50.0, {0: 50.0})
    for n in lengths[:60]:
        m.observe("s", "math", 100, n, 1600)
        m.stopped("s", "math", 0.0, 0)
    m.at(now + 1e-3, 50.0, {0: 50.0})
    short = sum(lengths[:60]) / 60
    got = m.expect("s", "math", 100, 1600)
    assert short < 200
    assert got > 330, (got, short)


@given(
    means=st.lists(st.floats(5.0, 5000.0), min_size=1, max_size=6),
    sources=st.booleans(),
)
def test_known_lengths_rank_prompts_only_when_they_differ(
    means: list[float], sources: bool
) -> None:
    """What is known before the run orders the first requests (they wait for the look-ahead)
    only when it tells prompts apart: two domains (or sources) whose means differ by more
    than 10%; one domain's figure, or alike ones, order nothing (no wait)."""
    m = LengthModel()
    assert not m.ranks()
    for i, mean in enumerate(means):
        if sources:
            m.seed(LengthPriors(answers=[(f"src{i}", "d", round(mean))] * 3))
        else:
            m.seed(LengthPriors(domains={f"d{i}": (mean, 30.0)}))
    rounded = [round(x) for x in means] if sources else means
    assert m.ranks() == (max(rounded) > 1.1 * min(rounded))


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),  # domain
            st.integers(0, 3),  # lane (-1 + this: -1 is the fleet's mean rate)
            st.integers(1, 4),  # samples of the request
            st.integers(1, 3000),  # its length
            st.integers(0, 50),  # started this many ticks in
            st.integers(1, 40),  # ran this many ticks
        ),
        max_size=60,
    )
)
def test_running_requests_leave_no_trace_once_ended(
    ops: list[tuple[str, int, int, int, int, int]],
) -> None:
    """Requests of any samples, lanes and overlaps start and end in any order: the estimate
    stays within (0, cap] throughout, and once every request has ended the model is the one
    its answers alone make (nothing of a running request is left behind)."""
    cap = 4000
    m, plain = LengthModel(), LengthModel()
    lanes = {0: 30.0, 1: 60.0, 2: 90.0}
    events = []
    for i, (*_, at, ran) in enumerate(ops):
        events.append((float(at), 0, i))
        events.append((float(at + ran), 1, i))
    for t, kind, i in sorted(events):
        domain, lane, seqs, length, at, _ = ops[i]
        m.at(t, 50.0, lanes)
        if kind == 0:
            m.started("s", domain, float(at), lane - 1, cap, seqs)
        else:
            for _ in range(seqs):
                m.observe("s", domain, 10, length, cap)
                plain.observe("s", domain, 10, length, cap)
            m.stopped("s", domain, float(at), lane - 1, seqs)
        for d in ("a", "b"):
            assert 0 < m.expect("s", d, 10, cap) <= cap
    for d in ("a", "b"):
        assert m.expect("s", d, 10, cap) == pytest.approx(plain.expect("s", d, 10, cap))
        assert not m.measured("s", d) or plain.measured("s", d)


def test_a_hedge_goes_to_the_next_fastest_server_when_the_fastest_is_held_out() -> None:
    """The fastest idle server may take no new work (held out for refusing what the others
    answer): the copy goes to the next fastest idle one where it still pays, not nowhere."""
    from draftdata.generate.engine.placement import Placement
    from draftdata.generate.engine.work import Copy

    m = LengthModel()
    rng = random.Random(3)
    mu = math.log(192) - 0.32
    for _ in range(2000):
        m.observe("s", "d", 10, min(580, round(rng.lognormvariate(mu, 0.8))), 580)
    slow, fastest, fast = (endpoint(i, DomainClient()) for i in range(3))
    slow.meter.seq_rate, fastest.meter.seq_rate, fast.meter.seq_rate = 1.0, 3.0, 2.0
    place = Placement([slow, fastest, fast], m, hedge_min_age=1.0)
    running = job("d", max_tokens=580, pid="r0")
    running.copies.append(Copy(running, slow, hedge=False, seqs=1, started=0.0))
    assert place.hedges([running], 200.0) == [(running, fastest)]
    assert place.hedges([running], 200.0, lambda e: e is not fastest) == [(running, fast)]
    assert place.hedges([running], 200.0, lambda e: e is slow) == []
