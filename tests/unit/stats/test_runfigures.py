"""Segments, active time and gaps of a run from its metrics snapshots."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    commands=st.lists(
        st.tuples(
            st.floats(3.0, 40.0),  # how long the command answered
            st.integers(5, 60),  # answers it committed
            st.sampled_from(["snapshots", "killed before its first", "killed after its last"]),
        ),
        min_size=1,
        max_size=4,
    ),
    gap=st.floats(3.0, 50.0),
)
def test_a_command_killed_around_its_snapshots_keeps_its_time(
    tmp_path_factory: pytest.TempPathFactory,
    commands: list[tuple[float, int, str]],
    gap: float,
) -> None:
    """Commands one after another, each answering for a while; some killed (SIGKILL) before
    their first metrics snapshot, some after their last: the whole run's time still holds each
    command's answering, bounded by its first request and last answer, and never more than the
    commands ran; the rate is never above the true one."""
    from draftdata.records import Completion, Message, Turn, Usage
    from draftdata.stats.runfigures import run_figures
    from draftdata.store.opener import open_store
    from draftdata.store.run import Run

    root = tmp_path_factory.mktemp("killed")
    snaps: list[dict[str, Any]] = []
    t0 = end = 1_700_000_000.0
    true_s = 0.0
    lower_s = 0.0
    with Run.open(str(root / "run"), settings={}, flush_records=1000, flush_seconds=3600) as run:
        for k, (length, answers, how) in enumerate(commands):
            start = t0 if k == 0 else end + gap
            end = start + length
            latency = min(2.0, length / 2)
            times = [
                start + latency + (length - latency) * (i + 1) / answers for i in range(answers)
            ]
            for i, t in enumerate(times):
                run.add_completion(
                    Completion(
                        id=f"c{k}-{i}",
                        messages=[Message(role="user", content="q")],
                        turns=[Turn(content="a", usage=Usage(completion_tokens=10))],
                        usage=Usage(completion_tokens=10),
                        created=t,
                        latency_s=latency,
                    )
                )
            run.flush()
            true_s += length
            lower_s += times[-1] - (times[0] - latency)
            if how == "snapshots":
                snaps += [snap(f"w{k}", start, length / 2), snap(f"w{k}", start, length, 1)]
            elif how == "killed after its last":
                snaps.append(snap(f"w{k}", start, length / 3))
    fig = run_figures(open_store(str(root / "run")), snaps)
    assert len(fig.segments) == len(commands)
    assert lower_s - 1e-3 <= fig.active_s <= true_s + 1e-3, (fig.active_s, lower_s, true_s)
    rate = fig.output_tokens_per_s
    assert rate is not None and rate >= fig.output_tokens / (true_s + 1e-3)
    assert rate <= fig.output_tokens / (lower_s - 1e-3)
