"""The forecast's arithmetic (``generate/plan/forecast.py``) and the saturated-rate measurement
(``generate/plan/saturation.py``) on controlled inputs."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.generate.plan.forecast import MIN_PILOT, Outcome, forecast, forecast_lines, gpu_count
from draftdata.generate.plan.pilot_sample import PilotSample, PilotSpec
from draftdata.generate.plan.saturation import Saturation, Throughput, spread_tokens

KEYS = ("prompts", "mean_output_tokens", "p90_output_tokens", "cut_share", "output_tokens")


def _sample(drawn: dict[tuple[str, str], list[str]], strata: dict[tuple[str, str], int]) -> Any:
    ids = frozenset(i for v in drawn.values() for i in v)
    return PilotSample(PilotSpec(fraction=0.1), 3, ids, strata, drawn)


def _throughput(rate: float | None, overhead: float = 2.0, drain: float = 5.0) -> Throughput:
    return Throughput(rate, [], drain, overhead, 30.0, [])


def test_keys_and_arithmetic() -> None:
    # two strata of code (different sources), one of math; lengths known exactly
    strata = {("a", "code"): 400, ("b", "code"): 200, ("a", "math"): 400}
    drawn = {("a", "code"): [f"ac{i}" for i in range(40)],
             ("b", "code"): [f"bc{i}" for i in range(20)],
             ("a", "math"): [f"am{i}" for i in range(40)]}  # fmt: skip
    out = Outcome()
    for i in range(40):
        out.add(("a", "code"), 100, False)
        out.add(("a", "math"), 1000 if i < 36 else 2000, i >= 36)
    for _ in range(20):
        out.add(("b", "code"), 300, False)
    left = {("a", "code"): 360, ("b", "code"): 180, ("a", "math"): 360}
    fc = forecast(
        _sample(drawn, strata),
        out,
        left,
        left,
        committed={"code": 40 * 100 + 20 * 300, "math": 36 * 1000 + 4 * 2000},
        committed_active_s=12.0,
        throughput=_throughput(1000.0),
        gpus=8,
        endpoints=4,
    )
    rest = 360 * 100 + 180 * 300 + 360 * 1100
    assert fc.output_tokens == rest
    assert fc.run_output_tokens == rest + 10_000 + 44_000
    assert fc.wall_s == pytest.approx(2.0 + 5.0 + rest / 1000.0, abs=0.1)
    assert fc.gpu_hours == pytest.approx(8 * fc.wall_s / 3600, abs=1e-3)
    assert set(fc.by_domain) == {"code", "math"}
    for d in fc.by_domain.values():
        assert all(k in msgspec.to_builtins(d) for k in KEYS)  # the file's keys
    code, math = fc.by_domain["code"], fc.by_domain["math"]
    assert code.prompts == 600 and math.prompts == 400
    assert code.mean_output_tokens == pytest.approx((40 * 100 + 20 * 300) / 60, abs=0.1)
    assert math.mean_output_tokens == 1100 and math.p90_output_tokens == 1100.0
    assert math.cut_share == 0.1 and code.cut_share == 0
    assert code.output_tokens == 10_000 + 360 * 100 + 180 * 300
    assert math.output_tokens == 44_000 + 360 * 1100
    assert code.share + math.share == pytest.approx(1.0, abs=1e-3)
    # the intervals hold the point estimates
    for key in ("output_tokens", "run_output_tokens", "wall_s", "gpu_hours"):
        lo, hi = getattr(fc, f"{key}_90")
        assert lo <= getattr(fc, key) <= hi, key
    lo, hi = math.output_tokens_90
    assert lo < math.output_tokens < hi  # math's lengths vary: a real interval
    assert code.output_tokens_90 == [code.output_tokens] * 2  # code's do not
    assert not fc.warnings
    text = "\n".join(forecast_lines(fc, "run/forecast.json"))
    assert "run/forecast.json" in text and "GPU-hours" in text and "math" in text


def test_a_stratum_without_answers_takes_its_domains_mean_and_failures_count_zero() -> None:
    strata = {("a", "code"): 100, ("z", "code"): 50, ("a", "tool"): 50}
    drawn = {("a", "code"): [f"a{i}" for i in range(40)], ("z", "code"): ["z0"],
             ("a", "tool"): [f"t{i}" for i in range(40)]}  # fmt: skip
    out = Outcome()
    for _ in range(40):
        out.add(("a", "code"), 50, False)
    for i in range(40):
        if i < 30:
            out.add(("a", "tool"), 10, False)
        else:
            out.fail(("a", "tool"))  # context too long: no tokens
    left = {("a", "code"): 60, ("z", "code"): 50, ("a", "tool"): 10}
    fc = forecast(
        _sample(drawn, strata), out, left, left, committed={}, committed_active_s=0.0,
        throughput=None, gpus=1, endpoints=1,
    )  # fmt: skip
    assert fc.by_domain["code"].remaining_output_tokens == 60 * 50 + 50 * 50
    assert fc.by_domain["tool"].remaining_output_tokens == round(10 * (30 * 10 / 40))
    assert fc.by_domain["tool"].failure_share == 0.25
    assert fc.by_domain["tool"].mean_output_tokens == 10  # per completion
    notes = " ".join(fc.warnings)
    assert "z/code" in notes and "domain's mean" in notes
    # no rate measured: no time, and said
    assert fc.wall_s is None and fc.gpu_hours is None
    assert "saturated rate was not measured" in notes


def test_a_small_pilot_says_so_and_gives_no_interval() -> None:
    strata = {("a", "math"): 1000, ("a", "code"): 3000}
    drawn = {("a", "math"): ["m1", "m2", "m3"], ("a", "code"): [f"c{i}" for i in range(12)]}
    out = Outcome()
    for v in (10, 20, 30):
        out.add(("a", "math"), v, False)
    for _ in range(12):
        out.add(("a", "code"), 5, False)
    left = {("a", "math"): 997, ("a", "code"): 2988}
    fc = forecast(
        _sample(drawn, strata), out, left, left, committed={}, committed_active_s=0.0,
        throughput=_throughput(100.0), gpus=1, endpoints=1,
    )  # fmt: skip
    assert MIN_PILOT > 15
    assert fc.output_tokens_90 is None and fc.wall_s_90 is None
    assert fc.by_domain["math"].output_tokens_90 is None
    notes = " ".join(fc.warnings)
    assert "too small for an interval" in notes
    assert "domain math: 3 pilot answers" in notes and "a pilot of about" in notes
    assert fc.output_tokens == 997 * 20 + 2988 * 5  # the point estimate stays


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=5000), min_size=MIN_PILOT, max_size=80),
    left=st.integers(min_value=0, max_value=10**6),
    rate=st.floats(min_value=1.0, max_value=1e6),
)
def test_point_and_interval_for_any_lengths(lengths: list[int], left: int, rate: float) -> None:
    s = ("src", "general")
    out = Outcome()
    for v in lengths:
        out.add(s, v, False)
    drawn = {s: [f"p{i}" for i in range(len(lengths))]}
    fc = forecast(
        _sample(drawn, {s: left + len(lengths)}), out, {s: left}, {s: left},
        committed={"general": sum(lengths)}, committed_active_s=1.0,
        throughput=_throughput(rate, 0.0, 0.0), gpus=2, endpoints=2,
    )  # fmt: skip
    assert fc.output_tokens == round(left * float(np.mean(lengths)))
    lo, hi = fc.output_tokens_90
    assert lo - 1 <= fc.output_tokens <= hi + 1
    assert fc.wall_s == pytest.approx(left * float(np.mean(lengths)) / rate, abs=0.06)
    assert fc.by_domain["general"].share in (1.0, None)


def test_gpu_count() -> None:
    assert gpu_count(["0", "1,2", None, "", "0, 1, 2, 3"]) == [1, 2, 1, 1, 4]


# -- the saturated rate -----------------------------------------------------------------------


def test_spread_tokens_counts_each_request_for_its_share_of_the_window() -> None:
    answers = [(0.0, 10.0, 100), (5.0, 15.0, 50), (20.0, 30.0, 70), (3.0, 3.0, 9)]
    assert spread_tokens(answers, 0.0, 10.0) == pytest.approx(100 + 25 + 9)
    assert spread_tokens(answers, 8.0, 12.0) == pytest.approx(20 + 20)
    assert spread_tokens(answers, 40.0, 50.0) == 0


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _endpoint(url: str, slots: int) -> Any:
    return SimpleNamespace(
        url=url, on_answer=None, capacity=SimpleNamespace(max_running=slots),
        breaker=SimpleNamespace(state="up"), concurrency=SimpleNamespace(limit=slots + 2),
        slots=SimpleNamespace(inflight=0),
    )  # fmt: skip


def test_saturation_measures_the_rate_while_full_not_the_ramp_or_the_tail() -> None:
    """Two endpoints of 4 slots from t=1.5 (the start-up before it): A answers 50 tokens in
    5 s per slot, B in 10 s. The queue empties at t=20; what runs then finishes at 21.5, but
    one of B's answers, started at 11.5, runs slow until 26 (the tail)."""
    clock = _Clock()
    a, b = _endpoint("http://a", 4), _endpoint("http://b", 4)
    disp = SimpleNamespace(queued=10, fed_all=True, waiting=[], stopping=False, pending=10)
    answers: list[tuple[float, Any, float, int]] = []  # (end, endpoint, latency, tokens)
    for slot in range(4):
        answers += [(end, a, 5.0, 50) for end in (6.5, 11.5, 16.5, 21.5)]
        answers += [(11.5, b, 10.0, 50), (21.5 if slot else 26.0, b, 10.0 if slot else 14.5, 50)]

    def script(t: float) -> None:  # the state at clock time t
        disp.queued = 10 if t < 20.0 else 0
        a.slots.inflight = 4 if t < 21.5 else 0
        b.slots.inflight = 4 if t < 21.5 else (1 if t < 26.0 else 0)
        for end, ep, latency, tokens in answers:
            if end == t:
                ep.on_answer(end, latency, tokens)
        disp.pending = 0 if t >= 26.0 else 10

    async def sleep(dt: float) -> None:
        clock.t = round(clock.t + dt, 3)
        script(clock.t)

    async def scenario() -> Saturation:
        sat = Saturation(clock, sleep=sleep)
        clock.t = 1.5
        sat.attach(SimpleNamespace(endpoints=[a, b], dispatcher=disp), {"http://b": 2})
        script(clock.t)
        assert sat.task is not None
        await sat.task
        return sat

    sat = asyncio.run(scenario())
    assert sat.engine_end == 26.0 and sat.queue_empty == 20.0
    result = sat.result(finished=27.0)
    rows = {r["url"]: r for r in result.endpoints}
    # full from 1.5 to 20: A made 3 answers per slot and 3.5 s of its fourth (35 tokens)
    assert rows["http://a"]["saturated_s"] == pytest.approx(18.5, abs=0.01)
    rate_a = 4 * (150 + 35) / 18.5
    assert rows["http://a"]["output_tokens_per_s"] == pytest.approx(rate_a, abs=0.01)
    # B: one answer per slot, then 8.5 of 10 s (three slots) or of 14.5 s (the slow one)
    rate_b = (4 * 50 + 3 * 42.5 + 50 * 8.5 / 14.5) / 18.5
    assert rows["http://b"]["output_tokens_per_s"] == pytest.approx(rate_b, abs=0.01)
    assert rows["http://a"]["request_lifetimes"] == pytest.approx(18.5 / 5, abs=0.01)
    assert rows["http://a"]["gpus"] == 1 and rows["http://b"]["gpus"] == 2
    assert result.output_tokens_per_s == pytest.approx(rate_a + rate_b, abs=0.01)
    assert result.overhead_s == pytest.approx(1.5 + 1.0, abs=0.01)  # before and after
    assert result.engine_s == pytest.approx(24.5, abs=0.01)
    # the drain: the mean request life (A: 5 s; B: (7 x 10 + 14.5) / 8), weighted by rate;
    # the pilot's own tail: 6 s from the empty queue to the last answer
    life_b = (7 * 10 + 14.5) / 8
    assert rows["http://b"]["mean_life_s"] == pytest.approx(life_b, abs=0.001)
    drain = (rate_a * 5.0 + rate_b * life_b) / (rate_a + rate_b)
    assert result.drain_s == pytest.approx(drain, abs=0.01)
    assert result.pilot_tail_s == pytest.approx(6.0)
    assert result.problems == []


