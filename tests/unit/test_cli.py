"""The CLI's exit-code contract."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from draftdata.cli import main; main()", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_version_and_help() -> None:
    out = _run("--version")
    assert out.returncode == 0 and out.stdout.startswith("draftdata ")
    helped = _run("--help")
    assert helped.returncode == 0
    for cmd in ("prepare", "generate", "export", "tokenize", "merge", "stats", "report", "fleet"):
        assert cmd in helped.stdout


def test_usage_error_is_exit_2() -> None:
    assert _run("stats", "--no-such-flag").returncode == 2


def test_a_caller_in_process_gets_its_signal_handlers_back() -> None:
    """``main(argv)`` called in a process of its own (a test, a script): the command line's
    handler holds SIGINT/SIGTERM only while the command runs, then Python's come back (the
    console script, ``main()``, leaves them ignored instead: it is about to exit)."""
    import signal

    import pytest

    from draftdata.cli import main

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    before = {s: signal.signal(s, h) for s, h in defaults.items()}
    try:
        with pytest.raises(SystemExit) as done:
            main(["--version"])
        assert done.value.code in (0, None)
        assert {s: signal.getsignal(s) for s in defaults} == defaults
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_the_console_script_says_how_a_signal_stopped_it_and_ignores_a_late_one() -> None:
    """A signal while the command runs: its line and 128 + the signal; once it has said
    everything (``main()`` returned), a signal no longer ends it."""
    code = (
        "import os, signal\n"
        "from draftdata.cli import app, main\n"
        "@app.command('sleepy', hidden=True)\n"
        "def sleepy() -> None:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # after the command: ignored\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "sleepy"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip().splitlines() == [
        "draftdata: stopped by SIGTERM; what was written is kept, and the same command run "
        "again finishes the work"
    ]
    late = subprocess.run(
        [sys.executable, "-c", code.replace("signal.SIGTERM)", "0)"), "sleepy"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert late.returncode == 0 and late.stderr == "", late.stderr
