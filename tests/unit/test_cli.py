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