def test_endpoints_full_briefly_never_full_or_silent_are_said() -> None:
    sat = Saturation(_Clock())
    sat.engine_start, sat.engine_end, sat.queue_empty = 0.0, 10.0, 10.0
    from draftdata.generate.plan.saturation import EndpointWatch

    good = EndpointWatch("http://a", answers=[(0.0, 2.0, 20)] * 8, full=[(0.0, 8.0)],
                         concurrency=[4])  # fmt: skip
    brief = EndpointWatch("http://b", answers=[(0.0, 8.0, 40)] * 4, full=[(0.0, 1.0)],
                          concurrency=[4])  # fmt: skip
    never = EndpointWatch("http://c", answers=[(0.0, 2.0, 20)] * 3)
    silent = EndpointWatch("http://d")
    sat.watches = {w.url: w for w in (good, brief, never, silent)}
    result = sat.result(finished=10.0)
    # a: 160 tokens over 8 s = 20 tok/s; b: its own rate over its one second (4 x 40 x 1/8
    # = 20 tok/s), rough; c: at the measured mean; d: out of the fleet
    rows = {r["url"]: r for r in result.endpoints}
    assert rows["http://b"]["output_tokens_per_s"] == pytest.approx(20.0)
    assert rows["http://b"]["measured"] and not rows["http://c"]["measured"]
    assert result.output_tokens_per_s == pytest.approx(3 * 20.0)
    text = " ".join(result.problems)
    assert "http://b was full for only 1.0 s" in text and "its rate is rough" in text
    assert "http://c was never full" in text and "http://d answered no pilot request" in text
    assert "--pilot" in text  # how big a pilot would do


