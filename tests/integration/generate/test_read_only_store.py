"""A run store whose file system turns read-only mid-run (remounted so, as the kernel does
after an I/O error) stops generate in one line, what it committed kept: waiting cannot make it
writable, so it is no outage to wait out (a full disk is: space can be freed). The same
command on a writable copy then finishes the run exactly once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.disk import can_mount, read_only, tmpfs
from tests.integration.generate.helpers import write_prompts
from tests.signals import default_signals

from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    if (why := can_mount()) is not None:
        pytest.skip(why)
    try:
        with tmpfs(tmp_path / "disk", size="16m") as mnt:
            yield mnt
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_a_store_that_turns_read_only_mid_run_stops_in_one_line(tmp_path: Path, disk: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 600)
    out = disk / "run"
    with SimProcess(n=1, args=["--time-scale", "0.05", "--mean-output-tokens", "60"]) as sim:
        cmd = [*CLI, "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
        cmd += ["--endpoint", sim.urls[0], "--max-tokens", "64", "--flush-seconds", "0.3"]
        log = tmp_path / "generate.log"
        with log.open("w") as err:
            gen = subprocess.Popen(cmd, stdout=err, stderr=err, preexec_fn=default_signals)
        try:
            deadline = time.monotonic() + 60
            shards = out / "completions"
            while not (shards.exists() and any(shards.glob("*.parquet"))):
                assert time.monotonic() < deadline and gen.poll() is None, log.read_text()
                time.sleep(0.1)
            read_only(disk)
            try:
                gen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("still waiting 60 s after its store turned read-only")
        finally:
            if gen.poll() is None:
                gen.kill()
                gen.wait()
        stderr = log.read_text()
        assert gen.returncode == 1, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]
        assert "the file system is read-only" in last and "free space" not in last, last
        committed = len(list(shards.glob("*.parquet")))
        assert committed >= 1
        # the same command on a writable copy of what was committed finishes the run
        copy = tmp_path / "run"
        shutil.copytree(out, copy)
        cmd[cmd.index("--out") + 1] = str(copy)
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    check_exactly_once(str(copy), set(ids))
