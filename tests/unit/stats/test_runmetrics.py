"""Run metrics snapshots: the engine's shape (progress + series, final summary) and variants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.stats.runmetrics import headline, throughput_series

E1 = "http://127.0.0.1:30000/v1"


def _writer(name: str, start: float, rate: float, total: int = 12) -> list[dict[str, Any]]:
    """Two progress snapshots (series every 2 s) and the final summary of one command that
    commits ``rate`` tokens/s on E1 for 20 s, starting at clock ``start``."""
    snaps: list[dict[str, Any]] = []
    for k in (1, 2):
        elapsed = 10.0 * k
        series = [[t, t, rate * t, {E1: rate * t}] for t in range(10 * k - 8, 10 * k + 1, 2)]
        snaps.append(
            {
                "writer": name,
                "kind": "progress",
                "time": start + elapsed,
                "elapsed_s": elapsed,
                "completed": 5 * k,
                "failed": 0,
                "endpoints": {E1: {"output_tokens": rate * elapsed, "tokens_per_s": rate}},
                "series": series,
            }
        )
    snaps.append(
        {
            "writer": name,
            "kind": "summary",
            "total": total,
            "completed": 10,
            "failed": {"timeout": 1},
            "output_tokens": int(rate * 20),
            "wall_s": 20.0,
            "endpoints": [{"url": E1, "output_tokens": int(rate * 20), "errors": {"timeout": 1}}],
        }
    )
    return snaps


def test_engine_shape_one_writer() -> None:
    snaps = _writer("w1", 1000.0, 10.0)
    h = headline(snaps)
    assert h is not None
    assert (h["completed"], h["failed"], h["output_tokens"], h["wall_s"]) == (10, 1, 200, 20.0)
    assert h["output_tokens_per_s"] == 10.0
    assert h["endpoints"] == {E1: {"completed": 0, "output_tokens": 200, "errors": 1}}
    series = throughput_series(snaps)
    assert list(series) == [E1]
    xs = [x for x, _ in series[E1]]
    assert xs == sorted(xs) and 0 < xs[0] < xs[-1] < 20
    assert all(r == pytest.approx(10.0) for _, r in series[E1])


def test_parallel_writers_add_up_and_a_resume_follows_on() -> None:
    parallel = _writer("a", 1000.0, 10.0) + _writer("b", 1000.0, 5.0)
    series = throughput_series(parallel)[E1]
    assert all(r == pytest.approx(15.0) for _, r in series)
    h = headline(parallel)
    assert h is not None and h["wall_s"] == 20.0 and h["output_tokens"] == 300

    resumed = _writer("a", 1000.0, 10.0) + _writer("c", 1040.0, 20.0)
    points = throughput_series(resumed)[E1]
    assert points[-1][0] > 40  # the second command is placed after the first on the time axis
    early = [r for x, r in points if x < 20]
    gap = [r for x, r in points if 21 < x < 39]
    late = [r for x, r in points if x > 41]
    assert early and all(r == pytest.approx(10.0) for r in early)
    assert gap and all(r == 0 for r in gap)
    assert late and all(r == pytest.approx(20.0) for r in late)


def test_variants_and_nothing_useful() -> None:
    """Endpoints as a list of rows, ISO times, failed as a mapping: all understood."""
    snaps = [
        {
            "writer": "w",
            "time": f"2026-12-03T10:00:{10 * t:02d}+00:00",
            "summary": {
                "completed": 2 * t,
                "failed": {"context_length": t},
                "output_tokens": 50 * t,
                "wall_s": 10.0 * t,
                "endpoints": [{"url": "http://a", "output_tokens": 50 * t, "completed": t}],
            },
        }
        for t in range(3)
    ]
    h = headline(snaps)
    assert h is not None
    assert h["completed"] == 4 and h["failed"] == 2 and h["output_tokens_per_s"] == 5.0
    assert h["endpoints"] == {"http://a": {"completed": 2, "output_tokens": 100, "errors": 0}}
    assert throughput_series(snaps) == {"http://a": [(5.0, 5.0), (15.0, 5.0)]}
    assert headline([{"writer": "w", "note": "nothing useful"}]) is None
    assert headline([]) is None
    assert throughput_series([]) == {}
    assert throughput_series([{"writer": "w", "time": 5.0, "elapsed_s": 0.0}]) == {}


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.integers(0, 500), min_size=2, max_size=40),
    stale=st.lists(st.tuples(st.integers(0, 39), st.floats(0.01, 0.9)), max_size=6),
)
def test_the_series_integrates_to_the_tokens_whatever_stale_readings_come_between(
    steps: list[int], stale: list[tuple[int, float]]
) -> None:
    """A cumulative counter read at times that drift (a snapshot's endpoint row, timed by its
    own clock, may land after a later series entry) must never count a token twice: a reading
    lower than one already seen is stale, not a restart of the count."""
    totals = [sum(steps[: k + 1]) for k in range(len(steps))]
    series: list[list[Any]] = [[float(k + 1), k, v, {E1: v}] for k, v in enumerate(totals)]
    for k, frac in stale:  # an older (lower) reading placed just after a newer one
        if 0 < k < len(totals):
            series.append([k + 1 + frac, k, totals[k - 1], {E1: totals[k - 1]}])
    snap = {
        "writer": "w",
        "kind": "progress",
        "time": 1000.0 + len(steps),
        "elapsed_s": float(len(steps)),
        "endpoints": {E1: {"output_tokens": totals[-1]}},
        "series": series,
    }
    points = throughput_series([snap]).get(E1, [])
    if totals[-1] == 0:
        return
    width = points[1][0] - points[0][0] if len(points) > 1 else 2 * points[0][0]
    assert sum(r for _, r in points) * width == pytest.approx(totals[-1], rel=1e-3, abs=0.5)
