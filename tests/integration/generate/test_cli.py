"""`draftdata generate` as a user runs it: a subprocess against a simulator subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, write_prompts
from tests.signals import default_signals

from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_unreachable_fleet_is_one_line_and_exit_1(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 3)
    res = run_cli(
        "--prompts", str(prompts), "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "r")
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: generate: no endpoint reachable")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()  # nothing written before a server answered


def test_bad_option_values_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from draftdata.cli import main

    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 1)
    base = ["--prompts", str(prompts), "--endpoint", "http://127.0.0.1:9", "--out", "r"]
    for extra, expected in [
        (["--concurrency", "lots"], "--concurrency: 'lots'"),
        (["--partition", "3/2"], "--partition: '3/2'"),
        (["--partition", "3", "--partitions", "2"], "--partition: '3/2'"),
        (["--partition", "1"], "--partition 1: say how many with --partitions P"),
        (["--only-partitions", "1"], "--partitions P"),
        (["--api-key-env", "DRAFTDATA_TEST_NO_SUCH_VAR"], "$DRAFTDATA_TEST_NO_SUCH_VAR is not set"),
        (["--reasoning", "maybe"], "reasoning"),
        (["--prompts", str(tmp_path / "missing.jsonl")], "no such file or directory"),
    ]:
        with pytest.raises(SystemExit) as info:
            main(["generate", *base, *extra])
        err = capsys.readouterr().err
        assert info.value.code == 1, err
        assert expected in err and len(err.strip().splitlines()) == 1, err


def test_fleet_yaml_config_file_and_api_key(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 20)
    gen = tmp_path / "gen.yaml"
    gen.write_text(
        "max_tokens: 64\nsampling: {temperature: 0.5}\nflush_seconds: 0.2\n"
        "overrides:\n  - domain: math\n    max_tokens: 16\n",
        encoding="utf-8",
    )
    with SimProcess(n=2, args=["--time-scale", "0.001"]) as sim:
        env = {**os.environ, "DRAFTDATA_TEST_KEY": "sk-secret-value"}
        res = subprocess.run(
            [
                *CLI,
                "--prompts", str(prompts),
                "--fleet", str(sim.fleet_yaml),
                "--out", str(tmp_path / "run"),
                "--config", str(gen),
                "--api-key-env", "DRAFTDATA_TEST_KEY",
                "--progress", "plain",
                "--summary-json", str(tmp_path / "summary.json"),
            ],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "sk-secret-value" not in res.stdout + res.stderr
    assert "generate: done: 20 completions" in res.stdout
    got = completions(tmp_path / "run")
    assert {c.id for c in got} == set(ids)
    for c in got:
        assert c.sampling["temperature"] == 0.5
        assert c.sampling["max_tokens"] == (16 if c.domain == "math" else 64)
        assert "sk-secret" not in str(c.sampling)
    assert (tmp_path / "summary.json").read_text().count('"completed": 20') == 1


@pytest.mark.chaos
def test_sigint_twice_leaves_at_once_then_resume_is_exactly_once(tmp_path: Path) -> None:
    """First SIGINT: stop dispatch and wait (grace 60 s); second: leave now, committed."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 300)
    out = tmp_path / "run"
    with SimProcess(n=2, args=["--time-scale", "0.3", "--mean-output-tokens", "100"]) as sim:
        args = [
            "--prompts", str(prompts), "--fleet", str(sim.fleet_yaml), "--out", str(out),
            "--flush-seconds", "0.2", "--progress", "plain", "--log-interval", "1",
            "--grace-seconds", "60",
        ]  # fmt: skip
        proc = subprocess.Popen(
            [*CLI, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_signals,
        )
        deadline = time.monotonic() + 60
        while not list((out / "completions").glob("*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)  # requests take ~1 s here: the grace period is still running
        proc.send_signal(signal.SIGINT)
        second = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        assert time.monotonic() - second < 20  # not the 60 s grace
        assert proc.returncode == 130, stderr
        assert "leaving now" in stderr and "run the same command again to resume" in stderr
        assert "generate: interrupted" in stdout
        first = len(completions(out))
        assert 0 < first < 300
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr
        assert f"already done before: {first}" in again.stdout
    assert check_exactly_once(str(out), set(ids)) == (300, 0)
