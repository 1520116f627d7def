"""Fuzzed prompt files through a real ``generate`` run on the simulator: every valid line is
generated once, every bad line is a reject (file:line and reason in ``rejects/``), no line
ends the run. The reader-level fuzz with many more examples is tests/unit/generate/
test_prompt_lines.py; this one proves the whole command holds on a few drawn files."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import fast_config
from tests.unit.generate.test_prompt_lines import _lines

from draftdata.generate.stage import generate
from draftdata.records import BOM
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(1, SimConfig(time_scale=0.0, mean_output_tokens=20, max_running=32)) as f:
        yield f


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=_lines(), bom=st.booleans())
def test_fuzzed_prompt_file_through_generate(
    fleet: SimFleet, data: tuple[list[bytes], list[bool]], bom: bool
) -> None:
    lines, good = data
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.jsonl"
        prompts.write_bytes((BOM if bom else b"") + b"\n".join(lines) + b"\n")
        out = Path(tmp) / "run"
        summary = generate(fast_config(prompts, out, fleet.urls))
        ids = {json.loads(line)["id"] for line, ok in zip(lines, good, strict=True) if ok}
        assert check_exactly_once(str(out), ids) == (len(ids), 0)
        bad = [i + 1 for i, ok in enumerate(good) if not ok]
        assert summary.invalid_prompts == len(bad)
        rows = [
            json.loads(x)
            for f in (out / "rejects").glob("*.jsonl")
            for x in f.read_text().splitlines()
        ]
        assert [r["location"] for r in rows] == [f"{prompts}:{n}" for n in bad]
        assert all(r["reason"] for r in rows)
