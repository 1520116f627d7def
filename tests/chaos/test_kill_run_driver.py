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

from draftdata.store import open_store

pytestmark = pytest.mark.chaos
DRIVER = Path(__file__).with_name("run_driver.py")
N = 1500


def _kill_and_finish(
    url: str, kills: int, seed: int, n: int = N, flush: tuple[int, float] = (7, 0.05)
) -> None:
    rng = random.Random(seed)
    cmd = [sys.executable, str(DRIVER), url, str(n), *(str(f) for f in flush)]
    store = open_store(url)
    for k in range(kills):
        before = len(store.list("completions/"))
        proc = subprocess.Popen(cmd)
        if k % 3 == 2:
            time.sleep(rng.uniform(0.1, 1.2))  # anywhere, start-up included
        else:  # once it commits, at a random moment of its work
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                if len(store.list("completions/")) > before:
                    break
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()  # SIGKILL: no flush, no cleanup
        proc.wait()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
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
    n = 600  # every flush is a PUT to moto and every start reads each shard back: keep it small
    _kill_and_finish(url, kills=4, seed=2, n=n, flush=(15, 0.3))
    _, n_fail = check_exactly_once(url, {f"p{i:05d}" for i in range(n)})
    assert n_fail == len(range(0, n, 13))
