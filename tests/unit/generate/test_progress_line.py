"""The plain progress line: numbers a person can read, and the state instead of an ETA when
nothing can move (issue 23)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient

from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.progress import Progress


def endpoint(i: int) -> Endpoint:
    return Endpoint(
        f"http://10.0.0.{i}:30000",
        FakeClient(),
        index=i,
        concurrency=64,
        default_concurrency=64,
        breaker_failures=5,
    )


@settings(max_examples=200, deadline=None)
@given(
    done=st.integers(0, 10**7),
    total=st.integers(0, 10**7),
    already=st.integers(0, 10**6),
    tokens=st.integers(0, 10**11),
    requests=st.integers(0, 10**8),
    failed=st.integers(0, 10**6),
    seconds=st.floats(0.5, 10**5),
    errors=st.integers(0, 10**6),
    state=st.one_of(st.none(), st.sampled_from(["stopping: 68 running", "waiting: no endpoint"])),
)
def test_every_number_has_thousands_separators_and_a_stuck_run_shows_its_state(
    done: int,
    total: int,
    already: int,
    tokens: int,
    requests: int,
    failed: int,
    seconds: float,
    errors: int,
    state: str | None,
) -> None:
    now = [0.0]
    eps = [endpoint(1), endpoint(2)]
    counts = [(0, 0, 0, 0)]
    progress = Progress(
        eps,
        lambda: counts[0],
        total=total + done + already,
        clock=lambda: now[0],
        state=lambda: state,
    )
    progress.already_done = already
    counts[0] = (done, requests, tokens, failed)
    for e in eps:
        e.meter.output_tokens = tokens // 2
        if errors:
            e.meter.errors["timeout"] = errors
    now[0] = seconds
    progress.tick()
    line = progress.line()
    for e in eps:  # endpoint names carry a port, not a count
        line = line.replace(e.name, "EP")
    assert not re.search(r"\d{4}", line.replace(",", " ")), line  # 1234 is written 1,234
    if state is None:
        assert " ETA " in line
    else:
        assert state in line and "ETA" not in line
        assert progress.snapshot()["eta_s"] is None


@given(held=st.sets(st.integers(1, 4)), down=st.sets(st.integers(1, 4)))
def test_a_server_held_out_shows_as_held_in_every_view(held: set[int], down: set[int]) -> None:
    """A server that is up but gets no new work (it refuses what the others answer) shows as
    "held" in the line, the live table and the metrics snapshot, not as "up"; a server whose
    breaker is open shows its breaker's state whatever else."""
    eps = [endpoint(i) for i in range(1, 5)]
    for e in eps:
        e.breaker.state = "down" if e.index in down else "up"
    progress = Progress(eps, lambda: (0, 0, 0, 0), total=10, held=lambda e: e.index in held)
    line = progress.line()
    snap = progress.snapshot()
    table = progress.render().renderables[1]
    states = [str(c) for c in table.columns[1].cells]  # type: ignore[attr-defined]
    for e, shown in zip(eps, states, strict=True):
        want = "down" if e.index in down else ("held" if e.index in held else "up")
        assert f"[{e.name} {want} " in line
        assert snap["endpoints"][e.url]["state"] == want
        assert shown == want
