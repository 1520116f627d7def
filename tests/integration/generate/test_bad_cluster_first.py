"""Prompts every server refuses that come first in the file (bad prompts come together: one
source's rows carrying what the template refuses): the first jobs sent are all refused while
the fleet answers the jobs sent beside them. The command is not stopped (the fleet answers this
request): each bad prompt is its Failure, every other prompt answered; a stop here would be
met again by every rerun (the same prompts are sent first), and the run could never end."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import failures, fast_config, write_bad_and_good

from draftdata.generate.engine.opening import FIRST
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration

RATE = 0.3  # the simulator's --bad-prompts share


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
    bad_ids, good_ids = write_bad_and_good(prompts, bad=bad, good=80, rate=RATE, bad_first=True)
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
