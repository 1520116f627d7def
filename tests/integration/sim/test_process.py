"""The simulator as a process: `draftdata fleet sim` on the command line, and SimProcess kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from tests.signals import default_signals

from draftdata.shared.fleetspec import read_fleet
from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read()


def _refused(url: str) -> bool:
    try:
        _get(url + "/health")
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cli_two_servers_serve_and_stop_on_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    proc = subprocess.Popen(
        [*CLI, "fleet", "sim", "--servers", "2", "--flavor", "vllm", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    try:
        assert proc.stdout is not None
        urls = []
        for _ in range(2):
            line = proc.stdout.readline()
            m = re.fullmatch(r"server (\d): (http://127\.0\.0\.1:\d+)\n", line)
            assert m, line
            urls.append(m.group(2))
        assert proc.stdout.readline() == f"fleet: {out}\n"
        assert len(set(urls)) == 2
        assert [e.url for e in read_fleet(out).endpoints] == urls
        for url in urls:
            assert _get(url + "/health")[0] == 200
            status, body = _get(url + "/v1/models")
            model = json.loads(body)["data"][0]
            assert status == 200 and model["id"] == "Qwen3.6-27B-sim"
            assert model["owned_by"] == "vllm" and model["max_model_len"] == 8192
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        _, err = proc.communicate(timeout=5)
        assert "Traceback" not in err and "2 simulated vllm servers ready" in err
        assert all(_refused(u) for u in urls)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_bad_option_is_one_line() -> None:
    res = subprocess.run(
        [*CLI, "fleet", "sim", "--servers", "1", "--slow", "x"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert res.returncode == 1 and "--slow 'x': expected SERVER:VALUE" in res.stderr
    assert "Traceback" not in res.stderr


async def _slow_request(url: str) -> BaseException | int:
    body = {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 4000}
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/v1/chat/completions", json=body) as r,
        ):
            await r.read()
            return r.status
    except aiohttp.ClientError as exc:
        return exc


async def test_kill_9_resets_clients_and_the_process_is_gone() -> None:
    # time scale 1 with ~4000 tokens: answers take a minute, so they are in flight at the kill
    with SimProcess(n=2, args=["--mean-output-tokens", "4000"]) as sim:
        pid, urls = sim.pid, list(sim.urls)
        tasks = [asyncio.create_task(_slow_request(u)) for u in urls for _ in range(3)]
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in tasks)
        t0 = time.monotonic()
        sim.kill()
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        assert time.monotonic() - t0 < 10
        assert all(isinstance(r, aiohttp.ClientError) for r in results), results
        assert sim.proc is not None and sim.proc.returncode == -signal.SIGKILL
        assert _gone(pid)
        assert all(_refused(u) for u in urls)
