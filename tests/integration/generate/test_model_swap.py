"""A server restarted mid-run serving another model on the same URL (issue 24) is refused as at
start and on resume: the endpoint stays out with one line naming both models, the run goes on
with the other endpoint, and every completion is the run's model."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, write_prompts

from draftdata.sim.run import SimProcess
from draftdata.store.read import iter_completions

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
SLOW = ["--time-scale", "0.5", "--mean-output-tokens", "40"]


def _committed(out: Path) -> int:
    try:
        return sum(1 for _ in iter_completions(str(out)))
    except Exception:  # nothing written yet
        return 0


def test_a_server_back_with_another_model_is_not_adopted(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 300)
    out = tmp_path / "run"
    with (
        SimProcess(n=1, args=[*SLOW, "--model", "target-A"]) as first,
        SimProcess(n=1, args=[*SLOW, "--model", "target-A"]) as other,
    ):
        swapped = first.urls[0]
        port = swapped.rsplit(":", 1)[1]
        cmd = [*CLI, "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
        cmd += ["--endpoint", swapped, "--endpoint", other.urls[0], "--concurrency", "4"]
        cmd += ["--max-tokens", "64", "--flush-seconds", "0.2"]
        gen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while _committed(out) < 20 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert gen.poll() is None, "the run ended before the swap"
            first.kill()
            with SimProcess(n=1, args=[*SLOW, "--model", "target-B", "--port-base", port]) as b:
                assert b.urls == [swapped]
                _, stderr = gen.communicate(timeout=150)
        finally:
            if gen.poll() is None:
                gen.kill()
                gen.wait()
    assert gen.returncode == 0, stderr[-3000:]
    assert check_exactly_once(str(out), set(ids)) == (300, 0)
    models = Counter(c.model for c in completions(out))
    assert models == Counter({"target-A": 300}), models
    said = [x for x in stderr.splitlines() if swapped + " " in x and "'target-B'" in x]
    assert len(said) == 1, stderr[-3000:]
    assert "'target-A'" in said[0]
