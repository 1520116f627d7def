"""`tokenize --workers 2` and `merge --workers 2` stopped by a signal at a random moment: SIGTERM,
SIGINT once or twice (to the process, or to its process group as a Ctrl-C does) and SIGKILL.
Whatever the signal and the moment, every process of the command (the workers, the resource
tracker) is gone within a bound, and a reader of its stdout gets EOF (``... | tee log`` returns).

Real processes: the CLI in a new session, its descendants found with psutil by session id."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import code_chat_file, simulated_run, user_prompts
from tests.signals import default_signals, session_processes

pytestmark = pytest.mark.chaos

CLI = "from draftdata.cli import main; main()"  # this process is the command
EOF_WITHIN_S = 30.0  # from the signal to EOF on the command's stdout (a loaded 2-core box)
GONE_WITHIN_S = 10.0  # from EOF to no process of the session left


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A run of 300 completions (for tokenize), its tokenizer, and 40,000 chat rows (merge)."""
    root = tmp_path_factory.mktemp("signals")
    run, tok = simulated_run(
        root, user_prompts(300, "Question {i}: what is {i} + {i}?"),
        mean_output_tokens=120, max_tokens=240, flush_records=25,
    )  # fmt: skip
    chat = code_chat_file(root / "chat.jsonl", 40_000, "Write function {i} that sorts {i} numbers.")
    return {"run": str(run), "tok": tok, "chat": str(chat)}


