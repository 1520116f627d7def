"""kill -9 the real `draftdata generate` at random moments against the simulator, resume each
time, and check exactly-once: every prompt id is in exactly one committed completion or exactly
one failure, and every shard reads whole (local store, and once against moto's S3 server)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3

from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store import iter_failures, open_store

pytestmark = pytest.mark.chaos
N = 200
LONG = {f"q{i:04d}" for i in range(N) if i % 17 == 0}  # over the context: fatal failures
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    # ~100 ms per answer, 3 decoding per server: a full run takes a few seconds of work
    config = SimConfig(time_scale=0.1, mean_output_tokens=40, max_running=3, context_length=512)
    with SimFleet(n=2, config=config) as f:
        yield f


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    with path.open("w") as fh:
        for i in range(N):
            pid = f"q{i:04d}"
            words = 600 if pid in LONG else 6
            msg = {"role": "user", "content": "word " * words + f"question {i}"}
            fh.write(json.dumps({"id": pid, "messages": [msg]}) + "\n")
    return path


def _command(prompts: Path, fleet: SimFleet, out: str) -> list[str]:
    cmd = [*CLI, "generate", "--prompts", str(prompts), "--out", out, "--max-tokens", "64"]
    cmd += ["--flush-records", "5", "--flush-seconds", "0.2", "--progress", "off"]
    for url in fleet.urls:
        cmd += ["--endpoint", url]
    return cmd


def _shards(out: str) -> int:
    return len(open_store(out).list("completions/"))


def _kill_and_resume(cmd: list[str], out: str, kills: int, seed: int) -> int:
    """Kill the generate process ``kills`` times, resume to completion; returns mid-run kills."""
    rng = random.Random(seed)
    mid_run = 0
    for k in range(kills):
        before = _shards(out)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if k % 3 == 2:
                time.sleep(rng.uniform(0.1, 1.5))  # anywhere: imports, Run.open, discovery
            else:
                deadline = time.monotonic() + 30
                while proc.poll() is None and time.monotonic() < deadline:
                    if _shards(out) > before:  # it is committing: kill while it works
                        break
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                mid_run += 1
        finally:
            proc.send_signal(signal.SIGKILL)  # no flush, no cleanup
            proc.wait()
    final = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert final.returncode == 0, final.stderr[-3000:]
    return mid_run


def _check(out: str) -> None:
    n_comp, _ = check_exactly_once(out, {f"q{i:04d}" for i in range(N)})
    assert n_comp == N - len(LONG)
    assert {f.id for f in iter_failures(out)} == LONG
    assert {f.reason for f in iter_failures(out)} == {"context_length"}


def test_kill_9_generate_local(tmp_path: Path, prompts: Path, fleet: SimFleet) -> None:
    out = str(tmp_path / "run")
    mid_run = _kill_and_resume(_command(prompts, fleet, out), out, kills=10, seed=7)
    assert mid_run >= 8  # the kills really interrupted work
    _check(out)
    # a further rerun finds nothing to do and sends no request
    served = fleet.stats(0).requests + fleet.stats(1).requests
    again = subprocess.run(
        _command(prompts, fleet, out), capture_output=True, text=True, check=False, timeout=120
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert fleet.stats(0).requests + fleet.stats(1).requests == served


@pytest.mark.integration
def test_kill_9_generate_s3(moto_s3: MotoS3, prompts: Path, fleet: SimFleet) -> None:
    out = moto_s3.url("chaos-generate")
    mid_run = _kill_and_resume(_command(prompts, fleet, out), out, kills=3, seed=8)
    assert mid_run >= 2
    _check(out)


def test_a_command_killed_before_its_first_metrics_snapshot_keeps_its_time(
    tmp_path: Path, prompts: Path, fleet: SimFleet
) -> None:
    """kill -9 a generate after it committed some answers and before its first metrics snapshot
    (every 60 s): the whole run's figures still hold that command's answering time, bounded by
    its first request and last answer and never more than it lived; the tokens/s over the whole
    run is no more than its committed tokens over the time the commands really ran."""
    from draftdata.records import Completion
    from draftdata.stats.runfigures import run_figures
    from draftdata.stats.runmetrics import UNLOGGED
    from draftdata.store import iter_completions

    out = str(tmp_path / "run")
    cmd = _command(prompts, fleet, out)
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline and _shards(out) < 4:
            time.sleep(0.05)
        assert proc.poll() is None, "generate ended before it was killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lived = time.time() - started
    assert not open_store(out).list("metrics/")  # killed before its first snapshot
    killed: list[Completion] = list(iter_completions(out))
    assert killed
    first = min(c.created - c.latency_s for c in killed)
    last = max(c.created for c in killed)
    rest_started = time.time()
    final = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert final.returncode == 0, final.stderr[-3000:]
    rest = time.time() - rest_started
    fig = run_figures(open_store(out))
    assert len(fig.segments) == 2 and fig.segments[0].writer == UNLOGGED, fig.segments
    seg = fig.segments[0]
    assert seg.start == pytest.approx(first, abs=1e-3) and seg.end == pytest.approx(last, abs=1e-3)
    assert last - first <= seg.seconds + 1e-3 <= lived
    assert fig.active_s <= lived + rest
    rate = fig.output_tokens_per_s
    bound = last - first + fig.segments[1].seconds - 2e-3  # active_s is rounded to 1 ms
    assert rate is not None and rate <= fig.output_tokens / bound
