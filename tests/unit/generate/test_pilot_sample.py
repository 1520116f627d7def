"""The pilot's sample (``generate/plan/pilot_sample.py``): --pilot values, the allocation, the
draw."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.generate.plan.pilot_sample import PilotSpec, allocate, draw, parse_pilot, scope_keys
from draftdata.generate.prompts.partition import parse_partition

# -- --pilot values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("0.01", PilotSpec(fraction=0.01)),
        (" 0.5 ", PilotSpec(fraction=0.5)),
        ("1e-3", PilotSpec(fraction=0.001)),
        ("2", PilotSpec(count=2)),
        ("1500", PilotSpec(count=1500)),
        ("1500.0", PilotSpec(count=1500)),
    ],
)
def test_good_pilot_values(text: str, spec: PilotSpec) -> None:
    assert parse_pilot(text) == spec


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "must be above 0"),
        ("-0.1", "must be above 0"),
        ("-5", "must be above 0"),
        ("1", "1 is neither a fraction"),
        ("1.5", "a count is a whole number"),
        ("abc", "not a number"),
        ("", "not a number"),
        ("nan", "must be above 0"),
        ("inf", "must be above 0"),
        ("1%", "not a number"),
    ],
)
def test_bad_pilot_values_are_one_line_errors(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pilot(text)
    message = str(info.value)
    assert message.startswith(f"--pilot {text!r}: ") and says in message
    assert "\n" not in message and "e.g. --pilot 0.01" in message


@given(st.floats(min_value=1e-9, max_value=0.999999, allow_nan=False))
def test_every_fraction_below_one_is_a_fraction(x: float) -> None:
    assert parse_pilot(repr(x)) == PilotSpec(fraction=x)


@given(st.integers(min_value=2, max_value=10**12))
def test_every_integer_from_two_is_a_count(n: int) -> None:
    assert parse_pilot(str(n)) == PilotSpec(count=n)


def test_size() -> None:
    assert PilotSpec(fraction=0.01).size(150_000) == 1500
    assert PilotSpec(fraction=0.01).size(10) == 1  # never an empty pilot of a non-empty scope
    assert PilotSpec(count=1500).size(1000) == 1000
    assert PilotSpec(count=7).size(0) == 0


# -- the allocation ---------------------------------------------------------------------------

strata_counts = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["code", "math", "tool"])),
    st.integers(min_value=0, max_value=5000),
    min_size=1,
)


@settings(max_examples=400)
@given(strata_counts, st.integers(min_value=0, max_value=20000))
def test_allocation_adds_up_and_respects_every_stratum(
    counts: dict[tuple[str, str], int], size: int
) -> None:
    got = allocate(counts, size)
    total = sum(counts.values())
    assert set(got) == set(counts)
    # the same whatever order the strata come in (the file order decides it in a draw)
    assert allocate(dict(reversed(list(counts.items()))), size) == got
    assert sum(got.values()) == min(size, total)
    assert all(0 <= got[s] <= counts[s] for s in counts)
    nonempty = [s for s, n in counts.items() if n]
    if size >= len(nonempty):  # room for one each: every stratum is measured
        assert all(got[s] >= 1 for s in nonempty)


@given(strata_counts, st.integers(min_value=1, max_value=20000))
def test_allocation_is_proportional(counts: dict[tuple[str, str], int], size: int) -> None:
    total = sum(counts.values())
    size = min(size, total)
    if not total:
        assert allocate(counts, size) == dict.fromkeys(counts, 0)
        return
    got = allocate(counts, size)
    floored = [s for s, n in counts.items() if n and size * n / total < 1]
    if size < len([n for n in counts.values() if n]) or floored:
        return  # the floor of one per stratum (tested above) moves the shares
    for s, n in counts.items():
        assert abs(got[s] - size * n / total) < 1.0, (s, got[s], size * n / total)


# -- the draw ---------------------------------------------------------------------------------


def _write(path: Path, rows: list[tuple[str, str, str]], *, bad: int = 0) -> None:
    lines = [
        json.dumps(
            {"id": i, "source": s, "domain": d, "messages": [{"role": "user", "content": i}]}
        )
        for i, s, d in rows
    ]
    lines += ["{not json", '{"messages": []}', "   "][:bad]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _rows(sizes: dict[tuple[str, str], int]) -> list[tuple[str, str, str]]:
    return [(f"{s}-{d}-{k}", s, d) for (s, d), n in sizes.items() for k in range(n)]


SIZES = {("hermes", "tool"): 300, ("infinity", "code"): 900, ("infinity", "math"): 600,
         ("infinity", "general"): 1200, ("meta", "math"): 985, ("rare", "agent"): 15}  # fmt: skip


def test_draw_is_stratified_proportional_and_seeded(tmp_path: Path) -> None:
    rows = _rows(SIZES)
    random.Random(0).shuffle(rows)
    p = tmp_path / "p.jsonl"
    _write(p, rows, bad=3)
    sample = draw([p], PilotSpec(fraction=0.05), seed=7)
    total = sum(SIZES.values())
    assert sample.strata == dict(sorted(SIZES.items()))
    assert len(sample.ids) == round(0.05 * total)
    for s, n in SIZES.items():
        got = sample.drawn[s]
        assert abs(len(got) - 0.05 * total * n / total) < 1.0
        assert all(pid.startswith(f"{s[0]}-{s[1]}-") for pid in got)  # from its stratum
    assert sample.ids == {pid for ids in sample.drawn.values() for pid in ids}
    # the same seed draws the same sample whatever the file order; another seed draws another
    random.Random(1).shuffle(rows)
    q = tmp_path / "q.jsonl"
    _write(q, rows)
    assert draw([q], PilotSpec(fraction=0.05), seed=7).ids == sample.ids
    other = draw([q], PilotSpec(fraction=0.05), seed=8)
    assert len(other.ids) == len(sample.ids) and other.ids != sample.ids
    # a larger pilot with the same seed holds the smaller one where its share grew
    bigger = draw([q], PilotSpec(count=2 * len(sample.ids)), seed=7)
    for s in SIZES:
        if len(bigger.drawn[s]) >= len(sample.drawn[s]):
            assert set(sample.drawn[s]) <= set(bigger.drawn[s])


def test_draw_counts_a_repeated_id_once_and_respects_limit_and_partition(tmp_path: Path) -> None:
    rows = _rows({("s", "code"): 400, ("s", "math"): 200})
    p = tmp_path / "p.jsonl"
    _write(p, [*rows, rows[0], rows[1]])  # two repeated ids at the end
    sample = draw([p], PilotSpec(count=60))
    assert sample.in_scope == 600 and len(sample.ids) == 60
    assert len(sample.drawn[("s", "code")]) == 40
    limited = draw([p], PilotSpec(count=30), limit=300)
    assert limited.in_scope == 300 and limited.ids <= {r[0] for r in rows[:300]}
    part = parse_partition("1/3")
    parted = draw([p], PilotSpec(fraction=0.1), partition=part)
    inside = {pid for pid, _, _ in scope_keys([p], limit=None, partition=part)}
    assert parted.ids <= inside and parted.in_scope == len(inside)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.dictionaries(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y", "z"])),
        st.integers(min_value=1, max_value=120),
        min_size=1,
    ),
    size=st.integers(min_value=1, max_value=400),
    seed=st.integers(min_value=0, max_value=10**6),
    order=st.randoms(use_true_random=False),
)
def test_draw_matches_the_allocation_for_any_shape(
    tmp_path: Path,
    sizes: dict[tuple[str, str], int],
    size: int,
    seed: int,
    order: random.Random,
) -> None:
    rows = _rows(sizes)
    order.shuffle(rows)
    p = tmp_path / f"p{seed}-{size}.jsonl"
    _write(p, rows)
    sample = draw([p], PilotSpec(count=size) if size > 1 else PilotSpec(fraction=0.5), seed=seed)
    want = allocate(sizes, PilotSpec(count=size).size(sum(sizes.values())) if size > 1 else
                    PilotSpec(fraction=0.5).size(sum(sizes.values())))  # fmt: skip
    assert {s: len(v) for s, v in sample.drawn.items()} == want
    again = draw([p], PilotSpec(count=size) if size > 1 else PilotSpec(fraction=0.5), seed=seed)
    assert again.ids == sample.ids


def test_allocation_breaks_equal_remainders_by_name_whatever_the_order() -> None:
    # 200 of 205: 62.439..., 22.439..., 115.12...: the two equal remainders differ in float
    # noise with the summing order; the smaller name takes the extra prompt, always
    import itertools

    counts = {("a", "x"): 64, ("a", "y"): 23, ("a", "z"): 118}
    for order in itertools.permutations(counts):
        got = allocate({s: counts[s] for s in order}, 200)
        assert got == {("a", "x"): 63, ("a", "y"): 22, ("a", "z"): 115}
