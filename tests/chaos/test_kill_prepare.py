"""``prepare`` killed with SIGKILL at a random moment: the next prepare into the same folder
(``--force``) removes the spool the killed one left (none is left behind), leaves alone the
spool of a live prepare, and writes the same bytes as a prepare never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.prepare.stage import SPOOL_PREFIX, _open_spool

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
ROWS = 20_000


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kill-prepare")
    src = root / "rows.jsonl"
    with src.open("w") as fh:
        for i in range(ROWS):
            q = f"Question {i}: how do the numbers {i % 613} and {i % 97} relate in case {i}?"
            fh.write(json.dumps({"instruction": q, "input": "", "output": f"They do, {i}."}) + "\n")
    cfg = root / "prepare.yaml"
    cfg.write_text(
        f"sources:\n  - {{name: rows, schema: alpaca, path: {src}, domain: math}}\n"
        "seed: 0\nbudget: 5000\n"
    )
    return cfg


def _prepare(cfg: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "prepare", str(cfg), "--out", str(out), "-q", *extra],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _outputs(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and not p.relative_to(out).parts[0].startswith(SPOOL_PREFIX)
    }


@pytest.fixture(scope="module")
def clean(config: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("clean") / "out"
    res = _prepare(config, out)
    assert res.returncode == 0, res.stderr
    assert not list(out.glob(SPOOL_PREFIX + "*"))
    return _outputs(out)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(delay=st.floats(0.0, 1.5))
def test_a_killed_prepares_spool_is_removed_by_the_next(
    config: Path, clean: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory, delay: float
) -> None:
    out = tmp_path_factory.mktemp("killed") / "out"
    proc = subprocess.Popen(
        [*CLI, "prepare", str(config), "--out", str(out), "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    t0 = time.monotonic()
    while not list(out.glob(SPOOL_PREFIX + "*")) and proc.poll() is None:
        assert time.monotonic() - t0 < 120, "prepare never made its spool"
        time.sleep(0.01)
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = list(out.glob(SPOOL_PREFIX + "*"))
    # a live prepare's spool in the same folder (this process holds its lock)
    live, lock = _open_spool(out)
    try:
        res = _prepare(config, out, "--force")
        assert res.returncode == 0, res.stderr
        assert list(out.glob(SPOOL_PREFIX + "*")) == [live], left  # the killed one's is gone
        assert live.is_dir()
    finally:
        lock.close()
    assert _outputs(out) == clean
