"""kill -9 `hidden-states` at random moments (twice), then the same command: no sample file is
rewritten (each one a kill left keeps its inode, mtime and bytes), none is missing, none is
there twice, every file holds its sample's tokens and states, and the set is verified.

A kill lands at a random moment after a random number of store writes (a thread sleeps a
random few milliseconds after the N-th write starts, then SIGKILLs the process), so kills fall
before, inside and after a file's temp write, link and fsync, between a file and the next, and
during the manifest, index and speculators' dataset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.integration.hidden.helpers import (
    cpu_env,
    samples_of,
    stats_of,
    target_for,
    tokenized_run,
)
from tests.signals import default_signals, session_processes

pytest.importorskip("torch")

from draftdata.hidden.setfiles import read_set
from draftdata.hidden.writers import writer_for

pytestmark = pytest.mark.chaos

DRIVER = """
import os, random, signal, sys, threading, time
from draftdata.store.base import Store
after = int(os.environ["KILL_AFTER"])
delay = float(os.environ["KILL_DELAY_MS"]) / 1000
count = 0
put_new = Store.put_new
def kill_soon():
    time.sleep(delay)
    os.kill(os.getpid(), signal.SIGKILL)
def counting_put_new(self, key, data):
    global count
    count += 1
    if count == after:
        threading.Thread(target=kill_soon, daemon=True).start()
    put_new(self, key, data)
Store.put_new = counting_put_new
from draftdata.cli import main
main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hidden-chaos")
    tok_dir, tok = tokenized_run(root, n=30)
    return tok_dir, target_for(tok, root / "target")


def _cli(tok_dir: Path, target: Path, out: Path, fmt: str, compress: str) -> list[str]:
    return ["hidden-states", str(tok_dir), "--model", str(target), "--out", str(out),
            "--format", fmt, "--compress", compress, "--gpus", "cpu", "--batch-tokens", "300",
            "--verify", "4", "-q"]  # fmt: skip


def _kill(cli: list[str], after: int, delay_ms: int) -> int:
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, *cli],
        env={**cpu_env(), "KILL_AFTER": str(after), "KILL_DELAY_MS": str(delay_ms)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode in (0, -9), res.stderr[-3000:]
    return res.returncode


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fmt=st.sampled_from([("speculators", "none"), ("specforge", "none"), ("specforge", "gzip")]),
    kills=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=2, max_size=2),
)
def test_kill_9_at_random_moments_then_resume(
    inputs: tuple[Path, Path], tmp_path: Path, fmt: tuple[str, str], kills: list[tuple[int, int]]
) -> None:
    import tempfile

    import torch

    tok_dir, target = inputs
    out = Path(tempfile.mkdtemp(dir=tmp_path)) / "set"
    cli = _cli(tok_dir, target, out, *fmt)
    seen: dict[str, tuple[int, int, int]] = {}
    for after, delay in kills:
        _kill(cli, after, delay)
        if (out / "hidden_states").exists():
            now = stats_of(out)
            assert {k: now[k] for k in seen} == seen  # nothing a kill left was rewritten
            seen = now
    from draftdata.cli import main

    try:
        main(cli)
    except SystemExit as exc:
        assert not exc.code
    final = stats_of(out)
    assert {k: final[k] for k in seen} == seen  # the resume rewrote nothing either
    hs = read_set(str(out))
    samples = samples_of(tok_dir)
    index = hs.index.to_pylist()
    assert sorted(r["id"] for r in index) == sorted(samples)  # each sample once in the index
    w = writer_for(fmt[0], compress=fmt[1])  # type: ignore[arg-type]
    assert sorted(final) == sorted(r["file"].split("/")[-1] for r in index)  # none missing
    for r in index:  # each file holds its own sample
        stored = w.decode((out / r["file"]).read_bytes())
        assert stored.input_ids.tolist() == samples[r["id"]]["input_ids"]
        assert torch.isfinite(stored.states).all()
        assert stored.states.shape[0] == len(samples[r["id"]]["input_ids"])
    assert hs.summary is not None and hs.summary["complete"]
    assert hs.summary["verification"]["passed"]
    # the temp files the kills left were swept at the resume's start: none holds disk
    leftovers = [p.name for p in (out / "hidden_states").iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert np.isfinite(hs.summary["tokens_per_s"])
    assert os.path.exists(out / "hidden_index.parquet")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_says_how_hidden_states_stopped_then_it_resumes(
    inputs: tuple[Path, Path], tmp_path: Path, sig: int
) -> None:
    """SIGTERM or SIGINT while the target runs (one CPU device, no worker process): exit 128 +
    the signal and the one line every command says (before: click's "Aborted!" on SIGINT,
    nothing on SIGTERM), the files it committed kept; the same command finishes the set."""
    tok_dir, target = inputs
    out = tmp_path / "set"
    cli = _cli(tok_dir, target, out, "speculators", "none")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from draftdata.cli import main; main()", *cli],
        env=cpu_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=default_signals,
    )
    try:
        deadline = time.monotonic() + 240
        while not list((out / "hidden_states").glob("hs_*")):
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "hidden-states wrote nothing"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    if proc.returncode == 0:  # it finished before the signal landed
        return
    assert proc.returncode == 128 + sig, text[-2000:]
    name = signal.Signals(sig).name
    assert f"draftdata: stopped by {name}; what was written is kept" in text, text[-2000:]
    kept = stats_of(out)
    from draftdata.cli import main

    try:
        main(cli)
    except SystemExit as exc:
        assert not exc.code
    final = stats_of(out)
    assert {k: final[k] for k in kept} == kept  # nothing it committed was rewritten
    hs = read_set(str(out))
    assert hs.summary is not None and hs.summary["complete"]
    assert sorted(r["id"] for r in hs.index.to_pylist()) == sorted(samples_of(tok_dir))