@given(
    sizes=st.dictionaries(
        st.sampled_from(["code", "math", "agent", "tool"]),
        st.integers(1, 400),
        min_size=1,
        max_size=4,
    ),
    fraction=st.floats(0.001, 0.2),
    n=st.integers(1, 3),
)
def test_the_pilot_notes_never_ask_for_more_than_the_job(
    sizes: dict[str, int], fraction: float, n: int
) -> None:
    """A domain the pilot measured too little of: the pilot that would measure it is at most
    the job, and a domain the whole job cannot measure says so."""
    import re

    strata = {("s", d): k for d, k in sizes.items()}
    drawn = {s: [f"{s[1]}{i}" for i in range(max(1, int(k * fraction)))] for s, k in strata.items()}
    out = Outcome()
    for s, ids in drawn.items():
        for _ in range(len(ids) * n):
            out.add(s, 100, False)
    left = {s: (k - len(drawn[s])) * n for s, k in strata.items()}
    fc = forecast(
        _sample(drawn, strata), out, left, left, committed={}, committed_active_s=0.0,
        throughput=_throughput(100.0), gpus=1, endpoints=1, n=n,
    )  # fmt: skip
    job = sum(sizes.values())
    for d, k in sizes.items():
        note = next((w for w in fc.warnings if w.startswith(f"domain {d}:")), None)
        if note is None:
            continue
        if k * n < 30:
            assert "cannot be measured in this job" in note, note
        else:
            found = re.search(r"a pilot of about ([\d,]+) of the job's ([\d,]+) prompts", note)
            assert found is not None, note
            need, total = (int(x.replace(",", "")) for x in found.groups())
            assert total == job and 0 < need <= job, note
            # that pilot's share of the domain holds the answers asked for
            assert need / job * k * n >= 30 - 1e-9, note
