"""One SIGTERM while the store refuses writes (a full disk: a small tmpfs filled up) ends the
run after the grace period with exit 143 (128 + SIGTERM; issue 24), leaving what was not
committed to the resume, which then finishes the run exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.disk import can_mount, fill, tmpfs
from tests.integration.generate.helpers import write_prompts
from tests.signals import default_signals

from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (a real full disk: ENOSPC from the kernel), unmounted afterwards."""
    if (why := can_mount()) is not None:
        pytest.skip(why)
    try:
        with tmpfs(tmp_path / "disk") as mnt:
            yield mnt
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_sigterm_while_the_disk_is_full_exits_143_after_the_grace_period(
    tmp_path: Path, small_disk: Path
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 2000)
    out = small_disk / "run"
    filler = small_disk / "filler"
    with SimProcess(n=1, args=["--time-scale", "0.05", "--mean-output-tokens", "60"]) as sim:
        cmd = [*CLI, "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
        cmd += ["--endpoint", sim.urls[0], "--max-tokens", "64", "--flush-seconds", "0.3"]
        log = tmp_path / "generate.log"
        with log.open("w") as err:
            gen = subprocess.Popen(
                [*cmd, "--grace-seconds", "2"],
                stdout=err,
                stderr=err,
                preexec_fn=default_signals,
            )
        try:
            deadline = time.monotonic() + 60
            shards = out / "completions"
            while not (shards.exists() and any(shards.glob("*.parquet"))):
                assert time.monotonic() < deadline and gen.poll() is None
                time.sleep(0.1)
            fill(small_disk)
            deadline = time.monotonic() + 30
            while "does not accept writes" not in log.read_text():
                assert time.monotonic() < deadline and gen.poll() is None, log.read_text()
                time.sleep(0.1)
            t0 = time.monotonic()
            gen.send_signal(signal.SIGTERM)
            try:
                gen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("still running 30 s after one SIGTERM: " + log.read_text()[-3000:])
            took = time.monotonic() - t0
        finally:
            if gen.poll() is None:
                gen.kill()
                gen.wait()
        stderr = log.read_text()
        assert gen.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert "draftdata: stopped by SIGTERM; what was written is kept" in stderr
        assert "Traceback" not in stderr
        assert took < 15, stderr[-3000:]
        assert "does not accept writes" in stderr, stderr[-3000:]
        assert "generated again" in stderr

        filler.unlink()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert check_exactly_once(str(out), set(ids)) == (2000, 0)
