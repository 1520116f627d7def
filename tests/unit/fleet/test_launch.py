"""Unit tests of fleet launch planning, readiness helpers and process identity (no servers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.signals import default_signals

from draftdata.errors import ConfigError, FleetError
from draftdata.fleet import launch
from draftdata.fleet.launch import (
    LaunchConfig,
    flag_value,
    merge_args,
    parse_env,
    parse_gpus,
    parse_nvidia_smi,
    plan_fleet,
)
from draftdata.fleet.manage import format_uptime
from draftdata.fleet.procs import Identity, describe_pid, stop_process
from draftdata.fleet.supervise import Backoff, LogTail, match_fatal
from draftdata.shared.fleetspec import process_start_time


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0-7", tuple(str(i) for i in range(8))),
        ("0,2,5", ("0", "2", "5")),
        ("0-1,6", ("0", "1", "6")),
        ("3", ("3",)),
        (" 4 , 5 ", ("4", "5")),
    ],
)
def test_parse_gpus(text: str, want: tuple[str, ...]) -> None:
    assert parse_gpus(text) == want


@pytest.mark.parametrize(
    ("text", "needle"), [("a", "not a GPU id"), ("3-1", "empty"), ("0,0", "twice"), ("", "no GPU")]
)
def test_parse_gpus_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_gpus(text)


def test_parse_nvidia_smi() -> None:
    assert parse_nvidia_smi("0\n1\n\n2\n") == ("0", "1", "2")
    assert parse_nvidia_smi("No devices were found\n") == ()


def test_parse_env() -> None:
    assert parse_env(["A=1", "B_C=x=y", "D="]) == (("A", "1"), ("B_C", "x=y"), ("D", ""))
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_env(["NOVALUE"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_env(["=1"])


def test_merge_args_replaces_preset_flags() -> None:
    preset = ["--context-length", "8192", "--reasoning-parser", "qwen3", "--flag"]
    merged = merge_args(preset, ["--context-length=4096", "--new", "1"])
    assert merged == [
        "--reasoning-parser",
        "qwen3",
        "--flag",
        "--context-length=4096",
        "--new",
        "1",
    ]
    assert merge_args(preset, []) == preset


def test_flag_value() -> None:
    argv = ["x", "--max-model-len", "1024", "--max-num-seqs=16", "--max-model-len", "2048"]
    assert flag_value(argv, "--max-model-len") == "2048"
    assert flag_value(argv, "--max-num-seqs") == "16"
    assert flag_value(argv, "--nope") is None


def test_sglang_plan_one_server_per_gpu(tmp_path: Path) -> None:
    cfg = LaunchConfig(
        engine="sglang",
        model="/models/Qwen3.6-27B",
        port_base=30000,
        extra_args=("--context-length", "16384"),
        env=(("HF_HUB_OFFLINE", "1"),),
        python="/opt/py",
        log_dir=str(tmp_path),
    )
    plans = plan_fleet(cfg, parse_gpus("0-7"))
    assert [p.port for p in plans] == list(range(30000, 30008))
    assert [dict(p.env)["CUDA_VISIBLE_DEVICES"] for p in plans] == [str(i) for i in range(8)]
    assert all(dict(p.env)["HF_HUB_OFFLINE"] == "1" for p in plans)
    argv = plans[3].argv
    assert argv[:3] == ("/opt/py", "-m", "sglang.launch_server")
    assert flag_value(argv, "--port") == "30003"
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--attention-backend") == "flashinfer"
    assert flag_value(argv, "--mamba-radix-cache-strategy") == "no_buffer"  # version unknown
    assert "--mamba-scheduler-strategy" not in argv
    assert flag_value(argv, "--reasoning-parser") == "qwen3"
    assert flag_value(argv, "--mem-fraction-static") == "0.85"
    assert argv.count("--context-length") == 1
    assert flag_value(argv, "--context-length") == "16384"
    assert len({p.log for p in plans}) == 8
    assert plans[3].url == "http://127.0.0.1:30003"


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ("0.5.4", "--mamba-scheduler-strategy"),  # the seed job's SGLang
        ("0.5.22.post3", "--mamba-scheduler-strategy"),
        ("0.5.23", "--mamba-radix-cache-strategy"),  # refuses the old name
        ("0.5.23rc1", "--mamba-radix-cache-strategy"),
        ("0.6.0", "--mamba-radix-cache-strategy"),
        (None, "--mamba-radix-cache-strategy"),
    ],
)
def test_sglang_preset_names_the_mamba_flag_as_the_installed_sglang(
    version: str | None, flag: str
) -> None:
    cfg = LaunchConfig(engine="sglang", model="m", engine_version=version, python="/opt/py")
    (plan,) = plan_fleet(cfg, ("0",))
    assert flag_value(plan.argv, flag) == "no_buffer"
    names = {"--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"}
    assert [a for a in plan.argv if a in names] == [flag]
    assert launch.version_tuple("0.5.23.post1") == (0, 5, 23)
    assert launch.version_tuple("1.2rc3") == (1, 2)


def test_installed_version_reads_package_metadata() -> None:
    import msgspec

    assert launch.installed_version(sys.executable, "msgspec") == msgspec.__version__
    assert launch.installed_version(sys.executable, "no-such-package-xyz") is None
    assert launch.installed_version("/no/such/python", "msgspec") is None


def test_vllm_plan_data_parallel_and_no_preset() -> None:
    cfg = LaunchConfig(engine="vllm", model="m", dp=4, python="py")
    (plan,) = plan_fleet(cfg, parse_gpus("0-3"))
    assert plan.argv[:3] == ("py", "-m", "vllm.entrypoints.openai.api_server")
    assert flag_value(plan.argv, "--data-parallel-size") == "4"
    assert dict(plan.env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert flag_value(plan.argv, "--reasoning-parser") == "qwen3"
    bare = plan_fleet(LaunchConfig(engine="vllm", model="m", preset_args=False), ["0"])[0]
    assert flag_value(bare.argv, "--reasoning-parser") is None
    assert flag_value(bare.argv, "--model") == "m"
    with pytest.raises(ConfigError, match="do not divide"):
        plan_fleet(cfg, parse_gpus("0-2"))


def test_command_template_placeholders() -> None:
    cfg = LaunchConfig(
        engine="command",
        model="/m dir",
        command="serve --gpu {gpu} --port {port} --model '{model}' --i {index}",
        port_base=9000,
    )
    plans = plan_fleet(cfg, ["4", "5"])
    assert plans[1].argv == (
        "serve",
        "--gpu",
        "5",
        "--port",
        "9001",
        "--model",
        "/m dir",
        "--i",
        "1",
    )


def test_engine_python_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTDATA_ENGINE_PYTHON", "/envpy")
    assert launch.engine_python(LaunchConfig(engine="vllm", model="m")) == "/envpy"
    assert launch.engine_python(LaunchConfig(engine="vllm", model="m", python="/p")) == "/p"
    monkeypatch.delenv("DRAFTDATA_ENGINE_PYTHON")
    assert launch.engine_python(LaunchConfig(engine="vllm", model="m")) == sys.executable


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"engine": "tgi"}, "expected one of"),
        ({"engine": "command"}, "needs --command"),
        ({"engine": "vllm", "command": "x"}, "only used with"),
        ({"engine": "vllm", "port_base": 0}, "TCP port"),
        ({"engine": "vllm", "dp": 0}, ">= 1"),
    ],
)
def test_launch_config_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        LaunchConfig(model="m", **kwargs)  # type: ignore[arg-type]


def test_ports_past_65535_rejected() -> None:
    with pytest.raises(ConfigError, match="past port 65535"):
        plan_fleet(LaunchConfig(engine="sim", model="m", port_base=65535), ["0", "1"])


def _fake_nvidia_smi(tmp_path: Path, body: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)


def test_detect_gpus_with_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(tmp_path, "printf '0\\n1\\n2\\n'")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert launch.detect_gpus() == ("0", "1", "2")


def test_detect_gpus_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FleetError, match="not on PATH"):
        launch.detect_gpus()
    _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    with pytest.raises(FleetError, match="exit 9: NVIDIA-SMI has failed"):
        launch.detect_gpus()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA out"),
        ("OSError: [Errno 98] Address already in use", "address already in use"),
        ("ValueError: attention backend fa3 is not supported on sm120", "attention backend"),
        ("api_server.py: error: unrecognized arguments: --bogus", "unrecognized arguments"),
        ("Error: No such option: --bogus", "unrecognized arguments"),
        ("RuntimeError: Engine core initialization failed. See root cause above.", "engine"),
        ("INFO: Application startup complete.", None),
    ],
)
def test_match_fatal(line: str, why: str | None) -> None:
    got = match_fatal(line)
    assert (got is None) if why is None else (got is not None and why in got)


def test_log_tail_reads_only_new_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    tail = LogTail(log)
    assert tail.new_lines() == []
    log.write_text("one\ntw")
    assert tail.new_lines() == ["one"]
    with open(log, "a") as fh:
        fh.write("o\nthree")
    assert tail.new_lines() == ["two"]
    assert tail.last_line() == "three"


def test_backoff_doubles_and_caps() -> None:
    b = Backoff(first_s=5, max_s=30)
    assert [b.delay(n) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 30, 30]


def test_format_uptime() -> None:
    assert format_uptime(None) == "-"
    assert format_uptime(247) == "4m07s"
    assert format_uptime(2 * 3600 + 300) == "2h05m"
    assert format_uptime(3 * 86400 + 4 * 3600) == "3d04h"


def test_identity_checks_the_start_time() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=default_signals
    )
    try:
        started = process_start_time(proc.pid)
        assert started is not None
        assert describe_pid(Identity(pid=proc.pid, started=started))[0] == "ours"
        # A pid recorded with another start time is a reused pid: never signalled.
        other = Identity(pid=proc.pid, pgid=proc.pid, started=started - 3600)
        assert describe_pid(other)[0] == "reused"
        assert "left alone" in stop_process(other, grace_s=1)
        no_time = Identity(pid=proc.pid, pgid=proc.pid)
        assert "left alone" in stop_process(no_time, grace_s=1)
        assert proc.poll() is None
        # The right identity (pid only, no group) stops it.
        assert stop_process(Identity(pid=proc.pid, started=started), grace_s=5) == "stopped"
        assert proc.wait(timeout=10) is not None
    finally:
        proc.kill()
        proc.wait()


def test_stop_process_kills_what_ignores_sigterm() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=True,
        stdout=subprocess.PIPE,
        preexec_fn=default_signals,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        started = process_start_time(proc.pid)
        what = stop_process(Identity(pid=proc.pid, pgid=proc.pid, started=started), grace_s=0.5)
        assert what.startswith("killed")
        proc.wait(timeout=10)  # (psutil may have reaped it already: no exit code to check)
        assert describe_pid(Identity(pid=proc.pid, started=started))[0] == "gone"
        assert stop_process(Identity(pid=proc.pid, pgid=proc.pid, started=started)) == (
            "already stopped"
        )
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_log_tail_starts_after_the_latest_start_header(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("# draftdata: serve --x\nCUDA out of memory\n# draftdata: serve --x\nloading\n")
    tail = LogTail(log)
    assert tail.new_lines() == ["loading"]
    log.write_text("# draftdata: serve 'CUDA out of memory'\n")
    assert LogTail(log).new_lines() == []


def test_sim_engine_defaults_fit_the_no_gpu_tip(tmp_path: Path) -> None:
    """`fleet up --engine sim --model DIR`: fast answers, and the folder's tokenizer when it
    has one (real token ids); --extra-args still override."""
    model = tmp_path / "Qwen3.6-27B"
    model.mkdir()
    (model / "tokenizer_config.json").write_text("{}")
    argv = plan_fleet(LaunchConfig(engine="sim", model=str(model)), ["0"])[0].argv
    assert argv[argv.index("--time-scale") + 1] == "0.01"
    assert argv[argv.index("--tokenizer") + 1] == str(model)
    plain = plan_fleet(LaunchConfig(engine="sim", model="Qwen3.6-27B"), ["0"])[0].argv
    assert "--tokenizer" not in plain and "--time-scale" in plain
    cfg = LaunchConfig(engine="sim", model=str(model), extra_args=("--time-scale", "0"))
    over = plan_fleet(cfg, ["0"])[0].argv
    assert over.count("--time-scale") == 1 and over[over.index("--time-scale") + 1] == "0"
