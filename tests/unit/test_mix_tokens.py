"""The mix planner in tokens (``mix.token_fill``, ``plan_mix(by_tokens=True)``): row counts
chosen so that existing + new land on the target shares of the expected loss tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.shared.mix import Supply, plan_mix, token_fill

DOMAINS = ["agent", "code", "general", "math", "tool"]

lengths_tables = st.fixed_dictionaries(
    {d: st.floats(min_value=5.0, max_value=20_000.0) for d in DOMAINS}
)
targets = st.dictionaries(
    st.sampled_from(DOMAINS), st.floats(min_value=0.02, max_value=1.0), min_size=1
)


def _shares(plan_rows: list, attr: str) -> dict[str, float]:  # type: ignore[type-arg]
    return {r.domain: getattr(r, attr) for r in plan_rows}


@settings(max_examples=300, deadline=None)
@given(
    lengths=lengths_tables,
    mix=targets,
    existing_rows=st.fixed_dictionaries({d: st.integers(0, 3000) for d in DOMAINS}),
    budget=st.integers(min_value=2000, max_value=200_000),
)
def test_the_plan_lands_on_the_token_shares_when_supply_and_existing_allow(
    lengths: dict[str, float], mix: dict[str, float], existing_rows: dict[str, int], budget: int
) -> None:
    total = sum(mix.values())
    target = {d: v / total for d, v in mix.items()}
    existing_tokens = {d: n * lengths[d] for d, n in existing_rows.items()}
    supplies = [
        Supply(name="a", available={d: budget for d in DOMAINS}),
        Supply(name="b", available={d: budget // 3 for d in DOMAINS}),
    ]
    plan = plan_mix(
        existing_rows,
        supplies,
        budget,
        target,
        lengths=lengths,
        existing_tokens=existing_tokens,
        by_tokens=True,
    )
    assert plan.mix_by == "tokens" and plan.total_new == budget and plan.shortfall == 0
    new = {r.domain: r.new for r in plan.domains}
    assert all(new.get(d, 0) == 0 for d in DOMAINS if d not in target)  # untargeted: nothing
    after = {d: existing_tokens[d] + new.get(d, 0) * lengths[d] for d in DOMAINS}
    grand = sum(after.values())
    # the domains that took rows all sit at the same multiple T of their target (their share
    # of T tokens), each within one row of its tokens; a targeted domain that took none holds
    # its share of T already
    free = [d for d in target if new.get(d, 0) > 0]
    assert free
    per = {d: after[d] / target[d] for d in free}
    for d in free:
        for e in free:
            assert per[d] == pytest.approx(
                per[e], abs=lengths[d] / target[d] + lengths[e] / target[e] + 1e-6
            )
    low = min((after[d] - lengths[d]) / target[d] for d in free)
    for d in target:
        if d not in free:
            assert existing_tokens[d] >= target[d] * low - lengths[d] - 1e-6, d  # < a row
    # with nothing in the way (no existing tokens outside the target, none over it) the shares
    # of the result are the targets (rounding moves each domain by less than a row: its share
    # by at most its own row's tokens plus one of the longest rows)
    outside = sum(after[d] for d in DOMAINS if d not in target)
    if not outside and len(free) == len(target):
        longest = max(lengths[d] for d in target)
        for d in target:
            tol = (lengths[d] + longest) / grand + 1e-9
            assert after[d] / grand == pytest.approx(target[d], abs=tol)
    # the plan's own figures agree
    rows = {r.domain: r for r in plan.domains}
    for d in DOMAINS:
        assert rows[d].new_tokens == pytest.approx(new.get(d, 0) * lengths[d], abs=0.1)
        assert rows[d].tokens_after == pytest.approx(after[d] / grand, abs=1e-9)


@given(
    lengths=lengths_tables,
    mix=targets,
    caps=st.fixed_dictionaries({d: st.integers(0, 500) for d in DOMAINS}),
    total=st.integers(0, 3000),
)
def test_token_fill_respects_caps_and_spends_what_it_can(
    lengths: dict[str, float], mix: dict[str, float], caps: dict[str, int], total: int
) -> None:
    got = token_fill(mix, {}, lengths, total, caps)
    assert sum(got.values()) == min(total, sum(caps.values()))
    assert all(0 <= got[d] <= caps[d] for d in caps)
    aimed = sum(caps[d] for d in mix if caps[d])
    if total <= aimed:  # the targeted domains can take it all: the others get none
        assert all(got[d] == 0 for d in caps if d not in mix)


def test_worked_example_a_long_domain_needs_fewer_rows() -> None:
    # math answers are 10x code's: for equal token shares, code takes 10 rows per math row
    lengths = {"code": 300.0, "math": 3000.0}
    supplies = [Supply(name="s", available={"code": 10_000, "math": 10_000})]
    plan = plan_mix({}, supplies, 1100, {"code": 0.5, "math": 0.5}, lengths=lengths,
                    by_tokens=True)  # fmt: skip
    new = {r.domain: r.new for r in plan.domains}
    assert new == {"code": 1000, "math": 100}
    assert all(r.tokens_after == pytest.approx(0.5) for r in plan.domains)
    # the same in rows would take 550 of each: 91% of the tokens in math
    rows = plan_mix({}, supplies, 1100, {"code": 0.5, "math": 0.5}, lengths=lengths)
    assert {r.domain: r.new for r in rows.domains} == {"code": 550, "math": 550}
    assert rows.mix_by == "rows"
    by_domain = {r.domain: r for r in rows.domains}
    assert by_domain["math"].tokens_after == pytest.approx(550 * 3000 / (550 * 3300))


def test_rows_plans_are_unchanged_by_lengths() -> None:
    supplies = [Supply(name="s", available={"code": 500, "math": 300, "tool": 40})]
    mix = {"code": 0.3, "math": 0.5, "tool": 0.2}
    plain = plan_mix({"code": 700}, supplies, 600, mix)
    shown = plan_mix({"code": 700}, supplies, 600, mix, lengths={"code": 9, "math": 99, "tool": 5})
    assert plain.per_source == shown.per_source
    assert [(r.domain, r.new, r.after) for r in plain.domains] == [
        (r.domain, r.new, r.after) for r in shown.domains
    ]
    assert all(r.tokens_per_row is None for r in plain.domains)
    assert all(r.tokens_per_row is not None for r in shown.domains)


def test_existing_tokens_over_target_take_no_new_rows() -> None:
    lengths = {"code": 100.0, "math": 1000.0, "general": 400.0}
    existing = {"code": 10_000}  # 1M tokens of code
    supplies = [Supply(name="s", available={"code": 5000, "math": 5000, "general": 5000})]
    plan = plan_mix(existing, supplies, 1000, {"code": 0.2, "math": 0.4, "general": 0.4},
                    lengths=lengths, by_tokens=True)  # fmt: skip
    new = {r.domain: r.new for r in plan.domains}
    assert new["code"] == 0 and new["math"] + new["general"] == 1000
    # math and general keep their 1:1 token ratio
    assert new["math"] * 1000 == pytest.approx(new["general"] * 400, rel=0.01)
