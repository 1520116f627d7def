"""Secrets never leave the process (issue 24): an API key and a URL password are planted, and
every file that generate, stats, export and report write, and every console line, is searched
for them (parquet decoded, so compression cannot hide a hit).

The fleet is the simulator plus small misbehaving gateways that echo the request's headers,
``Authorization`` included, in their 400 and 401 bodies (a 400 becomes a prompt's Failure
message, a 401 a console line; the 400 gateway refuses every third request and answers the
rest: a gateway that refuses every request stops generate in one line, nothing recorded); the
endpoint URLs carry ``user:password@``, which the simulator accepts and the gateways echo as
an HTTP basic-auth header.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.integration.generate.helpers import completions, failures, write_prompts
from tests.integration.generate.rogue import RogueServer

from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
FAST = ["--time-scale", "0.01", "--mean-output-tokens", "40"]
USER = "alice"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _with_password(url: str, password: str) -> str:
    return url.replace("http://", f"http://{USER}:{password}@", 1)


def _texts(root: Path) -> dict[str, str]:
    """Every file under ``root`` as text: parquet as its decoded rows, the rest as bytes."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            rows = pq.read_table(path).to_pylist()
            out[str(path)] = json.dumps(rows, default=str, ensure_ascii=False)
        else:
            out[str(path)] = path.read_bytes().decode("utf-8", "replace")
    return out


def _leaks(texts: dict[str, str], planted: list[str]) -> list[str]:
    return [f"{where}: {s[:12]}..." for where, t in texts.items() for s in planted if s in t]


def test_planted_key_and_password_appear_in_no_file_and_no_console_line(tmp_path: Path) -> None:
    key = "sk-planted-" + secrets.token_hex(12)
    password = "pw-planted-" + secrets.token_hex(8)
    basic = base64.b64encode(f"{USER}:{password}".encode()).decode()
    planted = [key, password, basic]
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 60)
    work = tmp_path / "work"
    work.mkdir()
    console: list[str] = []
    env = {"DD_PLANTED_KEY": key}
    gen = ["generate", "--prompts", str(prompts), "--progress", "off", "--flush-seconds", "0.2"]
    gen += ["--max-tokens", "64"]

    with (
        SimProcess(n=1, args=FAST) as sim,
        RogueServer("echo", status=400, every=3) as bad_request,
        RogueServer("echo", status=401) as unauthorized,
    ):
        # the key: gateways echo "Authorization: Bearer <key>" in a 400 and a 401 body; the
        # echoing 400s are prompt failures (records holding the server's words) only where no
        # other server is left to ask (a refusal another server answers is asked there), so
        # the gateway answering 400 is the one serving endpoint once the 401 one is out
        run_key = work / "run-key"
        res = _cli(
            *gen,
            "--out",
            str(run_key),
            "--endpoint",
            bad_request.url,
            "--endpoint",
            unauthorized.url,
            "--api-key-env",
            "DD_PLANTED_KEY",
            env=env,
        )
        console += [res.stdout, res.stderr]
        assert res.returncode == 0, res.stderr[-3000:]
        assert bad_request.stats.chats > 0 and unauthorized.stats.chats > 0
        seen = bad_request.stats.headers[0].get("Authorization", "")
        assert key in seen  # the gateway did receive (and echo) the key
        assert failures(run_key), "the echoing 400s should have made prompt failures"
        assert "taken out" in res.stderr and unauthorized.url in res.stderr

        # the password: in every endpoint URL; the gateway echoes "Basic base64(user:pw)"
        run_pw = work / "run-password"
        res = _cli(
            *gen,
            "--out",
            str(run_pw),
            "--endpoint",
            _with_password(bad_request.url, password),  # alone: its 400s are prompt failures
        )
        console += [res.stdout, res.stderr]
        assert res.returncode == 0, res.stderr[-3000:]
        assert basic in bad_request.stats.headers[-1].get("Authorization", "")
        got = completions(run_pw)
        masked = {f"http://{USER}:***@" + u[7:] for u in (sim.urls[0], bad_request.url)}
        assert got and {c.endpoint for c in got} <= masked  # recorded with the password masked
        assert failures(run_pw)

        # both at once: one Authorization header cannot carry both; one line, exit 1
        res = _cli(
            *gen,
            "--out",
            str(work / "run-both"),
            "--endpoint",
            _with_password(sim.urls[0], password),
            "--api-key-env",
            "DD_PLANTED_KEY",
            env=env,
        )
        console += [res.stdout, res.stderr]
        assert res.returncode == 1, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        assert [x for x in res.stderr.splitlines() if x.startswith("error:")], res.stderr
        assert "--api-key-env" in res.stderr and "basic auth" in res.stderr

    for run in (run_key, run_pw):
        res = _cli("stats", str(run))
        console += [res.stdout, res.stderr]
        assert res.returncode == 0, res.stderr[-3000:]
        res = _cli("stats", str(run), "--json")
        console += [res.stdout, res.stderr]
        for fmt in ("sharegpt", "parquet"):
            res = _cli(
                "export", str(run), "--format", fmt, "--out", str(work / f"{run.name}.{fmt}")
            )
            console += [res.stdout, res.stderr]
            assert res.returncode == 0, res.stderr[-3000:]
        res = _cli("report", str(run), "--out", str(work / f"{run.name}.html"))
        console += [res.stdout, res.stderr]
        assert res.returncode == 0, res.stderr[-3000:]

    texts = _texts(work)
    assert any(p.endswith(".html") for p in texts) and any("metrics" in p for p in texts)
    assert any("failures" in p for p in texts)
    texts.update({f"console {i}": text for i, text in enumerate(console)})
    assert _leaks(texts, planted) == []
    # what was redacted is still said: the gateway's answer and the endpoint's user
    assert "***" in "".join(console)
    assert f"http://{USER}:***@" in "".join(console)


def test_a_password_in_a_fleet_file_is_shown_by_no_fleet_command(tmp_path: Path) -> None:
    """A hand-written fleet.yaml whose endpoint URL carries a password: ``fleet status`` (whose
    probes still authenticate with it), ``fleet down`` and a generate on the fleet show the
    URL with the password masked, never the password or its basic-auth form."""
    password = "pw-fleet-" + secrets.token_hex(8)
    planted = [password, base64.b64encode(f"{USER}:{password}".encode()).decode()]
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 8)
    console: list[str] = []
    with SimProcess(n=1, args=FAST) as sim:
        fleet = tmp_path / "fleet.yaml"
        url = _with_password(sim.urls[0], password)
        fleet.write_text(f"endpoints:\n  - url: {url}\n    engine: sim\n")
        status = _cli("fleet", "status", str(fleet))
        console += [status.stdout, status.stderr]
        assert status.returncode == 0, status.stdout + status.stderr  # healthy: probes got in
        run = tmp_path / "run"
        gen = _cli("generate", "--prompts", str(prompts), "--fleet", str(fleet), "--out", str(run))
        console += [gen.stdout, gen.stderr]
        assert gen.returncode == 0, gen.stderr[-3000:]
        down = _cli("fleet", "down", str(fleet))
        console += [down.stdout, down.stderr]
        assert down.returncode == 0, down.stdout + down.stderr

    assert f"http://{USER}:***@" in status.stdout and f"http://{USER}:***@" in down.stdout
    texts = {f"console {i}": text for i, text in enumerate(console)} | _texts(run)
    assert _leaks(texts, planted) == []
