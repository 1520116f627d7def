"""kill -9 of `hidden-states --engine vllm` at random moments, then the same command: no sample
rewritten, none missing, none wrong; the fleet (the simulator in its own process, speaking
vLLM's hidden-states protocol) keeps running across the kills."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from tests.integration.hidden.simfleet import (  # noqa: E402
    AUX,
    FLEET_LAYERS,
    HIDDEN,
    check_files,
    write_model,
    write_samples,
)

from draftdata.sim.run import SimProcess  # noqa: E402

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


def _files(root: Path) -> dict[str, tuple[int, int]]:
    folder = root / "hidden_states"
    if not folder.is_dir():
        return {}
    # (a dot-file is the local store's temporary of a write a kill cut short, store/local.py)
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in folder.iterdir()
        if not p.name.startswith(".")
    }


@pytest.mark.timeout(600)
def test_kill_9_then_resume(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    model = write_model(tmp_path / "model")
    samples = write_samples(tmp_path / "tok", 120, hi=90)
    args = [
        "--flavor", "vllm", "--model", "target", "--time-scale", "1",
        "--hidden-states", str(staging), "--hidden-layers", ",".join(map(str, FLEET_LAYERS)),
        "--hidden-size", str(HIDDEN), "--hidden-write-seconds", "0.05",
    ]  # fmt: skip
    out = tmp_path / "set"
    cmd = [
        *CLI, "hidden-states", str(tmp_path / "tok"), "--model", str(model), "--out", str(out),
        "--format", "speculators", "--layers", ",".join(map(str, AUX)), "--engine", "vllm",
        "--batch-tokens", "300", "--verify", "2", "-q",
    ]  # fmt: skip
    rng = random.Random(7)
    (tmp_path / "fleet").mkdir()
    with SimProcess(n=2, args=args, workdir=tmp_path / "fleet") as fleet:
        cmd += ["--fleet", str(fleet.fleet_yaml)]
        kills = 0
        for _ in range(4):
            before = _files(out)
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 120
            wanted = len(before) + rng.randint(3, 15)
            while time.monotonic() < deadline and proc.poll() is None:
                if len(_files(out)) >= wanted:
                    break
                time.sleep(0.02)
            if proc.poll() is not None:
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            after = _files(out)
            # nothing committed before this command was rewritten by it
            assert {k: after[k] for k in before} == before
        assert kills >= 1
        time.sleep(1.0)  # the servers finish writing what the killed commands asked
        started = time.time()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    job = {"tmp": tmp_path, "samples": samples, "staging": tmp_path / "none"}
    (tmp_path / "none").mkdir()
    check_files(job)  # every sample, its own states, exactly once (one file per row)
    index = pq.read_table(out / "hidden_index.parquet").to_pylist()
    assert sorted(_files(out)) == sorted(Path(r["file"]).name for r in index)
    # what the killed commands had in flight is bounded by their requests, and the last
    # command left none of its own
    left = list(staging.iterdir())
    assert all(p.stat().st_mtime < started for p in left), sorted(p.name for p in left)
