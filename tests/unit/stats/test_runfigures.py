"""Segments, active time and gaps of a run from its metrics snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from draftdata.stats.runfigures import completion_reason
from draftdata.stats.runmetrics import segments_of, union


def snap(writer: str, start: float, elapsed: float, seq: int = 0) -> dict[str, Any]:
    return {
        "writer": writer,
        "time": start + elapsed,
        "elapsed_s": elapsed,
        "key": f"metrics/{writer}-{seq:06d}.json",
    }


def test_commands_one_after_another_add_up_and_leave_gaps() -> None:
    snaps = [snap("a", 0, 5), snap("a", 0, 10, 1), snap("b", 100, 20), snap("c", 300, 7)]
    segs = segments_of(snaps)
    assert [(s.writer, s.start, s.end) for s in segs] == [
        ("a", 0, 10),
        ("b", 100, 120),
        ("c", 300, 307),
    ]
    active, gaps = union(segs)
    assert active == 37 and gaps == [(10, 100), (120, 300)]


def test_parallel_writers_overlap_and_a_reused_writer_id_is_a_new_segment() -> None:
    snaps = [snap("p0", 0, 30), snap("p1", 5, 30), snap("p0", 200, 10)]
    segs = segments_of(snaps)
    assert len(segs) == 3
    active, gaps = union(segs)
    assert active == 45 and gaps == [(35, 200)]


def test_clock_drift_inside_one_process_is_not_a_new_segment() -> None:
    # wall clock and monotonic elapsed drift apart by 5 s over a long run: one process still
    snaps = [snap("a", 0, 1000), snap("a", 5, 86400, 1)]
    assert len(segments_of(snaps)) == 1


@pytest.mark.parametrize(
    ("reasons", "want"),
    [
        ([], "unknown"),
        (["stop"], "stop"),
        (["tool_calls", "stop"], "stop"),
        (["length", "stop"], "length"),
        (["tool_calls", None], "unknown"),
    ],
)
def test_finish_reason_per_completion(reasons: list[str | None], want: str) -> None:
    assert completion_reason(reasons) == want
