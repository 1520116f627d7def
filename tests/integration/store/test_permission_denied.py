"""A shard (or the folder of shards) this user may not read: every reader of the run says it
is a permission problem, names the path and does not ask to run the same command again (that
cures nothing); ``run check`` neither counts it "not read now" nor sets it aside.

The denial is the kernel's: the shard's mode is 000 (or its folder's), and the command runs
in a child without the capabilities that let root read anyway (``setpriv``), as any user's
command would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.demo.tokenizer import ensure_demo_tokenizer
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
# root reads a mode-000 file: the child runs without those capabilities, as a user would
AS_USER = (
    ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
    if os.geteuid() == 0
    else []
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A finished local run of 40 prompts in ~4 shards, and its tokenizer."""
    if AS_USER and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: root reads a mode-000 file")
    root = tmp_path_factory.mktemp("denied")
    tok = ensure_demo_tokenizer(root / "tok")
    prompts = root / "prompts.jsonl"
    with prompts.open("w") as fh:
        for i in range(40):
            m = [{"role": "user", "content": f"Question {i}: what is {i} + 3?"}]
            fh.write(json.dumps({"id": f"q{i:03d}", "messages": m}) + "\n")
    sim = SimConfig(tokenizer=str(tok), time_scale=0, mean_output_tokens=30, tool_call_rate=0.0)
    with SimFleet(1, sim) as fleet:
        config = GenerateConfig(
            prompts=str(prompts), endpoints=fleet.urls, out=str(root / "run"),
            progress="off", max_tokens=60, flush_records=10,
        )  # fmt: skip
        generate(config, handle_signals=False, log=lambda _line: None)
    yield {"run": root / "run", "tok": Path(tok)}


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    command=st.sampled_from(["export", "stats", "tokenize", "check"]),
    what=st.sampled_from(["shard", "folder"]),
    which=st.integers(0, 100),
)
def test_a_shard_this_user_may_not_read_is_a_permission_error(
    world: dict[str, Path], command: str, what: str, which: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(world["run"], run)
        shards = sorted((run / "completions").glob("*.parquet"))
        denied = shards[which % len(shards)] if what == "shard" else run / "completions"
        tok = ["--tokenizer", str(world["tok"]), "--out", f"{tmp}/tk"]
        argv = {
            "export": ["export", str(run), "--format", "sharegpt", "--out", f"{tmp}/t.jsonl"],
            "stats": ["stats", str(run)],
            "tokenize": ["tokenize", str(run), *tok],
            "check": ["run", "check", str(run)],
        }[command]
        denied.chmod(0)
        try:
            done = subprocess.run(
                [*AS_USER, *CLI, *argv], capture_output=True, text=True, timeout=120
            )
        finally:
            denied.chmod(0o755 if denied.is_dir() else 0o644)
        assert not list(run.glob("quarantine/**/*.json"))  # nothing set aside
    err = done.stderr
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(lines) == 1, err
    assert "Traceback" not in err
    assert str(denied) in lines[0], lines[0]
    assert "permission denied" in lines[0], lines[0]
    assert "run the same command again" not in err and "not read now" not in err, err
    assert "does not help" in lines[0], lines[0]


def test_a_run_at_a_mount_root_skips_the_file_systems_lost_and_found(
    world: dict[str, Path],
) -> None:
    """A run store at a file system's root sits beside ``lost+found`` (mode 700, root's): a
    user's command lists the run without it, as before folders it cannot list were errors;
    a folder of the run's own that it cannot list is still one."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(world["run"], run)
        foreign = run / "lost+found"
        foreign.mkdir(mode=0o700)
        (foreign / "#1234").write_bytes(b"x")
        foreign.chmod(0o000)
        try:
            res = subprocess.run(
                [*AS_USER, *CLI, "stats", str(run), "--json"],
                capture_output=True, text=True, check=False, timeout=120,
            )  # fmt: skip
        finally:
            foreign.chmod(0o700)
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(res.stdout)["rows"] == 40