def _args(command: str, inputs: dict[str, str], out: Path) -> list[str]:
    if command == "tokenize":
        return [
            "tokenize", inputs["run"], "--tokenizer", inputs["tok"], "--out", str(out),
            "--workers", "2", "--batch-rows", "2",
        ]  # fmt: skip
    return ["merge", "--add", inputs["chat"], "--out", str(out), "--workers", "2"]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    command=st.sampled_from(["tokenize", "merge"]),
    how=st.sampled_from(["SIGTERM", "SIGINT", "SIGINT twice", "Ctrl-C twice", "SIGKILL"]),
    after_workers=st.booleans(),
    delay=st.floats(0.0, 2.5),
    gap=st.floats(0.0, 0.6),
)
def test_workers_end_with_their_parent(
    inputs: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    command: str,
    how: str,
    after_workers: bool,
    delay: float,
    gap: float,
) -> None:
    out = tmp_path_factory.mktemp("out") / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, *_args(command, inputs, out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_signals,
    )
    sid = proc.pid
    output: list[bytes] = []
    eof = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        output.append(proc.stdout.read())  # returns at EOF: every holder of the pipe is gone
        eof.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if after_workers:  # the moment the workers run (or the command has ended)
            deadline = time.monotonic() + 120
            while len(session_processes(sid)) < 3 and proc.poll() is None:
                assert time.monotonic() < deadline, "the workers never started"
                time.sleep(0.05)
        time.sleep(delay)
        sig = signal.SIGKILL if how == "SIGKILL" else getattr(signal, how.split()[0], None)
        for i in range(2 if "twice" in how else 1):
            if i:
                time.sleep(gap)
            if how.startswith("Ctrl-C"):
                os.killpg(sid, signal.SIGINT)  # a terminal sends it to the foreground group
            elif proc.poll() is None:
                assert sig is not None
                os.kill(proc.pid, sig)
        assert eof.wait(EOF_WITHIN_S), (
            f"{command} {how}: stdout still open {EOF_WITHIN_S:g} s after the signal; alive: "
            f"{[p.cmdline()[-3:] for p in session_processes(sid)]}"
        )
        proc.wait(timeout=EOF_WITHIN_S)
        left = session_processes(sid)
        deadline = time.monotonic() + GONE_WITHIN_S
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = session_processes(sid)
        assert not left, f"{command} {how}: processes left: {[p.cmdline() for p in left]}"
        text = b"".join(output).decode(errors="replace")
        code = proc.returncode
        if how == "SIGKILL":
            assert code in (0, -signal.SIGKILL), text[-2000:]
        elif after_workers and code != 0:  # the command line runs (its handler is in): in
            # the pool or after it, a first or a second signal, 128 + signal and the line
            sig = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
            assert code == 128 + sig, text[-2000:]
            assert f"draftdata: stopped by {sig.name}; what was written is kept" in text, text
    finally:
        for p in session_processes(sid):  # only this test's own processes, by their session
            try:
                p.kill()
            except psutil.Error:
                continue
        proc.wait(timeout=30)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    command=st.sampled_from(["tokenize", "merge"]),
    how=st.sampled_from(["SIGTERM", "SIGINT", "Ctrl-C"]),
    workers=st.sampled_from([1, 2]),
    delay=st.floats(0.0, 0.5),
)
@example(command="merge", how="SIGTERM", workers=1, delay=0.0)
@example(command="merge", how="Ctrl-C", workers=1, delay=0.2)
def test_a_signal_says_how_a_command_stopped_with_or_without_workers(
    inputs: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    command: str,
    how: str,
    workers: int,
    delay: float,
) -> None:
    """One signal while tokenize or merge works: exit 128 + signal and the same line, whether
    it runs worker processes (``--workers 2``) or not (``--workers 1`` ended by Python's
    default handlers: tokenize 130 / 143 and nothing said, merge click's "Aborted!" or 143),
    and whether it lands in the work or after it (test_signal_endings.py)."""
    out = tmp_path_factory.mktemp("out") / "out"
    args = _args(command, inputs, out)
    args[args.index("--workers") + 1] = str(workers)
    done_file = out / ("summary.json" if command == "tokenize" else "merge_report.json")
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        if command == "tokenize":  # at work: its first output shard is written
            while not list(out.glob("**/*.parquet")):
                assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
                assert time.monotonic() < deadline, "tokenize wrote nothing"
                time.sleep(0.02)
        else:  # merge reads its 40,000 rows for seconds before it writes: at work once started
            time.sleep(1.0)
        time.sleep(delay)
        if proc.poll() is not None:  # finished first: nothing to say about a signal
            return
        sig = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
        if how == "Ctrl-C":
            os.killpg(proc.pid, signal.SIGINT)  # a terminal sends it to the foreground group
        else:
            os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=EOF_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    if proc.returncode == 0:  # the signal came as it finished: it said what it did
        assert done_file.exists(), text[-2000:]
        return
    # whenever it lands (in the work, or after the summary file is written, as the command
    # prints its summary or shuts down): 128 + signal and the line, never a silent exit
    assert proc.returncode == 128 + sig, (workers, how, text[-2000:])
    assert (
        f"draftdata: stopped by {sig.name}; what was written is kept, and the same command run "
        "again finishes the work"
    ) in text, (workers, how, text[-2000:])
    assert "Traceback" not in text, text[-2000:]


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(command=st.sampled_from(["tokenize", "merge"]), delay=st.floats(0.0, 1.2))
@example(command="tokenize", delay=0.3)
@example(command="merge", delay=0.3)
def test_a_worker_killed_from_outside_ends_the_command_in_one_line(
    inputs: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    command: str,
    delay: float,
) -> None:
    """A worker SIGKILLed by someone else (the out-of-memory killer) while the command works:
    it ends within the bound in one line naming the signal, exit 1, no traceback (it was a
    ``BrokenProcessPool`` traceback, or a hang when the worker died sending a result); the same
    command run again finishes the output."""
    out = tmp_path_factory.mktemp("out") / "out"
    args = [sys.executable, "-c", CLI, *_args(command, inputs, out)]
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while (
            len(session_processes(proc.pid)) < 3 and proc.poll() is None
        ):  # parent, tracker, a worker
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.02)
        time.sleep(delay)
        workers = [
            p
            for p in session_processes(proc.pid)
            if p.pid != proc.pid and "spawn_main" in " ".join(p.cmdline())
        ]
        if workers:
            with contextlib.suppress(psutil.Error):
                workers[0].kill()
        _, err = proc.communicate(timeout=EOF_WITHIN_S)
    finally:
        for p in session_processes(proc.pid):
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.wait(timeout=30)
    text = err.decode(errors="replace")
    if proc.returncode == 0:  # the worker had done its tasks: nothing to say
        return
    assert proc.returncode == 1, text[-2000:]
    assert "error: a worker process of this command was killed by SIGKILL" in text, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    again = subprocess.run(args, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode(errors="replace")[-2000:]
