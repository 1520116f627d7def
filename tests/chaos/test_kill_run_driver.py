"""kill -9 a process writing a Run at random moments, then finish: exactly once, shards whole."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3

pytestmark = pytest.mark.chaos
DRIVER = Path(__file__).with_name("run_driver.py")
N = 1500


def _kill_and_finish(url: str, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(kills):
        proc = subprocess.Popen([sys.executable, str(DRIVER), url, str(N)])
        time.sleep(rng.uniform(0.3, 1.2))
        proc.kill()  # SIGKILL: no flush, no cleanup
        proc.wait()
    done = subprocess.run(
        [sys.executable, str(DRIVER), url, str(N)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "DONE" in done.stdout


def test_kill_9_local(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _kill_and_finish(url, kills=10, seed=1)
    _, n_fail = check_exactly_once(url, {f"p{i:05d}" for i in range(N)})
    assert n_fail == len(range(0, N, 13))


@pytest.mark.integration
def test_kill_9_s3(moto_s3: MotoS3) -> None:
    url = moto_s3.url("chaos")
    _kill_and_finish(url, kills=6, seed=2)
    _, n_fail = check_exactly_once(url, {f"p{i:05d}" for i in range(N)})
    assert n_fail == len(range(0, N, 13))
