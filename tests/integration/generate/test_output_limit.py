"""The default output limit against the simulator (8K context, long reasoning-like answers):
it fills the context per request, later turns carry the earlier answers, an explicit
--max-tokens still rules, and the summary warns when more than 5% of answers are cut."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, failures, fast_config, write_prompts

from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration
CONTEXT = 8192


def sim(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "time_scale": 0.0,
        "context_length": CONTEXT,
        "mean_output_tokens": 2000,
        "output_sigma": 0.8,
        "max_running": 32,
    }
    base.update(kw)
    return SimConfig(**base)


def cut_share(out: Path) -> float:
    got = completions(out)
    return sum(any(t.finish_reason == "length" for t in c.turns) for c in got) / len(got)


def test_default_fills_the_context_and_an_explicit_limit_still_rules(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 150)
    with SimFleet(2, sim()) as fleet:
        auto = generate(fast_config(prompts, tmp_path / "auto", fleet.urls, hedge=False))
        fixed = generate(
            fast_config(prompts, tmp_path / "fixed", fleet.urls, hedge=False, max_tokens=4096)
        )
    assert check_exactly_once(str(tmp_path / "auto"), set(ids)) == (150, 0)
    assert check_exactly_once(str(tmp_path / "fixed"), set(ids)) == (150, 0)
    for c in completions(tmp_path / "auto"):
        (turn,) = c.turns
        limit = c.sampling["max_tokens"]
        assert limit == c.sampling["max_completion_tokens"]
        assert turn.usage.prompt_tokens + limit < CONTEXT  # SGLang: strictly below
        assert limit > CONTEXT - 4 * turn.usage.prompt_tokens - 200  # and fills it
    assert {c.sampling["max_tokens"] for c in completions(tmp_path / "fixed")} == {4096}
    assert cut_share(tmp_path / "auto") < 0.05 < cut_share(tmp_path / "fixed")
    assert not any("warning" in line for line in auto.lines())
    (warning,) = [line for line in fixed.lines() if "warning" in line]
    assert "cut by the output limit" in warning and f"{fixed.truncated} of 150" in warning
    assert "raise it (now 4096)" in warning


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_later_turns_get_what_is_left_of_the_context(tmp_path: Path, flavor: str) -> None:
    """A multi-turn prompt's second request carries the first answer: its limit is smaller,
    and no turn fails context_length; a fixed 6144 (which used to fail about half of them
    whole) is lowered where the second turn would not fit, and counted."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 24, kind="multi")
    with SimFleet(1, sim(flavor=flavor, mean_output_tokens=3000, output_sigma=0.3)) as fleet:
        generate(fast_config(prompts, tmp_path / "auto", fleet.urls, hedge=False))
        fixed = generate(
            fast_config(prompts, tmp_path / "fixed", fleet.urls, hedge=False, max_tokens=6144)
        )
    assert failures(tmp_path / "auto") == [] and failures(tmp_path / "fixed") == []
    assert check_exactly_once(str(tmp_path / "fixed"), set(ids)) == (24, 0)
    assert fixed.clamped > 0
    assert any(f"output limit: {fixed.clamped} of" in line for line in fixed.lines())
    for c in completions(tmp_path / "fixed"):
        assert c.turns[-1].usage.prompt_tokens + c.sampling["max_tokens"] <= CONTEXT
    assert check_exactly_once(str(tmp_path / "auto"), set(ids)) == (24, 0)
    for c in completions(tmp_path / "auto"):
        first, second = c.turns
        last_limit = c.sampling["max_tokens"]  # the body of the last request
        # the second request carries the first answer (its content; the reasoning is dropped)
        assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20
        assert second.usage.prompt_tokens + last_limit <= CONTEXT  # it fits ...
        assert last_limit > CONTEXT - 2 * second.usage.prompt_tokens - 300  # ... and fills


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_a_prompt_longer_than_the_context_still_fails_context_length(
    tmp_path: Path, flavor: str
) -> None:
    """The shrink-and-retry of a computed limit never turns a too-long prompt into a loop or a
    different failure: it is the prompt's own context_length failure, one attempt."""
    import json

    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 3)
    with prompts.open("a", encoding="utf-8") as f:
        row = {"id": "long", "messages": [{"role": "user", "content": "word " * 400}]}
        f.write(json.dumps(row) + "\n")
    with SimFleet(1, sim(flavor=flavor, context_length=256, mean_output_tokens=20)) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls))
        sent = fleet.stats(0).requests
    assert summary.failed == {"context_length": 1} and summary.completed == 3
    (failure,) = failures(tmp_path / "run")
    assert failure.id == "long" and failure.attempts == 1
    assert sent == 3 + 1  # its estimate leaves the minimum limit: nothing smaller to try
    assert check_exactly_once(str(tmp_path / "run"), {*ids, "long"}) == (3, 1)
