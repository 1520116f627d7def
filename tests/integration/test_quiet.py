"""``-q/--quiet`` on every command: nothing but errors (prepare's and merge's tables included).

Each command runs for real (the simulator over real sockets, local stores) through the CLI's
``main`` with file-descriptor capture, so anything written to stdout or stderr by the command,
its threads or its libraries is seen. Each also shows its output without ``-q`` where that is
cheap, so a test cannot pass on a command that prints nothing anyway.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.generate.helpers import write_prompts
from tests.integration.ports import free_port_base
from tests.signals import default_signals

from draftdata.cli import main
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


def _run(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(1, SimConfig(time_scale=0.0, mean_output_tokens=30, max_running=16)) as f:
        yield f


@pytest.fixture(scope="module")
def run(fleet: SimFleet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 12 prompts (made quietly: the generate test checks that), without token
    ids: the simulator has no real tokenizer, so tokenize renders the text."""
    root = tmp_path_factory.mktemp("quiet")
    prompts = root / "p.jsonl"
    write_prompts(prompts, 12, kind="mixed")
    out = root / "run"
    args = ["generate", "--prompts", str(prompts), "--endpoint", fleet.urls[0], "--out", str(out)]
    assert _run(*args, "--flush-seconds", "0.2", "--token-ids", "off", "-q") == 0
    return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    return ensure_demo_tokenizer(tmp_path_factory.mktemp("cache"))


def _nothing(capfd: pytest.CaptureFixture[str]) -> None:
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


def test_generate(
    run: Path, fleet: SimFleet, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 6)
    with prompts.open("a") as fh:
        fh.write("{not json\n")  # a reject is logged, but not with -q
    base = ["generate", "--prompts", str(prompts), "--endpoint", fleet.urls[0]]
    assert _run(*base, "--out", str(tmp_path / "a"), "--flush-seconds", "0.2", "-q") == 0
    _nothing(capfd)
    assert list((tmp_path / "a" / "completions").glob("*.parquet"))
    assert _run(*base, "--out", str(tmp_path / "b"), "--flush-seconds", "0.2") == 0
    out, err = capfd.readouterr()
    assert "generate:" in out + err and "invalid" in out + err  # not quiet: it does talk
    # an error still prints, as its one line
    bad = ["generate", "--prompts", str(prompts), "--endpoint", "http://127.0.0.1:9", "-q"]
    assert _run(*bad, "--out", str(tmp_path / "c")) == 1
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("error: generate: no endpoint reachable")
    assert len(err.strip().splitlines()) == 1


def test_export(run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    whole = ["--format", "sharegpt"]  # one row per completion (the default is one per turn)
    assert _run("export", str(run), *whole, "--out", str(tmp_path / "x.jsonl"), "-q") == 0
    _nothing(capfd)
    assert len((tmp_path / "x.jsonl").read_text().splitlines()) == 12
    assert _run("export", str(run), "--out", str(tmp_path / "y.jsonl")) == 0
    assert "exported 12 completions" in capfd.readouterr().out
    assert _run("export", str(run), "--out", str(tmp_path / "x.jsonl"), "-q") == 1
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_tokenize(
    run: Path, tokenizer: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    args = ["tokenize", str(run), "--tokenizer", str(tokenizer)]
    assert _run(*args, "--out", str(tmp_path / "t"), "-q") == 0
    _nothing(capfd)
    assert (tmp_path / "t" / "summary.json").is_file()
    assert _run(*args, "--out", str(tmp_path / "u")) == 0
    assert "tokenize: " in capfd.readouterr().out


def test_merge(run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    args = ["merge", "--add", str(run), "--eval-fraction", "0"]
    assert _run(*args, "--out", str(tmp_path / "m"), "-q") == 0
    _nothing(capfd)
    assert (tmp_path / "m" / "merge_report.json").is_file()
    assert _run(*args, "--out", str(tmp_path / "n")) == 0
    out = capfd.readouterr().out
    assert "domain" in out and "train" in out


def test_prepare(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"question number {i}"}]} for i in range(5)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{bad\n")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"sources:\n  - name: s\n    schema: openai\n    path: {src}\n    domain: general\n"
    )
    capfd.readouterr()
    assert _run("prepare", str(cfg), "--out", str(tmp_path / "o"), "-q") == 0
    _nothing(capfd)
    shards = sorted((tmp_path / "o").glob("prompts-*.jsonl"))
    assert sum(len(p.read_text().splitlines()) for p in shards) == 5
    assert _run("prepare", str(cfg), "--out", str(tmp_path / "p")) == 0
    out = capfd.readouterr().out
    assert "sources" in out and "5 prompts" in out


def test_stats_and_report(run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    assert _run("stats", str(run), "-q") == 0
    _nothing(capfd)
    assert _run("stats", str(run), "--json") == 0
    assert json.loads(capfd.readouterr().out)["rows"] == 12
    assert _run("report", str(run), "--out", str(tmp_path / "r.html"), "-q") == 0
    _nothing(capfd)
    assert (tmp_path / "r.html").stat().st_size > 1000
    assert _run("stats", str(tmp_path / "missing"), "-q") == 1
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("error: ")


def test_demo(tokenizer: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    args = ["demo", "--out", str(tmp_path / "d"), "--servers", "1", "--budget", "12"]
    args += [
        "--time-scale",
        "0",
        "--mean-output-tokens",
        "30",
        "--cache-dir",
        str(tokenizer.parent),
    ]
    assert _run(*args, "-q") == 0
    _nothing(capfd)
    assert (tmp_path / "d" / "report.html").is_file()  # the demo's last step ran


def test_fleet_up_status_down_and_sim(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet.yaml"
    capfd.readouterr()
    up = ["fleet", "up", "--engine", "sim", "--model", "m", "--gpus", "0", "--out", str(fleet)]
    up += [
        "--port-base",
        str(free_port_base(1)),
        "--log-dir",
        str(tmp_path / "logs"),
        "--timeout",
        "60",
        "-q",
    ]
    try:
        assert _run(*up) == 0
        _nothing(capfd)
        assert _run("fleet", "status", str(fleet), "-q") == 0
        _nothing(capfd)
        assert _run("fleet", "status", str(fleet)) == 0
        assert "1 of 1 servers healthy" in capfd.readouterr().out
    finally:
        down = _run("fleet", "down", str(fleet), "--grace", "5", "-q")
    assert down == 0
    _nothing(capfd)
    # fleet sim runs in the foreground until Ctrl-C
    sim_yaml = tmp_path / "sim.yaml"
    cmd = [sys.executable, "-c", "from draftdata.cli import main; main()", "fleet", "sim"]
    proc = subprocess.Popen(
        [*cmd, "--servers", "1", "--out", str(sim_yaml), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    try:
        deadline = time.monotonic() + 60
        while not sim_yaml.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sim_yaml.exists()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out == "" and err == "", (out, err)
