"""Fuzzed prompt files through a real ``generate`` run on the simulator: every valid line is
generated once, every bad line is a reject (file:line and reason in ``rejects/``), no line
ends the run; a file with no prompt at all among its first lines stops before anything is
recorded (a file in another schema, generate/prompts/rejects.py). The reader-level fuzz with many
more examples is tests/unit/generate/test_prompt_lines.py; this one proves the whole command holds
on a few drawn files."""

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

from draftdata.errors import InputError
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
        if not any(good):  # no prompt among the first lines: a file in another schema
            with pytest.raises(InputError, match=r"none of the first .* lines is a prompt"):
                generate(fast_config(prompts, out, fleet.urls))
            assert not (out / "completions").exists()  # nothing was recorded
            return
        summary = generate(fast_config(prompts, out, fleet.urls))
        ids = {json.loads(line)["id"] for line, ok in zip(lines, good, strict=True) if ok}
        assert check_exactly_once(str(out), ids) == (len(ids), 0)
        bad = [i + 1 for i, ok in enumerate(good) if not ok]
        assert summary.invalid_prompts == len(bad)
        assert summary.remaining == 0  # a rejected line is not left to do
        rows = [
            json.loads(x)
            for f in (out / "rejects").glob("*.jsonl")
            for x in f.read_text().splitlines()
        ]
        assert [r["location"] for r in rows] == [f"{prompts}:{n}" for n in bad]
        assert all(r["reason"] for r in rows)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ids=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=1, max_size=30))
def test_a_repeated_id_is_a_reject_not_a_silent_drop(fleet: SimFleet, ids: list[str]) -> None:
    """Lines reusing an earlier line's id (with other text) are each rejected as duplicate_id
    with their location; the first line of every id is generated once; a resumed command
    (everything settled) rejects the same lines."""
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.jsonl"
        rows = [
            {"id": pid, "messages": [{"role": "user", "content": f"question {n} of {pid}"}]}
            for n, pid in enumerate(ids)
        ]
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out = Path(tmp) / "run"
        seen: set[str] = set()
        dup_lines = []
        for n, pid in enumerate(ids, start=1):
            if pid in seen:
                dup_lines.append(n)
            seen.add(pid)
        for attempt in range(2):  # the run, then a resume with every prompt settled
            summary = generate(fast_config(prompts, out, fleet.urls, writer_id=f"w{attempt}"))
            assert summary.invalid_prompts == len(dup_lines)
            assert summary.remaining == 0
            assert check_exactly_once(str(out), seen) == (len(seen), 0)
            got = (
                [
                    json.loads(x)
                    for x in (out / "rejects" / f"w{attempt}.jsonl").read_text().splitlines()
                ]
                if dup_lines
                else []
            )
            assert [r["location"] for r in got] == [f"{prompts}:{n}" for n in dup_lines]
            assert all(r["reason"].startswith("duplicate_id") for r in got)
        # the first line of each id is the one answered
        from draftdata.store.read import iter_completions

        for c in iter_completions(str(out)):
            first = ids.index(c.id)
            assert c.messages[-1].content == f"question {first} of {c.id}"
