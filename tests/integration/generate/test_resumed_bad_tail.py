"""A run whose prompts left are only prompts every server refuses (more than 8 of them, fewer
than 16): the first command settled the rest (``--limit``; an interrupt, a stop or a crash
leaves the same tail: refusals held at that moment are not recorded, by design), and the
commands that follow must settle the tail, not stop on it again and again (the run could
never end). The opening's resumed-tail rule stopped a resumed command whose few prompts one
refusal ended more than 8 of, and every rerun met the same prompts; now the fleet is first
asked again a prompt the run answered before (``Dispatcher._ask_before_stopping``): answered,
the refusals are the prompts' own."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import fast_config, write_bad_and_good

from draftdata.generate.engine.opening import FIRST
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration

RATE = 0.3


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(servers=st.integers(1, 2), bad=st.integers(FIRST // 2 + 1, FIRST - 1))
def test_a_resumed_tail_of_refused_prompts_is_settled_not_stopped_on(
    tmp_path_factory: pytest.TempPathFactory, servers: int, bad: int
) -> None:
    tmp = tmp_path_factory.mktemp("t")
    prompts = tmp / "p.jsonl"
    bad_ids, good_ids = write_bad_and_good(prompts, bad=bad, good=40, rate=RATE, bad_first=False)
    out = tmp / "run"
    sim = SimConfig(time_scale=0, mean_output_tokens=20, faults=FaultConfig(bad_prompts=RATE))
    with SimFleet(servers, sim) as fleet:
        generate(fast_config(prompts, out, fleet.urls, limit=40), log=lambda _l: None)
        generate(fast_config(prompts, out, fleet.urls), log=lambda _l: None)
    assert check_exactly_once(str(out), good_ids | bad_ids) == (len(good_ids), len(bad_ids))
