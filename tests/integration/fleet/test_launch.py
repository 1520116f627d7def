"""`draftdata fleet up | status | down` end to end, with simulator processes as the servers.

Every test drives the real CLI in a subprocess (as a user would), on free 127.0.0.1 ports, and
stops whatever it started even when it fails.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from tests.integration.ports import free_port_base
from tests.signals import default_signals

from draftdata.shared.fleetspec import process_start_time

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
SIM_ARGS = "--time-scale 0 --flavor vllm --max-running 8"


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def fleet_file(tmp_path: Path) -> Iterator[Path]:
    """A fleet.yaml path whose fleet is always taken down after the test."""
    path = tmp_path / "fleet.yaml"
    yield path
    if path.exists():
        run_cli("fleet", "down", str(path), "--grace", "5")


def up_sim(fleet: Path, n: int, *extra: str, sim_args: str = SIM_ARGS) -> tuple[int, str]:
    base = free_port_base(n)
    res = run_cli(
        "fleet", "up", "--engine", "sim", "--model", "sim-model", "--gpus", f"0-{n - 1}",
        "--port-base", str(base), "--extra-args", sim_args, "--out", str(fleet),
        "--log-dir", str(fleet.parent / "logs"), "--timeout", "60", *extra,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return base, res.stdout


def test_sim_fleet_up_status_down(fleet_file: Path) -> None:
    base, out = up_sim(fleet_file, 2)
    assert out.count("ready in") == 2
    spec = yaml.safe_load(fleet_file.read_text())
    assert spec["engine"] == "sim"
    eps = spec["endpoints"]
    assert [e["url"] for e in eps] == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    for i, e in enumerate(eps):
        assert alive(e["pid"])
        assert e["pgid"] == e["pid"]
        assert e["model"] == "sim-model"
        assert e["engine"] == "vllm"
        assert e["engine_version"]
        assert e["context_length"] == 8192
        assert e["max_running_requests"] == 8  # vLLM does not report it: from the flags
        assert e["gpu"] == str(i)
        assert Path(e["log"]).is_file()
        environ = psutil.Process(e["pid"]).environ()
        assert environ["CUDA_VISIBLE_DEVICES"] == str(i)

    st = run_cli("fleet", "status", str(fleet_file))
    assert st.returncode == 0, st.stdout + st.stderr
    assert "2 of 2 servers healthy" in st.stdout
    rows = [ln for ln in st.stdout.splitlines() if "http://" in ln]
    assert len(rows) == 2 and all(" running " in r and " ok " in r for r in rows)

    down = run_cli("fleet", "down", str(fleet_file))
    assert down.returncode == 0, down.stderr
    assert down.stdout.count(": stopped") == 2
    assert not any(alive(e["pid"]) for e in eps)
    st = run_cli("fleet", "status", str(fleet_file))
    assert st.returncode == 1
    assert "0 of 2 servers healthy" in st.stdout and " exited " in st.stdout


def test_up_refuses_to_overwrite_a_running_fleet(fleet_file: Path) -> None:
    up_sim(fleet_file, 1)
    again = run_cli(
        "fleet", "up", "--engine", "sim", "--model", "m", "--gpus", "0",
        "--port-base", str(free_port_base(1)), "--out", str(fleet_file),
    )  # fmt: skip
    assert again.returncode == 1
    assert "describes a running fleet" in again.stderr and "fleet down" in again.stderr


def test_command_engine_with_env(fleet_file: Path) -> None:
    base = free_port_base(2)
    template = (
        "{python} -c 'from draftdata.cli import main; main()' fleet sim --servers 1 "
        "--port-base {port} --model cmd-{gpu} --time-scale 0"
    )
    res = run_cli(
        "fleet", "up", "--engine", "command", "--command", template, "--model", "ignored",
        "--gpus", "3,5", "--port-base", str(base), "--env", "DRAFTDATA_TEST_MARK=hello",
        "--out", str(fleet_file), "--log-dir", str(fleet_file.parent / "logs"),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    eps = yaml.safe_load(fleet_file.read_text())["endpoints"]
    assert [e["model"] for e in eps] == ["cmd-3", "cmd-5"]
    assert [e["engine"] for e in eps] == ["sglang", "sglang"]  # the sim's default flavour
    assert [e["max_running_requests"] for e in eps] == [64, 64]  # from /server_info
    env = psutil.Process(eps[1]["pid"]).environ()
    assert env["DRAFTDATA_TEST_MARK"] == "hello" and env["CUDA_VISIBLE_DEVICES"] == "5"


@pytest.mark.timeout(60)
def test_bad_flag_is_reported_in_one_line_without_waiting(fleet_file: Path) -> None:
    base = free_port_base(2)
    res = run_cli(
        "fleet", "up", "--engine", "sim", "--model", "m", "--gpus", "0-1",
        "--port-base", str(base), "--extra-args", "--no-such-flag 3",
        "--out", str(fleet_file), "--log-dir", str(fleet_file.parent / "logs"),
        "--timeout", "600",
    )  # fmt: skip
    assert res.returncode == 1
    failed = [ln for ln in res.stdout.splitlines() if "FAILED" in ln]
    assert len(failed) == 2
    assert all("unrecognized arguments" in ln and "--no-such-flag" in ln for ln in failed)
    assert "2 of 2 servers failed to start" in res.stderr
    assert not fleet_file.exists()


@pytest.mark.timeout(60)
def test_port_taken_is_reported_and_nothing_starts(fleet_file: Path) -> None:
    base = free_port_base(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 1))
        s.listen()
        res = run_cli(
            "fleet", "up", "--engine", "sim", "--model", "m", "--gpus", "0-1",
            "--port-base", str(base), "--out", str(fleet_file),
        )  # fmt: skip
    assert res.returncode == 1
    assert (
        f"server 1 gpu 1 http://127.0.0.1:{base + 1}: FAILED: port {base + 1} is already in use"
        in (res.stdout)
    )
    assert "1 of 2 ports are already in use" in res.stderr
    assert not fleet_file.exists()


@pytest.mark.timeout(60)
def test_fatal_log_line_of_a_live_server_fails_it_at_once(fleet_file: Path) -> None:
    code = (
        "import time; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "20.00 GiB', flush=True); time.sleep(600)"
    )
    res = run_cli(
        "fleet", "up", "--engine", "command", "--command", f'{{python}} -c "{code}"',
        "--model", "m", "--gpus", "0", "--port-base", str(free_port_base(1)),
        "--out", str(fleet_file), "--log-dir", str(fleet_file.parent / "logs"),
        "--timeout", "600",
    )  # fmt: skip
    assert res.returncode == 1
    (line,) = [ln for ln in res.stdout.splitlines() if "FAILED" in ln]
    assert "CUDA out of memory: torch.OutOfMemoryError" in line
    pid = int(line.split(" pid ")[1].split(":")[0])
    assert not alive(pid)  # stopped, not left behind


def test_allow_partial_keeps_the_ready_servers(fleet_file: Path, tmp_path: Path) -> None:
    base = free_port_base(2)
    # Server 1 exits at once (its template fails on gpu 1 only).
    template = (
        "{python} -c 'import sys; from draftdata.cli import main; "
        'sys.exit(3) if "{gpu}" == "1" else main()\' fleet sim --servers 1 '
        "--port-base {port} --time-scale 0"
    )
    res = run_cli(
        "fleet", "up", "--engine", "command", "--command", template, "--model", "m",
        "--gpus", "0-1", "--port-base", str(base), "--allow-partial",
        "--out", str(fleet_file), "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "process exited with code 3" in res.stdout
    assert "fleet ready: 1 of 2 servers" in res.stdout
    eps = yaml.safe_load(fleet_file.read_text())["endpoints"]
    assert [e["url"] for e in eps] == [f"http://127.0.0.1:{base}"]


def test_down_never_touches_processes_it_did_not_start(fleet_file: Path, tmp_path: Path) -> None:
    up_sim(fleet_file, 1)
    ours = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    try:
        started = process_start_time(stranger.pid)
        assert started is not None
        spec = yaml.safe_load(fleet_file.read_text())
        spec["endpoints"] += [
            # The stranger's pid with another start time: as if our server died and its pid
            # was reused.
            {"url": "http://127.0.0.1:1", "pid": stranger.pid, "pgid": stranger.pid,
             "started": started - 1000.0},
            # A pid without a start time (hand-written fleet.yaml): never signalled.
            {"url": "http://127.0.0.1:2", "pid": stranger.pid},
            # A server draftdata did not start at all.
            {"url": "http://127.0.0.1:3"},
        ]  # fmt: skip
        fleet_file.write_text(yaml.safe_dump(spec, sort_keys=False))
        down = run_cli("fleet", "down", str(fleet_file), "--grace", "5")
        assert down.returncode == 0, down.stderr
        lines = down.stdout.splitlines()
        assert lines[0].endswith(": stopped")
        assert "now belongs to another process: left alone" in lines[1]
        assert "no start time recorded" in lines[2]
        assert "no pid recorded" in lines[3]
        assert stranger.poll() is None and alive(stranger.pid)
        assert not alive(ours["pid"])
    finally:
        stranger.kill()
        stranger.wait()


def test_down_stops_workers_of_a_crashed_leader(fleet_file: Path, tmp_path: Path) -> None:
    # The "server" forks a worker in its process group (as vLLM's EngineCore), then serves.
    template = (
        "{python} -c 'import subprocess, sys; "
        'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]); '
        "from draftdata.cli import main; main()' fleet sim --servers 1 --port-base {port} "
        "--time-scale 0"
    )
    res = run_cli(
        "fleet", "up", "--engine", "command", "--command", template, "--model", "m",
        "--gpus", "0", "--port-base", str(free_port_base(1)), "--out", str(fleet_file),
        "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    ep = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
    leader = psutil.Process(ep["pid"])
    (worker,) = leader.children()
    os.kill(ep["pid"], signal.SIGKILL)  # the leader crashes; its worker lives on
    leader.wait(timeout=10)
    assert worker.is_running()
    down = run_cli("fleet", "down", str(fleet_file), "--grace", "5")
    assert ": stopped" in down.stdout, down.stdout + down.stderr
    worker.wait(timeout=10)
    assert not alive(worker.pid)


@pytest.mark.timeout(120)
def test_restart_on_crash_with_detached_watcher(fleet_file: Path) -> None:
    up_sim(fleet_file, 1, "--restart-on-crash", "--restart-delay", "0.5")
    first = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
    os.kill(first["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    new = first
    while time.monotonic() < deadline and new["pid"] == first["pid"]:
        time.sleep(0.5)
        new = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
    assert new["pid"] != first["pid"] and new["url"] == first["url"]
    assert alive(new["pid"])
    st = run_cli("fleet", "status", str(fleet_file))
    assert "1 of 1 servers healthy" in st.stdout, st.stdout
    log = Path(new["log"]).read_text()
    assert log.count("# draftdata:") == 2  # appended, the crash's log kept
    down = run_cli("fleet", "down", str(fleet_file), "--grace", "5")
    assert down.stdout.splitlines()[0].startswith("watcher pid") and ": stopped" in down.stdout
    assert not alive(new["pid"])


@pytest.mark.timeout(120)
def test_foreground_stops_the_fleet_on_sigint(fleet_file: Path, tmp_path: Path) -> None:
    base = free_port_base(1)
    proc = subprocess.Popen(
        [
            *CLI, "fleet", "up", "--engine", "sim", "--model", "m", "--gpus", "0",
            "--port-base", str(base), "--extra-args", SIM_ARGS, "--out", str(fleet_file),
            "--log-dir", str(tmp_path / "logs"), "--foreground",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_signals,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Ctrl-C stops the fleet" in line:
                break
        ep = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
        assert alive(ep["pid"])
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0
        assert ": stopped" in rest
        assert not alive(ep["pid"])
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_dry_run_prints_the_command_lines_and_starts_nothing(fleet_file: Path) -> None:
    """`--dry-run`: one line per server (added environment, then the command line with the
    preset and `--extra-args` merged); no process, no fleet.yaml, no log."""
    res = run_cli(
        "fleet", "up", "--engine", "sglang", "--model", "/models/M", "--gpus", "0,3",
        "--port-base", "31000", "--python", sys.executable, "--env", "HF_HUB_OFFLINE=1",
        "--extra-args", "--attention-backend torch_native --device cpu",
        "--out", str(fleet_file), "--log-dir", str(fleet_file.parent / "logs"), "--dry-run",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2
    for gpu, port, line in zip(("0", "3"), (31000, 31001), lines, strict=True):
        head, _, command = line.partition(": ")
        assert head.endswith(f"http://127.0.0.1:{port}")
        words = shlex.split(command)
        assert words[:2] == [f"CUDA_VISIBLE_DEVICES={gpu}", "HF_HUB_OFFLINE=1"]
        argv = words[2:]
        assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
        assert argv[argv.index("--attention-backend") + 1] == "torch_native"
        assert "flashinfer" not in argv and "--port" in argv
    assert not fleet_file.exists() and not (fleet_file.parent / "logs").exists()


def _kill_servers_on(port: int) -> None:
    """SIGKILL every simulator this test started on ``port`` (one a failed restart may leave
    unrecorded in fleet.yaml, which `fleet down` cannot find)."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "sim" in cmd and "--port-base" in cmd and str(port) in cmd:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _wait_for(what: str, check: Callable[[], bool], seconds: float, shown: Path) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}: {shown.read_text()}"
        time.sleep(0.2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("obstacle", ["log", "fleet.yaml"])
def test_a_restart_that_fails_is_said_and_tried_again(fleet_file: Path, obstacle: str) -> None:
    """A restart the watcher cannot complete (the server's log cannot be opened, or fleet.yaml
    cannot be rewritten: a folder took the file's name, as a full disk or a removed folder fails
    them) is said in the watcher's log, what it started is stopped, and it is tried again after
    the backoff until it works. Before, the restart's task died of the error: the server was
    never restarted again (log), or ran unrecorded where `fleet down` could not find it
    (fleet.yaml), and the watcher waited for a restart that never came."""
    base, _ = up_sim(fleet_file, 1, "--restart-on-crash", "--restart-delay", "0.2")
    try:
        first = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
        said = fleet_file.parent / "logs" / "watcher.log"
        # the detached watcher reads fleet.yaml as it starts: only then is the obstacle placed
        _wait_for("the watcher watches", lambda: "watching 1 servers" in said.read_text(), 60, said)
        path = Path(first["log"]) if obstacle == "log" else fleet_file
        kept = fleet_file.read_text()
        aside = path.with_name(path.name + ".aside")
        path.rename(aside)
        path.mkdir()
        os.kill(first["pid"], signal.SIGKILL)
        _wait_for(
            "the watcher says the restart failed",
            lambda: "restart failed: " in said.read_text(),
            60,
            said,
        )
        path.rmdir()
        aside.rename(path)
        if obstacle == "fleet.yaml":
            assert fleet_file.read_text() == kept
        new = first
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and new["pid"] == first["pid"]:
            time.sleep(0.3)
            with contextlib.suppress(OSError, yaml.YAMLError, TypeError):
                new = yaml.safe_load(fleet_file.read_text())["endpoints"][0]
        assert new["pid"] != first["pid"], said.read_text()
        assert alive(new["pid"])
        down = run_cli("fleet", "down", str(fleet_file), "--grace", "5")
        assert ": stopped" in down.stdout, down.stdout + down.stderr
        assert not _port_open(base)  # no server a failed restart started is left behind
    finally:
        _kill_servers_on(base)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
