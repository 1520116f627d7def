"""The loss-token planner against brute force: on small random inputs no feasible plan keeps
more (or, keeping as much, repeats less); the plan is feasible; the selection writes exactly the
tokens it planned; large inputs are planned fast and near the relaxation's bound."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from draftdata.merge.plan import mix64, select, selection_order, solve_tokens
from draftdata.merge.tokenplan import band, plan_tokens, prefix_values, within


def brute_force(
    weights: dict[str, list[int]], target: dict[str, float], tolerance: float, repeat: int
) -> tuple[int, int]:
    """The best (distinct tokens kept, minus the total) over every count of every group."""
    groups = sorted(target)
    values = [prefix_values(np.asarray(weights[g], dtype=np.int64), repeat) for g in groups]
    sizes = [len(weights[g]) for g in groups]
    best = (0, 0)
    for counts in itertools.product(*(range(len(v)) for v in values)):
        kept = [int(v[c]) for v, c in zip(values, counts, strict=True)]
        total = sum(kept)
        if all(
            within(k, total, *band(target[g], tolerance)) for k, g in zip(kept, groups, strict=True)
        ):
            unique = sum(int(v[min(c, n)]) for v, c, n in zip(values, counts, sizes, strict=True))
            best = max(best, (unique, -total))
    return best


_weight = st.sampled_from([0, 1, 2, 3, 5, 8, 13, 40, 100, 377])


@st.composite
def problems(draw: st.DrawFn) -> tuple[dict[str, list[int]], dict[str, float], float, int]:
    k = draw(st.integers(1, 4))
    groups = [f"d{i}" for i in range(k)]
    weights = {g: draw(st.lists(_weight, max_size=4 if k < 4 else 3)) for g in groups}
    shares = [draw(st.integers(1, 10)) for _ in groups]
    target = {g: w / sum(shares) for g, w in zip(groups, shares, strict=True)}
    tolerance = draw(st.sampled_from([0.0, 0.005, 0.02, 0.05, 0.1, 0.25]))
    repeat = draw(st.integers(1, 3))
    # brute force stays small: at most a few thousand plans
    assume(np.prod([len(w) * repeat + 1 for w in weights.values()]) <= 4000)
    return weights, target, tolerance, repeat


@settings(max_examples=400, deadline=None)
@given(problems())
def test_no_feasible_plan_keeps_more_than_the_planner(
    problem: tuple[dict[str, list[int]], dict[str, float], float, int],
) -> None:
    weights, target, tolerance, repeat = problem
    arrays = {g: np.asarray(w, dtype=np.int64) for g, w in weights.items()}
    plan = plan_tokens(arrays, target, tolerance=tolerance, upsample=repeat > 1, max_repeat=repeat)
    assert plan.optimal
    unique = sum(plan.unique_kept.values())  # distinct loss tokens kept
    assert (unique, -plan.total) == brute_force(weights, target, tolerance, repeat)
    # the plan itself is feasible: every share in its band
    for g, kept in plan.kept.items():
        assert within(kept, plan.total, *band(target[g], tolerance))
    assert plan.bound >= unique
    if repeat == 1:
        assert unique == plan.total  # no copies without upsampling


def test_the_exact_mix_of_equal_rows_is_found() -> None:
    weights = {"a": np.full(30, 10), "b": np.full(10, 10), "c": np.full(50, 10)}
    plan = plan_tokens(weights, {"a": 0.5, "b": 0.25, "c": 0.25}, tolerance=0.0)
    assert plan.counts == {"a": 20, "b": 10, "c": 10} and plan.optimal


def test_upsampling_keeps_every_row_with_the_fewest_copies() -> None:
    weights = {"big": np.full(80, 5), "small": np.full(10, 5)}
    plan = plan_tokens(
        weights, {"big": 0.5, "small": 0.5}, tolerance=0.0, upsample=True, max_repeat=8
    )
    assert plan.unique_kept == {"big": 400, "small": 50}  # everything kept
    assert plan.counts == {"big": 80, "small": 80}  # small repeated 8x, no more
    capped = plan_tokens(
        weights, {"big": 0.5, "small": 0.5}, tolerance=0.0, upsample=True, max_repeat=4
    )
    assert capped.counts == {"big": 40, "small": 40}  # the repeat cap bounds it


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=2, max_size=4),
    seed=st.integers(0, 2**16),
    eval_fraction=st.sampled_from([0.0, 0.05, 0.2]),
    upsample=st.booleans(),
)
def test_the_selection_writes_exactly_the_planned_tokens(
    sizes: list[int], seed: int, eval_fraction: float, upsample: bool
) -> None:
    """Rows chosen by ``select`` (cyclic repeats, eval from rows without copies) hold the
    tokens the plan counted, group by group, and no eval row is repeated."""
    rng = np.random.default_rng(seed)
    groups = np.concatenate([np.full(n, i, dtype=np.int32) for i, n in enumerate(sizes)])
    rows = np.arange(len(groups), dtype=np.int64)
    content = mix64(rows.astype(np.uint64) + np.uint64(seed))
    loss = rng.integers(1, 500, size=len(rows)).astype(np.int64)
    order = selection_order(rows, groups, content, seed)
    weights = {f"g{i}": loss[order][groups[order] == i] for i in range(len(sizes))}
    target = {f"g{i}": 1 / len(sizes) for i in range(len(sizes))}
    alloc, plan = solve_tokens(weights, target, tolerance=0.05, upsample=upsample, max_repeat=3)
    assert plan is not None
    sel = select(
        rows,
        groups,
        content,
        {int(g[1:]): n for g, n in alloc.counts.items()},
        seed=seed,
        eval_fraction=eval_fraction,
        cyclic=True,
    )
    for g, kept in plan.kept.items():
        assert int(loss[sel.row[groups[sel.row] == int(g[1:])]].sum()) == kept
    evals = set(sel.row[sel.split == 1].tolist())
    assert not evals & set(sel.row[sel.copy > 0].tolist())


def test_a_large_input_is_planned_near_the_bound() -> None:
    """The search is cut short on big inputs; what it keeps is still within a few rows of the
    relaxation's bound (``benchmarks/bench_token_plan.py`` prints how long it takes)."""
    rng = np.random.default_rng(0)
    sizes = {"code": 120_000, "math": 20_000, "general": 30_000, "tool": 6_000, "agent": 2_000}
    weights = {
        g: (rng.lognormal(7.5 if g == "agent" else 6.0, 1.0, size=n)).astype(np.int64) + 1
        for g, n in sizes.items()
    }
    target = {"code": 0.35, "math": 0.25, "general": 0.25, "tool": 0.1, "agent": 0.05}
    for upsample in (False, True):
        plan = plan_tokens(weights, target, tolerance=0.005, upsample=upsample, max_repeat=4)
        for g, kept in plan.kept.items():
            assert within(kept, plan.total, *band(target[g], 0.005))
        # within a thousandth of the relaxation's bound (a few rows)
        unique = sum(plan.unique_kept.values())
        assert unique >= 0.999 * plan.bound, (unique, plan.bound)


def test_groups_without_loss_tokens_are_missing_and_the_rest_keep_their_ratios() -> None:
    weights = {"a": np.full(10, 4), "b": np.full(10, 4), "c": np.zeros(5, dtype=np.int64)}
    alloc, plan = solve_tokens(weights, {"a": 0.4, "b": 0.4, "c": 0.2}, tolerance=0.0)
    assert alloc.missing == ["c"] and not alloc.reachable
    assert alloc.target == {"a": 0.5, "b": 0.5}
    assert plan is not None and plan.kept == {"a": 40, "b": 40}
    assert alloc.achieved == pytest.approx({"a": 0.5, "b": 0.5})
