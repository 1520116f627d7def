"""One writer per run (DESIGN invariant 6): two real `draftdata generate` processes on one run.

Against the simulator over real sockets, on a local store and on moto's S3 server: the second
command refuses in one line naming the holder while the first runs and nothing is committed
twice; after a kill -9 of the holder the same command takes over at once and completes the run
with every prompt once; a holder that froze (SIGSTOP) past the lease TTL is taken over, and when
it wakes it stops committing and exits 1 with one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3
from tests.signals import default_signals

from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store import open_store

pytestmark = pytest.mark.integration
N = 120
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[SimFleet, SimFleet]]:
    """A slow server (the first command still runs whatever the machine's load) and a fast one
    (the command that finishes the run; endpoints are not run settings)."""
    slow = SimConfig(time_scale=1.0, mean_output_tokens=40, output_sigma=0.2, max_running=2)
    fast = SimConfig(time_scale=0.01, mean_output_tokens=40, output_sigma=0.2, max_running=16)
    with SimFleet(n=1, config=slow) as s, SimFleet(n=1, config=fast) as f:
        yield s, f


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    with path.open("w") as fh:
        for i in range(N):
            msg = {"role": "user", "content": f"question {i}"}
            fh.write(json.dumps({"id": f"q{i:04d}", "messages": [msg]}) + "\n")
    return path


Fleets = tuple[SimFleet, SimFleet]


def _command(prompts: Path, fleet: SimFleet, out: str, *extra: str) -> list[str]:
    cmd = [*CLI, "generate", "--prompts", str(prompts), "--out", out, "--max-tokens", "48"]
    cmd += ["--flush-records", "4", "--flush-seconds", "0.2", "--progress", "off"]
    cmd += ["--grace-seconds", "1", *extra]
    return [*cmd, "--endpoint", fleet.urls[0]]


def _wait_for(what: str, ok: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(ok) and ok():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _committed(out: str) -> int:
    try:
        return len(open_store(out).list("completions/"))
    except Exception:
        return 0


def _ids() -> set[str]:
    return {f"q{i:04d}" for i in range(N)}


def _two_at_once(prompts: Path, fleets: Fleets, out: str) -> None:
    slow, fast = fleets
    first = subprocess.Popen(
        _command(prompts, slow, out),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    try:
        _wait_for("the first to commit", lambda: _committed(out) >= 1)
        second = subprocess.run(
            _command(prompts, fast, out), capture_output=True, text=True, timeout=60
        )
        assert first.poll() is None  # the first still runs
        assert second.returncode == 1, second.stderr
        err = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and "being written by another process" in err[0], second.stderr
        assert f"pid {first.pid}" in err[0] and "since " in err[0] and "host " in err[0]
        assert "Traceback" not in second.stderr
        first.send_signal(signal.SIGTERM)  # stops gracefully, commits, releases the lease
        assert first.wait(timeout=60) == 128 + signal.SIGTERM  # interrupted, resumable
    finally:
        with_kill(first)
    # released: the same command continues at once, on the fast server
    done = subprocess.run(_command(prompts, fast, out), capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert check_exactly_once(out, _ids()) == (N, 0)


def _kill_then_take_over(prompts: Path, fleets: Fleets, out: str) -> None:
    slow, fast = fleets
    first = subprocess.Popen(
        _command(prompts, slow, out), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        _wait_for("the first to commit", lambda: _committed(out) >= 2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert _committed(out) < N // 4  # killed mid-run
    again = subprocess.run(_command(prompts, fast, out), capture_output=True, text=True, timeout=90)
    assert again.returncode == 0, again.stderr
    assert "waiting up to" not in again.stderr  # a gone pid on this node: no TTL to wait out
    assert check_exactly_once(out, _ids()) == (N, 0)


def test_second_generate_refuses_while_the_first_runs_locally(
    tmp_path: Path, prompts: Path, fleet: Fleets
) -> None:
    _two_at_once(prompts, fleet, str(tmp_path / "run"))


def test_kill_9_holder_then_takeover_completes_locally(
    tmp_path: Path, prompts: Path, fleet: Fleets
) -> None:
    _kill_then_take_over(prompts, fleet, str(tmp_path / "run"))


def test_second_generate_refuses_and_takeover_on_s3(
    moto_s3: MotoS3, prompts: Path, fleet: Fleets
) -> None:
    _two_at_once(prompts, fleet, moto_s3.url("lease-two"))
    _kill_then_take_over(prompts, fleet, moto_s3.url("lease-kill"))


def test_frozen_holder_is_taken_over_after_ttl_and_stops_committing(
    tmp_path: Path, prompts: Path, fleet: Fleets
) -> None:
    slow, fast = fleet
    out = str(tmp_path / "run")
    ttl = "1.5"
    first = subprocess.Popen(
        _command(prompts, slow, out, "--lease-ttl", ttl),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        _wait_for("the first to commit", lambda: _committed(out) >= 1)
        os.kill(first.pid, signal.SIGSTOP)  # alive, silent: a hung VM, a zombie worker
        t0 = time.monotonic()
        second = subprocess.run(
            _command(prompts, fast, out, "--lease-ttl", ttl, "--lease-wait", "20"),
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert second.returncode == 0, second.stderr
        assert time.monotonic() - t0 >= 1.5  # waited the silence out
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=60) == 1
        assert first.stderr is not None
        err = first.stderr.read()
        assert "lost the run lease" in err and "Traceback" not in err, err
        # the lease's own error, not a commit bug's "run the same command to resume" (the other
        # process is running the run), and no rejects written into a run it no longer holds
        (line,) = [x for x in err.splitlines() if x.startswith("error:")]
        assert "lost the run lease" in line and "run the same command" not in line, err
    finally:
        with_kill(first)
    # the woken holder committed nothing after the takeover: every prompt exactly once
    assert check_exactly_once(out, _ids()) == (N, 0)


def with_kill(proc: subprocess.Popen[str]) -> None:
    """Make sure a test's child is gone (continued first, in case it is stopped)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
