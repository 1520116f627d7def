"""Prompts every server refuses that come first in the file (bad prompts come together: one
source's rows carrying what the template refuses): the first jobs sent are all refused while
the fleet answers the jobs sent beside them. The command is not stopped (the fleet answers this
request): each bad prompt is its Failure, every other prompt answered; a stop here would be
met again by every rerun (the same prompts are sent first), and the run could never end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import failures, fast_config

from draftdata.generate.engine.opening import FIRST
from draftdata.generate.stage import generate
from draftdata.sim.answers import digest
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration

RATE = 0.3  # the simulator's --bad-prompts share


def _write(path: Path, bad: int, good: int) -> tuple[set[str], set[str]]:
    """``bad`` prompts the simulator refuses first, then ``good`` ones it answers."""
    rows: dict[bool, list[dict[str, object]]] = {True: [], False: []}
    i = 0
    while len(rows[True]) < bad or len(rows[False]) < good:
        text = f"Question {i} about item {i}."
        is_bad = digest("bad prompt", text) < RATE * 2**64
        if len(rows[is_bad]) < (bad if is_bad else good):
            kind = "b" if is_bad else "g"
            rows[is_bad].append(
                {"id": f"{kind}-{i:05d}", "messages": [{"role": "user", "content": text}]}
            )
        i += 1
    with path.open("w", encoding="utf-8") as f:
        for row in rows[True] + rows[False]:
            f.write(json.dumps(row) + "\n")
    return {str(r["id"]) for r in rows[True]}, {str(r["id"]) for r in rows[False]}


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    servers=st.integers(1, 3),
    bad=st.integers(FIRST, 2 * FIRST),
    order=st.sampled_from(["file", "length"]),
)
def test_a_cluster_of_bad_prompts_sent_first_does_not_stop_a_fleet_that_answers(
    tmp_path_factory: pytest.TempPathFactory, servers: int, bad: int, order: str
) -> None:
    tmp = tmp_path_factory.mktemp("c")
    prompts = tmp / "p.jsonl"
    bad_ids, good_ids = _write(prompts, bad, 80)
    out = tmp / "run"
    sim = SimConfig(time_scale=0.05, mean_output_tokens=40, faults=FaultConfig(bad_prompts=RATE))
    with SimFleet(servers, sim) as fleet:
        generate(
            fast_config(prompts, out, fleet.urls, order=order),
            log=lambda _l: None,
            handle_signals=False,
        )
    assert {f.id for f in failures(out)} == bad_ids
    assert check_exactly_once(str(out), bad_ids | good_ids) == (len(good_ids), len(bad_ids))
