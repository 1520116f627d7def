"""Pilot outcomes the forecast is computed from, shared by the tests that compare today's
forecast files with the ones written before the forecast became a typed record
(``data/forecast-*.json``, written by the dict-building code of commit df87645)."""

from __future__ import annotations

from typing import Any

from draftdata.generate.plan.forecast import Outcome
from draftdata.generate.plan.pilot_sample import PilotSample, PilotSpec, Stratum
from draftdata.generate.plan.saturation import Throughput


def _sample(drawn: dict[Stratum, list[str]], strata: dict[Stratum, int], seed: int) -> PilotSample:
    ids = frozenset(i for v in drawn.values() for i in v)
    return PilotSample(PilotSpec(fraction=0.1), seed, ids, strata, drawn)


def _endpoint(url: str, rate: float | None) -> dict[str, Any]:
    return {
        "url": url,
        "gpus": 2,
        "output_tokens_per_s": rate,
        "saturated_s": 12.5,
        "request_lifetimes": 3.25,
        "mean_life_s": 4.0,
        "mean_concurrency": 16.0,
        "per_sequence_tokens_per_s": None if rate is None else round(rate / 16, 2),
        "answers": 40,
        "measured": rate is not None,
    }


def full() -> dict[str, Any]:
    """Intervals, a borrowed stratum, estimated tokens, failures, cut answers, a rate."""
    strata = {("a", "code"): 400, ("b", "code"): 200, ("a", "math"): 400, ("c", "math"): 50,
              ("", ""): 90}  # fmt: skip
    drawn = {("a", "code"): [f"ac{i}" for i in range(40)],
             ("b", "code"): [f"bc{i}" for i in range(20)],
             ("a", "math"): [f"am{i}" for i in range(40)],
             ("c", "math"): ["cm0"],
             ("", ""): [f"n{i}" for i in range(12)]}  # fmt: skip
    out = Outcome()
    for i in range(40):
        out.add(("a", "code"), 100 + 7 * i, i % 9 == 0)
        if i < 38:
            out.add(("a", "math"), 1000 + 37 * i, i >= 34, estimated=i == 3)
        else:
            out.fail(("a", "math"))
    for i in range(20):
        out.add(("b", "code"), 300 - 5 * i, False)
    for i in range(12):
        out.add(("", ""), 50 + i, False)
    left = {("a", "code"): 360, ("b", "code"): 180, ("a", "math"): 360, ("c", "math"): 49,
            ("", ""): 78}  # fmt: skip
    prompts = {s: max(0, k - 3) for s, k in left.items()}
    tp = Throughput(1234.5678, [_endpoint("http://h1:8000", 617.28), _endpoint("http://h2:8000",
                    617.28)], 4.12345, 2.5, 30.25, ["endpoint http://h2:8000 was full for only "
                    "1.0 s: its rate is rough"], pilot_tail_s=3.21)  # fmt: skip
    return {
        "sample": _sample(drawn, strata, 7),
        "outcome": out,
        "left": left,
        "left_prompts": prompts,
        "committed": {"code": 40 * 200 + 20 * 250, "math": 44_000, "": 600, "tool": 10},
        "committed_active_s": 12.34567,
        "throughput": tp,
        "gpus": 4,
        "endpoints": 2,
        "n": 2,
        "max_tokens": 2048,
        "run_id": "run-1",
        "pilot_wall_s": 45.6789,
    }


def small() -> dict[str, Any]:
    """A pilot too small for intervals, no rate measured, an unmeasured domain."""
    strata = {("a", "math"): 1000, ("a", "code"): 3000, ("a", "tool"): 5}
    drawn = {("a", "math"): ["m1", "m2", "m3"], ("a", "code"): ["c1", "c2"], ("a", "tool"): []}
    out = Outcome()
    for i in range(3):
        out.add(("a", "math"), 500 + 100 * i, i == 2)
    out.add(("a", "code"), 80, False)
    out.fail(("a", "code"))
    left = {("a", "math"): 997, ("a", "code"): 2998, ("a", "tool"): 5}
    tp = Throughput(None, [_endpoint("http://h1:8000", None)], 0.0, 1.5, 3.0,
                    ["endpoint http://h1:8000 was never full while work was queued"])  # fmt: skip
    return {
        "sample": _sample(drawn, strata, 0),
        "outcome": out,
        "left": left,
        "left_prompts": left,
        "committed": {},
        "committed_active_s": 0.0,
        "throughput": tp,
        "gpus": 1,
        "endpoints": 1,
    }


def earlier_rate() -> dict[str, Any]:
    """A rate taken from an earlier forecast; no throughput object at all is ``bare``."""
    case = full()
    case["throughput"] = Throughput(
        900.0, [_endpoint("http://h1:8000", 900.0)], 2.0, 1.0, 0.5,
        ["the fleet's rate is the one measured by run/forecast.json"], source="run/forecast.json",
    )  # fmt: skip
    case["n"] = 1
    case["max_tokens"] = None
    return case


def bare() -> dict[str, Any]:
    """No throughput, nothing answered."""
    strata = {("a", "code"): 10}
    drawn = {("a", "code"): ["c1"]}
    left = {("a", "code"): 10}
    return {
        "sample": _sample(drawn, strata, 3),
        "outcome": Outcome(),
        "left": left,
        "left_prompts": left,
        "committed": {},
        "committed_active_s": 0.0,
        "throughput": None,
        "gpus": 1,
        "endpoints": 1,
    }


CASES = {"full": full, "small": small, "earlier_rate": earlier_rate, "bare": bare}


def unmeasured() -> dict[str, Any]:
    """A bootstrapped pilot with a domain it has no answer of (the whole pilot's mean and draw
    stand in) and more than five strata that borrow their domain's mean."""
    strata: dict[Stratum, int] = {("a", "code"): 300, ("a", "agent"): 40}
    drawn: dict[Stratum, list[str]] = {("a", "code"): [f"c{i}" for i in range(35)]}
    out = Outcome()
    for i in range(35):
        out.add(("a", "code"), 200 + (i * 53) % 400, i % 7 == 0)
    left: dict[Stratum, int] = {("a", "code"): 265, ("a", "agent"): 40}
    for k in range(7):  # sources the pilot drew nothing of
        strata[(f"s{k}", "code")] = 10 + k
        drawn[(f"s{k}", "code")] = []
        left[(f"s{k}", "code")] = 10 + k
    tp = Throughput(
        5000.0, [_endpoint("http://h1:8000", 5000.0)], 6.0, 3.0, 40.0, [], pilot_tail_s=1.0
    )
    return {
        "sample": _sample(drawn, strata, 11),
        "outcome": out,
        "left": left,
        "left_prompts": left,
        "committed": {"code": 7000},
        "committed_active_s": 20.0,
        "throughput": tp,
        "gpus": 8,
        "endpoints": 1,
        "n": 1,
        "max_tokens": 1024,
        "run_id": "run-2",
        "pilot_wall_s": 61.0,
    }


CASES["unmeasured"] = unmeasured
