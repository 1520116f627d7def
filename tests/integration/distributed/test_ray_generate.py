"""``generate --ray`` on a local Ray instance (2 CPUs) against simulated fleets.

Checked end to end with the real engine: a Ray run commits the same ids as a single-process
run on the same prompts, exactly once, into an S3 run store (moto); each node reads its own
fleet file; rerunning resumes (``--only-partitions`` first, then all, through the CLI); a
partition whose worker is killed mid-run is retried by Ray and regenerates only what was not
committed; Ctrl-C on the driver stops every partition.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3
from typer.testing import CliRunner

from draftdata.cli import app
from draftdata.distributed.progress import Tracker
from draftdata.distributed.ray_generate import RayOptions, run, summary_lines
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store import iter_completions

pytestmark = [pytest.mark.integration, pytest.mark.ray]
N_PROMPTS = 48


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    with path.open("w") as fh:
        for i in range(N_PROMPTS):
            row = {
                "id": f"q{i:04d}",
                "source": "test",
                "domain": ("code", "math", "general")[i % 3],
                "messages": [{"role": "user", "content": f"question {i}: what is {i} + {i}?"}],
            }
            fh.write(json.dumps(row) + "\n")
    return path


def _config(prompts: Path, out: str, **changes: Any) -> GenerateConfig:
    base: dict[str, Any] = {
        "max_tokens": 64,
        "flush_records": 4,
        "flush_seconds": 0.2,
        "progress": "off",
        "log_interval": 0.5,
    }
    return GenerateConfig(prompts=str(prompts), out=out, **{**base, **changes})


def _opts(**changes: Any) -> RayOptions:
    base: dict[str, Any] = {
        "partitions": 4,
        "tasks_per_node": 2,
        "report_s": 0.2,
        "probe_timeout_s": 2.0,
    }
    return RayOptions(**{**base, **changes})


def test_ray_run_equals_single_process_run_on_s3(
    ray_local: Any, fleet: SimFleet, prompts: Path, tmp_path: Path, moto_s3: MotoS3
) -> None:
    ids = {f"q{i:04d}" for i in range(N_PROMPTS)}
    # A fleet file per node, found through the template (this machine is the only node).
    fleet.write(tmp_path / f"fleet-{socket.gethostname()}.yaml")
    template = str(tmp_path / "fleet-{node}.yaml")
    out = moto_s3.url("ray-gen")
    lines: list[str] = []

    first = run(
        _config(prompts, out), _opts(fleet_per_node=template, only=[0, 2]), log=lines.append
    )
    assert sorted(o.index for o in first.outcomes) == [0, 2]
    assert all(o.state == "done" for o in first.outcomes)
    assert any("fleet-" in line and "2/2 endpoints answer" in line for line in lines)
    # Plain progress lines (no TTY): aggregate counts, rates and each node's throughput.
    progress = [line for line in lines if " committed, " in line]
    assert progress and f"; {socket.gethostname()} " in progress[-1]
    assert "tok/s" in progress[-1] and "partitions " in progress[-1]

    # The rest through the CLI, which resumes 0 and 2 (nothing new) and runs 1 and 3.
    args = ["generate", "--prompts", str(prompts), "--out", out, "--max-tokens", "64"]
    args += ["--progress", "off", "--ray", "--partitions", "4", "--tasks-per-node", "2"]
    args += ["--fleet-per-node", template]
    cli = CliRunner().invoke(app, args)
    assert cli.exit_code == 0, cli.output
    assert f"node {socket.gethostname()}: 4 partition(s)" in cli.output
    found = re.search(r"ray generate: (\d+) records committed", cli.output)
    assert found, cli.output
    committed = int(found.group(1))
    assert first.committed + committed == N_PROMPTS
    check_exactly_once(out, ids)

    # The same prompts through one process of the same engine.
    single = str(tmp_path / "single")
    generate(_config(prompts, single, endpoints=fleet.urls))
    check_exactly_once(single, ids)
    by_id = {c.id: (c.domain, len(c.turns)) for c in iter_completions(out)}
    assert by_id == {c.id: (c.domain, len(c.turns)) for c in iter_completions(single)}

    # Other settings into the same run: every partition refuses (an application error, so
    # Ray does not retry it), nothing is written, the summary says what to do.
    changed = _config(prompts, out, max_tokens=32)
    refused = run(changed, _opts(partitions=2, fleet_per_node=template), log=lines.append)
    assert refused.failed_partitions == [0, 1] and refused.committed == 0
    assert all(o.attempts == 1 and "RunMismatchError" in (o.error or "") for o in refused.outcomes)
    assert "partitions not finished: 0,1" in summary_lines(refused)[-1]
    check_exactly_once(out, ids)


@pytest.mark.chaos
def test_killed_partition_is_retried_without_duplicates(
    ray_local: Any, prompts: Path, tmp_path: Path
) -> None:
    out = str(tmp_path / "run")
    killed: list[int] = []

    def kill_one(tracker: Tracker) -> None:
        if killed:
            return
        for part in tracker.parts:
            attempt = part.attempts[-1] if part.attempts else None
            if part.state == "running" and attempt is not None and attempt.committed >= 2:
                os.kill(attempt.pid, signal.SIGKILL)
                killed.append(part.index)
                return

    # Slower answers (~250 ms), one at a time per server, so a partition runs for seconds.
    slow = SimConfig(mean_output_tokens=24, min_output_tokens=8, time_scale=0.5, reasoning="off")
    with SimFleet(2, slow) as fleet:
        config = _config(prompts, out, endpoints=fleet.urls, concurrency=1, hedge=False)
        result = run(config, _opts(partitions=2), on_progress=kill_one)
        served = sum(fleet.stats(i).served for i in range(2))
    assert killed, "no partition was seen committing before it finished"
    assert not result.failed_partitions
    outcome = next(o for o in result.outcomes if o.index == killed[0])
    assert outcome.attempts == 2 and outcome.state == "done"
    check_exactly_once(out, {f"q{i:04d}" for i in range(N_PROMPTS)})
    # The retry skipped what the killed attempt had committed: the servers answered each
    # prompt once, plus at most the killed attempt's unflushed buffer and its request in flight.
    assert N_PROMPTS <= served <= N_PROMPTS + config.flush_records + 2
    assert "after 2 attempt(s)" in "\n".join(summary_lines(result))


def test_interrupted_driver_stops_every_partition(
    ray_local: Any, prompts: Path, tmp_path: Path
) -> None:
    out = str(tmp_path / "run")
    pressed: list[int] = []
    running: list[int] = []

    def ctrl_c(tracker: Tracker) -> None:
        running.append(tracker.counts()["running"])
        if not pressed and tracker.committed >= 2:
            pressed.append(tracker.committed)
            raise KeyboardInterrupt

    slow = SimConfig(mean_output_tokens=24, min_output_tokens=8, time_scale=0.5, reasoning="off")
    with SimFleet(2, slow) as fleet:
        config = _config(prompts, out, endpoints=fleet.urls, concurrency=1, hedge=False)
        # 4 partitions, 2 at a time: two are running when Ctrl-C comes, two never start.
        lines: list[str] = []
        stopped = run(config, _opts(partitions=4), on_progress=ctrl_c, log=lines.append)
        assert pressed and stopped.interrupted
        assert max(running) <= 2  # --tasks-per-node 2: never more engines at once
        assert any("interrupted; stopping partitions" in line for line in lines)
        assert stopped.failed_partitions and stopped.committed < N_PROMPTS
        assert "to resume: run the same command again" in "\n".join(summary_lines(stopped))
    # What was committed reads whole, once (resuming a cut partition is the kill test's part).
    committed = {c.id for c in iter_completions(out)}
    assert len(committed) == stopped.committed
    check_exactly_once(out, committed)
