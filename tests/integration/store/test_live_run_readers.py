"""tokenize, export and merge refuse a run that a live generate still writes (issue 24: they
exited 0 on the 74 of 1,200 completions committed so far, and the partial samples were merged as
the whole run). Real processes: the simulator, ``draftdata generate`` (the whole run or one
partition of it, so the partition leases count too), and each reader as the CLI at a random
moment after the first shard. Once generate has stopped, the same commands read the run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import write_prompts
from tests.signals import default_signals

from draftdata.demo.tokenizer import ensure_demo_tokenizer
from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "import sys; from draftdata.cli import main; main(sys.argv[1:])"]


def _readers(run: Path, tok: str, out: Path) -> dict[str, list[str]]:
    return {
        "tokenize": ["tokenize", str(run), "--tokenizer", tok, "--out", str(out / "tok"), "-q"],
        "export": ["export", str(run), "--format", "sharegpt", "--out", str(out / "t.jsonl")],
        "merge": ["merge", "--add", str(run), "--out", str(out / "merged"), "-q"],
    }


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(ensure_demo_tokenizer(tmp_path_factory.mktemp("tok") / "tok"))


@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scope=st.sampled_from([None, "0/2", "1/2"]), delay=st.floats(0.0, 2.0))
def test_readers_refuse_a_run_being_written(
    tmp_path_factory: pytest.TempPathFactory, tok: str, scope: str | None, delay: float
) -> None:
    root = tmp_path_factory.mktemp("live")
    prompts = root / "p.jsonl"
    write_prompts(prompts, 1200)
    run = root / "run"
    sim_args = ["--time-scale", "0.5", "--max-running", "8", "--mean-output-tokens", "60"]
    sim_args += ["--tokenizer", tok]
    with SimProcess(n=1, args=sim_args) as sim:
        cmd = [*CLI, "generate", "--prompts", str(prompts), "--out", str(run)]
        cmd += ["--endpoint", sim.urls[0], "--max-tokens", "64", "--flush-seconds", "0.3"]
        cmd += ["--progress", "off", "--grace-seconds", "2"]
        if scope is not None:
            cmd += ["--partition", scope]
        log = root / "generate.log"
        with log.open("w") as err:
            gen = subprocess.Popen(cmd, stdout=err, stderr=err, preexec_fn=default_signals)
        try:
            deadline = time.monotonic() + 90
            shards = run / "completions"
            while not (shards.exists() and any(shards.glob("*.parquet"))):
                assert time.monotonic() < deadline and gen.poll() is None, log.read_text()
                time.sleep(0.1)
            time.sleep(delay)
            for name, argv in _readers(run, tok, root / "early").items():
                res = subprocess.run(
                    [*CLI, *argv], capture_output=True, text=True, timeout=300, check=False
                )
                assert gen.poll() is None, "generate ended before the readers ran"
                assert res.returncode == 1, f"{name}: exit {res.returncode}: {res.stderr[-2000:]}"
                lines = [x for x in res.stderr.splitlines() if x.strip()]
                assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
                assert "generate is still writing this run" in lines[0]
                assert f"pid {gen.pid}" in lines[0]
            assert not any((root / "early").glob("**/*.parquet"))
            assert not (root / "early" / "t.jsonl").exists()
            assert not (root / "early" / "tok" / "tokenize_config.json").exists()
            gen.send_signal(signal.SIGTERM)
            gen.wait(timeout=60)
        finally:
            if gen.poll() is None:
                gen.kill()
                gen.wait()
    committed = sum(pq.read_metadata(p).num_rows for p in (run / "completions").glob("*.parquet"))
    assert 0 < committed < 1200
    for name, argv in _readers(run, tok, root / "after").items():
        res = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{name}: {res.stderr[-2000:]}"
    samples = sum(pq.read_metadata(p).num_rows for p in (root / "after" / "tok").glob("*.parquet"))
    assert samples == committed
