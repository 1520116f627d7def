"""Every request refused with the same HTTP 400 (issue 31): generate stops in one line quoting
the server, records nothing, and the fixed command just runs; a few 400s among good answers are
each recorded as before. Against the simulator over real sockets (``--unsupported NAME``,
``--bad-prompts``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, failures, fast_config, write_prompts

from draftdata.errors import FleetUnavailableError
from draftdata.generate.config import Sampling
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet, SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]

# a request field -> the sampling that makes generate send it
SENT_BY = {
    "top_k": Sampling(top_k=20),
    "min_p": Sampling(min_p=0.05),
    "seed": Sampling(seed=7),
    "repetition_penalty": Sampling(repetition_penalty=1.05),
}


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(sorted(SENT_BY)),
    servers=st.integers(1, 2),
    prompts_n=st.sampled_from([1, 5, 40]),
    flavor=st.sampled_from(["sglang", "vllm"]),
)
def test_a_parameter_every_server_refuses_stops_and_records_nothing(
    tmp_path_factory: pytest.TempPathFactory, field: str, servers: int, prompts_n: int, flavor: str
) -> None:
    tmp = tmp_path_factory.mktemp("u")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, prompts_n)
    out = tmp / "run"
    sim = SimConfig(
        flavor=flavor,  # type: ignore[arg-type]
        time_scale=0,
        mean_output_tokens=20,
        unsupported=[field],
    )
    lines: list[str] = []
    with SimFleet(servers, sim) as fleet:
        bad = fast_config(prompts, out, fleet.urls, sampling=SENT_BY[field])
        with pytest.raises(FleetUnavailableError) as info:
            generate(bad, log=lines.append, handle_signals=False)
        line = str(info.value)
        assert "\n" not in line and f"HTTP 400: Unsupported parameter: {field}" in line
        assert failures(out) == [] and completions(out) == []
        # the fixed command (without the option) just runs, over the same --out
        generate(fast_config(prompts, out, fleet.urls), log=lines.append, handle_signals=False)
    assert check_exactly_once(str(out), set(ids)) == (prompts_n, 0)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rate=st.sampled_from([0.02, 0.05, 0.1]), seed=st.integers(0, 50))
def test_a_few_refusals_among_answers_are_each_recorded(
    tmp_path_factory: pytest.TempPathFactory, rate: float, seed: int
) -> None:
    tmp = tmp_path_factory.mktemp("f")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 120)
    out = tmp / "run"
    sim = SimConfig(
        time_scale=0, mean_output_tokens=20, seed=seed, faults=FaultConfig(bad_prompts=rate)
    )
    with SimFleet(1, sim) as fleet:
        generate(
            fast_config(prompts, out, fleet.urls, hedge=False),
            log=lambda _l: None,
            handle_signals=False,
        )
        refused = fleet.servers[0].stats.faults.get("bad_prompt", 0)
    done, failed = check_exactly_once(str(out), set(ids))
    assert failed == refused and done == 120 - refused
    assert {(f.reason, f.message) for f in failures(out)} <= {
        ("invalid_request", "Invalid request: this prompt cannot be rendered (simulated)")
    }


def test_the_cli_stops_in_one_line_and_the_fixed_command_runs(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60)
    out = tmp_path / "run"
    base = [*CLI, "--progress", "off", "--prompts", str(prompts), "--out", str(out)]
    with SimProcess(n=1, args=["--time-scale", "0", "--unsupported", "top_k"]) as sim:
        fleet = ["--fleet", str(sim.fleet_yaml)]
        res = subprocess.run(
            [*base, *fleet, "--top-k", "20"], capture_output=True, text=True, timeout=90
        )
        assert res.returncode == 1, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "Unsupported parameter: top_k" in errors[0], res.stderr
        assert failures(out) == [] and completions(out) == []
        again = subprocess.run([*base, *fleet], capture_output=True, text=True, timeout=90)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "generate: done: 60 completions, 0 failures" in again.stdout
    assert check_exactly_once(str(out), set(ids)) == (60, 0)
