"""A store outage that outlasts the run lease many times over, under a real `draftdata generate`
on S3 (moto's server behind a switchable proxy): dispatch pauses while too many records wait, one
log line per change of state, memory stays bounded, and every prompt is committed exactly once.

The outage is timed by what the process says and by its lease: it starts when the first shard is
committed, goes on until generate says dispatch paused and the lease has been silent for several
TTLs (a short ``--lease-ttl``: with the default 30 s that is the minute-long outage of a real
store). A refusal that waiting cannot cure (access denied, expired credentials) is no outage:
``test_store_refusals.py`` stops on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3
from tests.integration.generate.helpers import write_prompts
from tests.integration.generate.s3_outage import S3Outage

from draftdata.sim.run import SimConfig, SimFleet

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
BOUND = 100
LEASE_TTL = 2.0  # the outage outlasts it several times: no heartbeat lands, no commit may


def _wait_for(done: Callable[[], bool], timeout: float, what: str, proc: Any, err: Path) -> None:
    """Poll ``done`` until it holds; AssertionError naming ``what`` after ``timeout`` s or when
    the process ends first."""
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"generate ended while waiting for {what}: {err.read_text()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s: {err.read_text()}"
        time.sleep(0.05)


def _served(fleet: SimFleet) -> int:
    return sum(fleet.stats(i).served for i in range(2))


class _RssSampler:
    """Samples a process's resident set (VmRSS, KiB) from /proc while the test runs, so the
    check is on growth during the outage, not on the absolute size of an interpreter whose
    imports and thread pools differ between machines."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, str, int]] = []  # (seconds into the phase, phase, KiB)
        self.phase = "start"
        self._phase_start = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def enter(self, phase: str) -> None:
        self._phase_start = time.monotonic()
        self.phase = phase

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                text = Path(f"/proc/{self.pid}/status").read_text(encoding="ascii")
            except OSError:
                return
            for line in text.splitlines():
                if line.startswith("VmRSS:"):
                    kib = int(line.split()[1])
                    self.samples.append((time.monotonic() - self._phase_start, self.phase, kib))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, phase: str, until: float = float("inf")) -> int:
        """The largest sample of ``phase`` taken within ``until`` seconds of its start."""
        return max((kib for t, p, kib in self.samples if p == phase and t <= until), default=0)

    def timeline(self) -> str:
        return ", ".join(f"{t:.0f}s {p} {kib // 1024}" for t, p, kib in self.samples[::10])


def _shards(moto_s3: MotoS3, out: str) -> int:
    client: Any = moto_s3.client()
    prefix = out.split("/", 3)[3] + "/completions/"
    return int(client.list_objects_v2(Bucket=moto_s3.bucket, Prefix=prefix).get("KeyCount", 0))


