"""Every command ends the same way whenever SIGINT or SIGTERM stops it: in its work, or after its
work is done and written (its summary file there) while it prints its summary or shuts down.

Either it finished (exit 0: the signal came after it had said everything, or after it exited),
or it exits 128 + the signal with the one line (which signal, what is kept, that the same
command resumes) and no traceback. Never Python's or click's own ending: a silent 130 or 143,
death by the signal (-2, -15), click's "Aborted!" (1). Before, a signal after the summary file
ended the command by those: the tests here accepted that.

"At work" is measured from the moment the command took SIGTERM over (``/proc/PID/status``'s
SigCgt: the command line's handler is installed, Python's start-up is over). "After the summary"
stops the process (SIGSTOP) the moment its summary file appears, signals it and lets it go on, so
the signal lands in that window whenever the process has not exited by then.

Real processes: the CLI in a new session, a simulator process for generate."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import code_chat_file, simulated_run, user_prompts
from tests.signals import default_signals

pytestmark = pytest.mark.chaos

CLI = "from draftdata.cli import main; main()"
COMMANDS = ["prepare", "tokenize", "merge", "export", "generate"]
LINE = (
    "draftdata: stopped by {}; what was written is kept, and the same command run again "
    "finishes the work"
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A run of 200 completions (tokenize, export), its tokenizer, 6,000 chat rows (merge), a
    prepare config over 6,000 rows, prompts for generate and a simulator to answer them."""
    from draftdata.sim.run import SimProcess

    root = tmp_path_factory.mktemp("endings")
    run, tok = simulated_run(
        root, user_prompts(200, "Question {i}: what is {i} + {i}?"),
        mean_output_tokens=60, max_tokens=120, flush_records=20,
    )  # fmt: skip
    chat = code_chat_file(root / "chat.jsonl", 6_000, "Write function {i} that sorts {i} numbers.")
    rows = root / "rows.jsonl"
    with rows.open("w") as fh:
        for i in range(6_000):
            q = f"Question {i}: how do {i % 613} and {i % 97} relate in case {i}?"
            fh.write(json.dumps({"instruction": q, "input": "", "output": f"They do, {i}."}) + "\n")
    cfg = root / "prepare.yaml"
    cfg.write_text(
        f"sources:\n  - {{name: rows, schema: alpaca, path: {rows}, domain: math}}\n"
        "seed: 0\nbudget: 3000\n"
    )
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps(p) + "\n" for p in user_prompts(120, "Say {i} twice, please."))
    )
    with SimProcess(n=1, args=["--time-scale", "0.02", "--mean-output-tokens", "40"]) as sim:
        yield {
            "run": str(run), "tok": tok, "chat": str(chat), "prepare": str(cfg),
            "prompts": str(prompts), "fleet": str(sim.fleet_yaml),
        }  # fmt: skip


def _command(command: str, inputs: dict[str, str], out: Path) -> tuple[list[str], Path]:
    """The command line and the file it writes when its work is done."""
    if command == "prepare":
        return ["prepare", inputs["prepare"], "--out", str(out)], out / "prepare_report.json"
    if command == "tokenize":
        args = ["tokenize", inputs["run"], "--tokenizer", inputs["tok"], "--out", str(out)]
        return args, out / "summary.json"
    if command == "merge":
        return ["merge", "--add", inputs["chat"], "--out", str(out)], out / "merge_report.json"
    if command == "export":
        out.mkdir()
        return ["export", inputs["run"], "--format", "sharegpt", "--out", str(out / "x.jsonl")], (
            out / "x.jsonl"
        )
    done = out.parent / f"{out.name}-summary.json"
    args = [
        "generate", "--prompts", inputs["prompts"], "--fleet", inputs["fleet"], "--out", str(out),
        "--progress", "off", "--flush-seconds", "0.2", "--grace-seconds", "5",
        "--summary-json", str(done),
    ]  # fmt: skip
    return args, done


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (SigCgt), i.e. the command line runs."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    command=st.sampled_from(COMMANDS),
    sig=st.sampled_from([signal.SIGINT, signal.SIGTERM]),
    when=st.sampled_from(["at work", "after the summary"]),
    delay=st.floats(0.0, 0.6),
)
@example(command="merge", sig=signal.SIGTERM, when="after the summary", delay=0.0)
@example(command="tokenize", sig=signal.SIGINT, when="after the summary", delay=0.0)
@example(command="prepare", sig=signal.SIGINT, when="after the summary", delay=0.0)
@example(command="export", sig=signal.SIGTERM, when="after the summary", delay=0.0)
@example(command="generate", sig=signal.SIGTERM, when="after the summary", delay=0.0)
@example(command="generate", sig=signal.SIGTERM, when="at work", delay=0.3)
def test_a_signal_ends_every_command_with_its_line_at_any_moment(
    inputs: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    command: str,
    sig: signal.Signals,
    when: str,
    delay: float,
) -> None:
    out = tmp_path_factory.mktemp("out") / "out"
    args, done = _command(command, inputs, out)
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=default_signals,
    )
    signalled = False
    try:
        deadline = time.monotonic() + 120
        if when == "at work":
            while not _catches_sigterm(proc.pid) and proc.poll() is None:
                assert time.monotonic() < deadline, f"{command} never started"
                time.sleep(0.005)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(sig)
                signalled = True
        else:
            while not done.exists() and proc.poll() is None:
                assert time.monotonic() < deadline, f"{command} never wrote {done.name}"
                time.sleep(0.001)
            if proc.poll() is None:
                proc.send_signal(signal.SIGSTOP)  # hold it where it is: just after the file
                proc.send_signal(sig)
                proc.send_signal(signal.SIGCONT)
                signalled = True
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stderr.decode(errors="replace")
    said = f"{command} {when} {sig.name}: exit {proc.returncode}\n{text[-2000:]}"
    if proc.returncode == 0:  # it had said everything, or exited, when the signal came
        assert done.exists(), said
        assert "Traceback" not in text, said
        return
    assert signalled, said
    assert proc.returncode == 128 + sig, said
    assert LINE.format(sig.name) in text, said
    assert text.count("draftdata: stopped by") == 1, said
    assert "Traceback" not in text and "Aborted" not in text, said
