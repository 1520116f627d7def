"""The mix planner on worked examples."""

from __future__ import annotations

import pytest

from draftdata.shared.mix import Supply, largest_remainder, plan_mix, water_fill

EXISTING = {"code": 77_000, "math": 8_000, "general": 15_000}  # 100K rows at 77% code
MIX = {"code": 0.40, "math": 0.25, "general": 0.25, "tool": 0.05, "agent": 0.05}


def _after(plan_domains: list, domain: str) -> float:  # type: ignore[type-arg]
    return next(d.after for d in plan_domains if d.domain == domain)


def test_worked_example_ample_supply_lands_on_target() -> None:
    # 100K existing at 77% code, target code 40%, budget 193K: T = 293K, so code gets
    # 0.40 * 293K - 77K = 40,200 new; every other domain gets its exact gap too.
    supplies = [
        Supply(name="big", available={"code": 90_000, "math": 90_000, "general": 90_000}),
        Supply(name="tools", available={"tool": 20_000, "agent": 20_000}),
    ]
    plan = plan_mix(EXISTING, supplies, 193_000, MIX)
    new = {d.domain: d.new for d in plan.domains}
    assert new == {
        "code": 40_200,
        "math": 65_250,
        "general": 58_250,
        "tool": 14_650,
        "agent": 14_650,
    }
    assert plan.total_new == 193_000 and plan.shortfall == 0
    for d in plan.domains:
        assert d.after == pytest.approx(MIX[d.domain], abs=1e-6)
    assert _after(plan.domains, "code") == pytest.approx(0.40)


def test_worked_example_scarce_tool_and_agent() -> None:
    # Like the real expansion: only ~1.2K tool and 553 agent prompts exist. Their gap is spread
    # evenly (a common shift) over the other domains, which keeps the squared error minimal.
    supplies = [
        Supply(name="big", available={"code": 90_000, "math": 90_000, "general": 90_000}),
        Supply(name="hermes", available={"tool": 1_200}),
        Supply(name="agent", available={"agent": 553}),
    ]
    plan = plan_mix(EXISTING, supplies, 193_000, MIX)
    new = {d.domain: d.new for d in plan.domains}
    assert new["tool"] == 1_200 and new["agent"] == 553
    assert sum(new.values()) == 193_000
    shift = (14_650 - 1_200 + 14_650 - 553) / 3
    assert new["code"] == pytest.approx(40_200 + shift, abs=1)
    assert new["math"] == pytest.approx(65_250 + shift, abs=1)
    assert new["general"] == pytest.approx(58_250 + shift, abs=1)


def test_overrepresented_domain_only_gets_what_others_cannot_take() -> None:
    # code is far above its target: it only gets what math and general cannot supply.
    supplies = [Supply(name="s", available={"code": 1_000, "math": 50, "general": 50})]
    plan = plan_mix(
        {"code": 900, "general": 100}, supplies, 200, {"code": 0.5, "math": 0.25, "general": 0.25}
    )
    new = {d.domain: d.new for d in plan.domains}
    assert new == {"code": 100, "math": 50, "general": 50}  # math/general exhausted, rest to code


def test_per_source_split_is_proportional_within_caps() -> None:
    supplies = [
        Supply(name="a", available={"math": 300}),
        Supply(name="b", available={"math": 100}),
        Supply(name="c", available={"math": 600}, max_take=50),
    ]
    plan = plan_mix({}, supplies, 250, {"math": 1.0})
    assert plan.per_source["c"] == {"math": 50}
    assert plan.per_source["a"]["math"] + plan.per_source["b"]["math"] == 200
    assert plan.per_source["a"]["math"] == 150 and plan.per_source["b"]["math"] == 50


def test_fixed_takes_and_no_budget() -> None:
    supplies = [
        Supply(name="a", available={"code": 100, "general": 100}, take=50),
        Supply(name="b", available={"math": 10}, take=99),
    ]
    plan = plan_mix({}, supplies, None, {})
    assert plan.per_source == {"a": {"code": 25, "general": 25}, "b": {"math": 10}}
    assert plan.total_new == 60


def test_no_mix_spreads_budget_by_supply() -> None:
    supplies = [
        Supply(name="a", available={"code": 300}),
        Supply(name="b", available={"math": 100}),
    ]
    plan = plan_mix({}, supplies, 200, {})
    assert plan.per_source == {"a": {"code": 150}, "b": {"math": 50}}


def test_budget_above_supply_reports_shortfall() -> None:
    plan = plan_mix({}, [Supply(name="a", available={"code": 30})], 100, {"code": 1.0})
    assert plan.total_new == 30 and plan.shortfall == 70


def test_caps_shared_across_domains_are_refilled() -> None:
    # Source a has both domains but a cap of 60; b only has math. The math gap a cannot fill
    # (its cap is used by code) is refilled from b in a later round.
    supplies = [
        Supply(name="a", available={"code": 100, "math": 100}, max_take=60),
        Supply(name="b", available={"math": 100}),
    ]
    plan = plan_mix({}, supplies, 120, {"code": 0.5, "math": 0.5})
    assert sum(plan.per_source["a"].values()) <= 60
    assert plan.total_new == 120


def test_rounding_helpers() -> None:
    assert largest_remainder({"a": 1.5, "b": 1.5}, 3, {"a": 9, "b": 9}) == {"a": 2, "b": 1}
    assert water_fill({"a": 10.0, "b": -5.0}, 6, {"a": 4, "b": 10}) == {"a": 4, "b": 2}
    assert water_fill({"a": 1.0}, 0, {"a": 4}) == {"a": 0}


def test_plan_is_deterministic() -> None:
    supplies = [
        Supply(name=f"s{i}", available={"code": 7 * i + 3, "math": 11 * i + 1}) for i in range(5)
    ]
    a = plan_mix({"code": 10}, supplies, 97, {"code": 0.3, "math": 0.7})
    b = plan_mix({"code": 10}, supplies, 97, {"code": 0.3, "math": 0.7})
    assert a == b