def test_s3_outage_longer_than_the_lease_pauses_dispatch_and_loses_nothing(
    tmp_path: Path, moto_s3: MotoS3
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 400)
    out = moto_s3.url("outage")
    gen = tmp_path / "gen.yaml"
    gen.write_text("store_retry_max: 3\n", encoding="utf-8")
    summary_json = tmp_path / "summary.json"
    errs = tmp_path / "err.txt"
    config = SimConfig(time_scale=0.3, mean_output_tokens=60, output_sigma=0.3, max_running=8)
    with SimFleet(2, config) as fleet, S3Outage(moto_s3.endpoint_url) as proxy:
        cmd = [*CLI, "--prompts", str(prompts), "--out", out, "--config", str(gen)]
        cmd += ["--progress", "off", "--flush-records", "16", "--flush-seconds", "0.5"]
        cmd += ["--max-uncommitted", str(BOUND), "--summary-json", str(summary_json)]
        cmd += ["--lease-ttl", str(LEASE_TTL)]
        for url in fleet.urls:
            cmd += ["--endpoint", url]
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url, "DRAFTDATA_S3_MAX_ATTEMPTS": "2"}
        with errs.open("w") as err, (tmp_path / "out.txt").open("w") as std:
            proc = subprocess.Popen(cmd, stdout=std, stderr=err, env=env)
            rss = _RssSampler(proc.pid)
            try:
                _wait_for(lambda: _shards(moto_s3, out) > 0, 60, "first shard", proc, errs)
                served_before = _served(fleet)
                rss.enter("outage")
                proxy.mode = "503"  # S3 overloaded / unreachable ...
                began = time.monotonic()
                _wait_for(
                    lambda: (
                        "dispatch paused" in errs.read_text()
                        and time.monotonic() - began > 3 * LEASE_TTL
                    ),
                    120,
                    "pause of dispatch, three lease TTLs into the outage",
                    proc,
                    errs,
                )
                served_during = _served(fleet) - served_before
                proxy.mode = "ok"
                rss.enter("after")
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        break
                    time.sleep(0.1)
                else:
                    raise AssertionError("generate did not finish after the outage")
                proc.returncode = os.waitstatus_to_exitcode(status)
            finally:
                rss.stop()
                if proc.returncode is None:
                    proc.kill()
                    proc.wait()
    stderr = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, stderr[-3000:]
    assert proxy.failed > 0
    # every prompt committed exactly once, nothing failed
    assert check_exactly_once(out, set(ids)) == (400, 0)
    # dispatch paused: what the fleet answered during the outage is bounded by the buffer
    assert served_during <= BOUND + 16 + 64, served_during
    summary = json.loads(summary_json.read_text())
    assert summary["completed"] == 400
    assert BOUND < summary["peak_uncommitted"] <= BOUND + 64
    # one line per change of state, not one per retry
    lines = stderr.splitlines()
    for text in (
        "the store does not accept writes",
        "the store accepts writes again",
        "dispatch paused",
        "dispatch resumed",
    ):
        assert sum(text in line for line in lines) == 1, (text, stderr[-3000:])
    assert len(lines) < 20, stderr
    # no pile-up in memory: the resident set stays within a small margin of what it was in the
    # outage's first seconds (a pile-up grows with the outage's length). Not wait4's ru_maxrss:
    # on Linux a spawned child's ru_maxrss starts from the *parent's* high-water mark (exec
    # keeps the old mm's peak), so after a long suite it reports the pytest process's size
    early, during = rss.peak("outage", until=5.0), rss.peak("outage")
    print(
        f"peak RSS in the outage's first 5 s {early // 1024} MiB, whole outage {during // 1024} MiB"
    )
    print(f"process peak {usage.ru_maxrss // 1024} MiB; timeline (MiB): {rss.timeline()}")
    print(f"proxy: {proxy.forwarded} forwarded, {proxy.failed} failed, {proxy.truncated} dropped")
    assert early > 0, rss.samples
    assert during - early < 64 * 1024, rss.timeline()


def test_store_down_when_every_prompt_is_answered_waits_and_commits(
    tmp_path: Path, moto_s3: MotoS3
) -> None:
    """The outage outlasts the generation: the run does not close with uncommitted records; it
    waits for the store, says so once, and commits them all when the store is back."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 120)
    out = moto_s3.url("outage-end")
    gen = tmp_path / "gen.yaml"
    gen.write_text("store_retry_max: 1\n", encoding="utf-8")
    config = SimConfig(time_scale=0.05, mean_output_tokens=40, output_sigma=0.3, max_running=16)
    with SimFleet(2, config) as fleet, S3Outage(moto_s3.endpoint_url) as proxy:
        cmd = [*CLI, "--prompts", str(prompts), "--out", out, "--config", str(gen)]
        cmd += ["--progress", "off", "--flush-records", "8", "--flush-seconds", "0.2"]
        for url in fleet.urls:
            cmd += ["--endpoint", url]
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url, "DRAFTDATA_S3_MAX_ATTEMPTS": "1"}
        # the store refuses everything from the moment the first shard is committed: the
        # proxy switches itself, so the outage cannot begin after the last commit
        proxy.trip("/completions/", "503")
        with (tmp_path / "err.txt").open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
            try:
                errs = tmp_path / "err.txt"
                _wait_for(lambda: proxy.mode == "503", 60, "first shard", proc, errs)
                assert 0 < _shards(moto_s3, out) < 120 // 8
                _wait_for(lambda: _served(fleet) >= 120, 60, "every prompt answered", proc, errs)
                # every prompt answered: it says it waits for the store, and does
                _wait_for(
                    lambda: "waiting for the store to accept" in errs.read_text(),
                    60,
                    "the line saying it waits for the store",
                    proc,
                    errs,
                )
                assert proc.poll() is None
                proxy.mode = "ok"
                assert proc.wait(timeout=60) == 0, (tmp_path / "err.txt").read_text()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    stderr = (tmp_path / "err.txt").read_text()
    assert sum("waiting for the store" in line for line in stderr.splitlines()) == 1, stderr
    assert check_exactly_once(out, set(ids)) == (120, 0)
