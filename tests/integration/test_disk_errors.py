"""Every command that writes local files meets a full or read-only disk with one line and exit 1
(issue 24): prepare, tokenize, merge (--out and
--tmp-dir), export (JSONL and parquet), report, and stats --json redirected to a file. No
traceback, the place named, and never the store's hard-link hint (which is about os.link).

A real disk: a 4 MiB tmpfs filled until the kernel answers ENOSPC, leaving a random number of
bytes free (the failure then lands at different points of the write, or not at all), or
remounted read-only (EROFS). Each command is the CLI in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.disk import can_mount, fill, read_only, tmpfs
from tests.integration.generate.helpers import code_chat_file, simulated_run, user_prompts

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "import sys; from draftdata.cli import main; main(sys.argv[1:])"]

# name -> (disk, inputs, scratch folder off the disk) -> (argv, stdout file or None)
Command = Callable[[Path, dict[str, str], Path], tuple[list[str], Path | None]]
COMMANDS: dict[str, Command] = {
    "prepare": lambda d, i, t: (
        ["prepare", i["prepare"], "--out", str(d / "prep"), "-q"],
        None,
    ),
    "tokenize": lambda d, i, t: (
        ["tokenize", i["run"], "--tokenizer", i["tok"], "--out", str(d / "tok"), "-q"],
        None,
    ),
    "merge --out": lambda d, i, t: (
        ["merge", "--add", i["chat"], "--out", str(d / "merged"), "-q"],
        None,
    ),
    "merge --tmp-dir": lambda d, i, t: (
        ["merge", "--add", i["chat"], "--out", str(t / "merged"), "--tmp-dir", str(d), "-q"],
        None,
    ),
    "export jsonl": lambda d, i, t: (
        ["export", i["run"], "--format", "sharegpt", "--out", str(d / "train.jsonl"), "-q"],
        None,
    ),
    "export parquet": lambda d, i, t: (
        ["export", i["run"], "--format", "parquet", "--out", str(d / "t.parquet"), "-q"],
        None,
    ),
    "report": lambda d, i, t: (["report", i["run"], "--out", str(d / "r.html"), "-q"], None),
    "stats --json > file": lambda d, i, t: (["stats", "--json", i["run"]], d / "stats.json"),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A run of 300 completions and its tokenizer, 20,000 chat rows, a prepare config."""
    if (why := can_mount()) is not None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("disk-inputs")
    run, tok = simulated_run(
        root, user_prompts(300, "Question {i}: what is {i} + {i}?"),
        mean_output_tokens=150, max_tokens=300, flush_records=50,
    )  # fmt: skip
    chat = code_chat_file(root / "chat.jsonl", 20_000, "Sort numbers, case {i}, in Python.")
    samples = root / "samples"
    subprocess.run([*CLI, "prepare", "--write-samples", str(samples)], check=True)
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "examples" / "quickstart.yaml").read_text(encoding="utf-8")
    cfg = root / "prepare.yaml"
    cfg.write_text(text.replace("path: samples/", f"path: {samples}/"), encoding="utf-8")
    return {"run": str(run), "tok": tok, "chat": str(chat), "prepare": str(cfg)}


def _run(name: str, disk: Path, inputs: dict[str, str], scratch: Path) -> tuple[int, str]:
    argv, stdout = COMMANDS[name](disk, inputs, scratch)
    with open(stdout, "w") if stdout is not None else open(os.devnull, "w") as out:
        res = subprocess.run(
            [*CLI, *argv],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    return res.returncode, res.stderr


def _one_line(name: str, stderr: str, what: str) -> None:
    assert "Traceback" not in stderr, f"{name}: {stderr[-3000:]}"
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"{name}: {stderr[-3000:]}"
    line = errors[0]
    assert what in line.lower() and "hard links" not in line, f"{name}: {line}"
    assert stderr.strip().splitlines()[-1] == line, f"{name}: {stderr[-3000:]}"


@pytest.mark.parametrize("name", list(COMMANDS))
@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(leave=st.one_of(st.just(0), st.integers(1, 1 << 20)))
def test_a_full_disk_is_one_line(
    inputs: dict[str, str], tmp_path_factory: pytest.TempPathFactory, name: str, leave: int
) -> None:
    base = tmp_path_factory.mktemp("full")
    with tmpfs(base / "disk") as disk:
        fill(disk, leave)
        code, stderr = _run(name, disk, inputs, base)
    if leave == 0:
        assert code == 1, f"{name}: exit {code}: {stderr[-3000:]}"
    assert code in (0, 1), f"{name}: exit {code}: {stderr[-3000:]}"
    if code == 1:
        _one_line(name, stderr, "no space left on the device")
        where = "standard output" if name.startswith("stats") else str(disk.name)
        assert where in stderr, f"{name}: {stderr}"


@pytest.mark.parametrize("name", [n for n in COMMANDS if not n.startswith("stats")])
def test_a_read_only_disk_is_one_line(inputs: dict[str, str], tmp_path: Path, name: str) -> None:
    with tmpfs(tmp_path / "disk") as disk:
        read_only(disk)
        code, stderr = _run(name, disk, inputs, tmp_path)
    assert code == 1, f"{name}: exit {code}: {stderr[-3000:]}"
    # refused before any work (the path checks' probe) or where the write fails (DiskError)
    _one_line(
        name,
        stderr,
        "read-only file system"
        if "choose a writable" in stderr
        else "the file system is read-only",
    )
    assert "free space" not in stderr