@settings(
    max_examples=1,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(moment=st.sampled_from(["as the models load", "as it computes"]), delay=st.floats(0, 1.5))
@example(moment="as the models load", delay=0.0)
@example(moment="as it computes", delay=0.0)
def test_a_worker_killed_on_several_devices_ends_the_command_in_one_line(
    inputs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, moment: str, delay: float
) -> None:
    """`--gpus cpu:2` (a worker process per device), one worker SIGKILLed from outside (the
    out-of-memory killer: a model that does not fit, a batch too large): the command ends in
    the line that names the signal, exit 1, no traceback, the other worker killed rather than
    waited for, and the same command finishes the set. The pools were closed as if nothing
    had gone wrong, so the pool's ``BrokenProcessPool`` came out as a traceback after the
    other device's queued batches."""
    import contextlib

    import psutil

    tok_dir, target = inputs
    out = tmp_path_factory.mktemp("two") / "set"
    cli = [*_cli(tok_dir, target, out, "speculators", "none")]
    cli[cli.index("--gpus") + 1] = "cpu:2"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from draftdata.cli import main; main()", *cli],
        env=cpu_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:  # the moment: both workers spawned, or the first file written
            workers = [
                p
                for p in session_processes(proc.pid)
                if p.pid != proc.pid and "spawn_main" in " ".join(p.cmdline())
            ]
            ready = len(workers) >= 2 and (
                moment == "as the models load" or list((out / "hidden_states").glob("hs_*"))
            )
            if ready or proc.poll() is not None:
                break
            assert time.monotonic() < deadline, "hidden-states wrote nothing"
            time.sleep(0.02)
        time.sleep(delay)
        killed = time.monotonic()
        with contextlib.suppress(psutil.Error, IndexError):
            workers[0].kill()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        for p in session_processes(proc.pid):
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.wait(timeout=30)
    text = err.decode(errors="replace")
    if proc.returncode == 0:  # it finished before the kill
        return
    assert proc.returncode == 1, text[-3000:]
    assert "error: a worker process of this command was killed by SIGKILL" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "fewer devices in --gpus use less memory" in text, text[-3000:]  # (no --workers)
    assert took < 30, took
    if moment == "as the models load":  # nothing written: the rerun is the other case's
        return
    from draftdata.cli import main

    try:
        main(cli)
    except SystemExit as exc:
        assert not exc.code
    hs = read_set(str(out))
    assert hs.summary is not None and hs.summary["complete"]
    assert sorted(r["id"] for r in hs.index.to_pylist()) == sorted(samples_of(tok_dir))
