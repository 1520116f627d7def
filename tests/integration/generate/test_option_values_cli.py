"""Odd option values on the command line against a live simulator (issue 24): a non-finite or
negative number is one line and exit 1 before the run is created, never a manifest.json with
NaN in it (not JSON) or a run with a negative timeout."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.generate.helpers import write_prompts

from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with SimFleet(1, SimConfig(time_scale=0, mean_output_tokens=8)) as fleet:
        yield fleet.urls[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--temperature", "nan"], "--temperature: nan is not a finite number"),
        (["--top-p", "inf"], "--top-p: inf is not a finite number"),
        (["--temperature", "-0.5"], "--temperature: -0.5 is out of range"),
        (["--read-timeout", "-1"], "--read-timeout: -1.0 is out of range"),
        (["--grace-seconds", "nan"], "--grace-seconds: nan is not a finite number"),
        (["--flush-seconds", "-inf"], "--flush-seconds: -inf is not a finite number"),
        (["--extra-body", '{"min_p": NaN}'], "--extra-body: NaN and Infinity"),
    ],
)
def test_an_odd_number_is_one_line_and_no_run(
    tmp_path: Path, sim_url: str, args: list[str], said: str
) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 3)
    out = tmp_path / "run"
    res = subprocess.run(
        [*CLI, "-p", str(prompts), "-e", sim_url, "-o", str(out), "--progress", "off", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and said in lines[0], res.stderr
    assert not out.exists()
