"""Endpoint faults are never a prompt's failure (DESIGN invariant 7), seen as a user meets them:
`draftdata generate` in a subprocess against `draftdata fleet sim` servers that pass /health and
/v1/models but refuse every chat request (a rotated key: 401, a renamed model: 404, a server that
is not OpenAI-compatible: 501)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, failures, fast_config, write_prompts

from draftdata.errors import FleetUnavailableError
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet, SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
FAST = ["--time-scale", "0.01", "--mean-output-tokens", "40"]


def run_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--progress", "off", "--flush-seconds", "0.2", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_two_refusing_servers_of_four_fail_no_prompt(tmp_path: Path) -> None:
    """Refusing servers always have free slots; they must not drain the queue into failures."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 300)
    out = tmp_path / "run"
    refuse = ["--refuse", "1:401", "--refuse", "3:404"]
    with SimProcess(n=4, args=[*FAST, *refuse]) as sim:
        res = run_cli("--prompts", str(prompts), "--fleet", str(sim.fleet_yaml), "--out", str(out))
        urls = sim.urls
    assert res.returncode == 0, res.stderr[-3000:]
    assert check_exactly_once(str(out), set(ids)) == (300, 0)
    assert failures(out) == []
    got = completions(out)
    assert {c.endpoint for c in got} <= {urls[0], urls[2]}
    assert {c.attempts for c in got} == {1}  # a refused request is not an attempt of the prompt
    taken = [line for line in res.stderr.splitlines() if "taken out" in line]
    assert len(taken) == 2, res.stderr
    for url, status in ((urls[1], "HTTP 401"), (urls[3], "HTTP 404")):
        mine = [line for line in taken if url + " " in line]
        assert len(mine) == 1 and status in mine[0] and "refuses chat requests" in mine[0]
    assert "generate: done: 300 completions, 0 failures" in res.stdout
    (row,) = [line for line in res.stdout.splitlines() if line.startswith(f"  {urls[1]} now:")]
    assert "down, concurrency" in row and "0 completions this command" in row
    assert "(it refuses chat requests (HTTP 401" in row


def test_every_server_refusing_is_one_line_and_exit_1(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 50)
    out = tmp_path / "run"
    with SimProcess(n=2, args=[*FAST, "--refuse", "0:401", "--refuse", "1:501"]) as sim:
        t0 = time.monotonic()
        res = run_cli("--prompts", str(prompts), "--fleet", str(sim.fleet_yaml), "--out", str(out))
        took = time.monotonic() - t0
        urls = sim.urls
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    line = errors[0]
    assert "every endpoint refuses chat requests" in line
    assert f"{urls[0]} (HTTP 401" in line and f"{urls[1]} (HTTP 501" in line
    assert took < 60  # at once, not after --unavailable-timeout (300 s)
    assert failures(out) == [] and completions(out) == []


def test_endpoint_that_stops_serving_is_a_bounded_stop_and_resumes(tmp_path: Path) -> None:
    """The only endpoint answers 10 requests, then 501 for every POST: after
    --unavailable-timeout, one line per endpoint saying why, exit 1; the same command with a
    working endpoint generates exactly the rest."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60)
    out = tmp_path / "run"
    args = ["--prompts", str(prompts), "--out", str(out), "--concurrency", "1"]
    with SimProcess(n=1, args=[*FAST, "--refuse", "0:501", "--refuse-after", "10"]) as bad:
        t0 = time.monotonic()
        res = run_cli(*args, "--endpoint", bad.urls[0], "--unavailable-timeout", "2")
        took = time.monotonic() - t0
        url = bad.urls[0]
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    out_of_service = [ln for ln in lines if "out of service" in ln]
    assert len(out_of_service) == 1 and url in out_of_service[0]
    assert "HTTP 501" in out_of_service[0]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "no endpoint could serve" in errors[0], res.stderr
    assert re.search(r"--unavailable-timeout 2\b", errors[0])
    assert took < 60
    assert len([ln for ln in lines if "taken out" in ln]) == 1
    first = completions(out)
    assert len(first) == 10 and failures(out) == []
    with SimProcess(n=1, args=FAST) as good:
        again = run_cli(*args, "--endpoint", good.urls[0])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already done before: 10" in again.stdout
    assert check_exactly_once(str(out), set(ids)) == (60, 0)


def test_a_fleet_that_dies_is_a_bounded_stop_naming_why(tmp_path: Path) -> None:
    """The only server crashes for good mid-run: after --unavailable-timeout the run stops
    (FleetUnavailableError, one line per endpoint), never waits forever, and resumes."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 80)
    out = tmp_path / "run"
    lines: list[str] = []
    config = SimConfig(time_scale=0.05, mean_output_tokens=30, max_running=4)
    dying = msgspec.structs.replace(config, faults=FaultConfig(crash_after={0: 20}))
    with SimFleet(1, dying) as fleet:
        cfg = fast_config(prompts, out, fleet.urls, unavailable_timeout=1.5, hedge=False)
        t0 = time.monotonic()
        with pytest.raises(FleetUnavailableError) as info:
            generate(cfg, log=lines.append)
        assert time.monotonic() - t0 < 30
    assert "no endpoint could serve" in str(info.value) and "\n" not in str(info.value)
    (why,) = [line for line in lines if "out of service" in line]
    assert fleet.urls[0] in why and ("connection" in why or "health check" in why)
    done = len(completions(out))
    assert 0 < done < 80 and failures(out) == []
    with SimFleet(1, config) as good:
        generate(fast_config(prompts, out, good.urls))
    assert check_exactly_once(str(out), set(ids)) == (80, 0)
