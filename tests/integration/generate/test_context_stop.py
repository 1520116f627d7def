"""A later turn that does not fit the context stops the conversation; it never fails the prompt.

The walkthrough's agent prompts with ``--max-tokens 6144`` on an 8K context used to fail whole
(their earlier generated turns thrown away) when a later turn, carrying the earlier answers,
overflowed. Now the turns that fit are committed and the completion's ``stop_reason`` is
``context`` (the one conversation rule), counted by generate's summary and ``stats``; only a
first request that does not fit is the prompt's ``context_length`` failure. Generated over
random contexts, answer lengths, turn counts and limits, strict or not, on the simulator.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import completions, failures, fast_config

from draftdata.generate.engine.limits import MIN_LIMIT
from draftdata.generate.stage import generate
from draftdata.records import Message
from draftdata.shared.conversation import STOP_CONTEXT, TurnPlan
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.sim.tokens import ApproxTokenizer
from draftdata.stats.compute import compute_stats

pytestmark = pytest.mark.integration


def write_conversations(path: Path, n: int, turns: int, words: int = 30) -> dict[str, TurnPlan]:
    """``n`` prompts of ``turns`` user messages (the original answers in between are
    replaced by the target's); returns each id's plan of requests."""
    plans = {}
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            messages: list[dict[str, Any]] = []
            for t in range(turns):
                messages.append({"role": "user", "content": f"Step {t} of task {i}. " * words})
                if t + 1 < turns:
                    messages.append({"role": "assistant", "content": "An original answer."})
            pid = f"agent-{i}"
            f.write(json.dumps({"id": pid, "domain": "agent", "messages": messages}) + "\n")
            plans[pid] = TurnPlan([Message(**m) for m in messages])
    return plans


def first_request_tokens(plan: TurnPlan) -> int:
    """The prompt tokens the simulator counts for a plan's first request."""
    tok = ApproxTokenizer()
    msgs = [{"role": m.role, "content": m.content} for m in plan.context(0, [])]
    ids, _ = tok.encode(tok.render_prompt(msgs, None, {}))
    return len(ids)


def sim(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {"time_scale": 0.0, "output_sigma": 0.2, "max_running": 16}
    base.update(kw)
    return SimConfig(**base)


def test_the_walkthrough_agent_prompts_keep_the_turns_that_fit(tmp_path: Path) -> None:
    """--max-tokens 6144 on 8K, answers of ~3,000 tokens: the third turn's history overflows.
    No prompt fails; each keeps its first turns; with --strict-limit the server's refusal of
    the overflowing turn stops the conversation with ``context`` too."""
    plans = write_conversations(tmp_path / "p.jsonl", 4, turns=4)
    with SimFleet(1, sim(mean_output_tokens=3000, reasoning_share=0.2)) as fleet:
        lowered = generate(
            fast_config(tmp_path / "p.jsonl", tmp_path / "run", fleet.urls, max_tokens=6144)
        )
        strict = generate(
            fast_config(
                tmp_path / "p.jsonl",
                tmp_path / "strict",
                fleet.urls,
                max_tokens=6144,
                strict_limit=True,
            )
        )
    for out, summary in ((tmp_path / "run", lowered), (tmp_path / "strict", strict)):
        assert failures(out) == [] and summary.failed == {}
        got = completions(out)
        assert sorted(c.id for c in got) == sorted(plans)  # none lost
        assert all(c.turns for c in got)
        stops = Counter(c.stop_reason for c in got if c.stop_reason)
        assert summary.stopped == dict(stops)
    strict_stops = [c for c in completions(tmp_path / "strict") if c.stop_reason == STOP_CONTEXT]
    assert strict_stops, "the 6,144-token limit overflows a later turn of some conversation"
    for c in strict_stops:
        assert 1 <= len(c.turns) < len(plans[c.id])
        assert c.sampling["max_tokens"] == 6144
    stats = compute_stats(str(tmp_path / "strict"))
    assert stats["stopped"].get(STOP_CONTEXT) == len(strict_stops)
    assert any(f"{STOP_CONTEXT} {len(strict_stops)}" in line for line in strict.lines())


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    context=st.integers(min_value=300, max_value=8192),
    answer=st.integers(min_value=20, max_value=3000),
    turns=st.integers(min_value=2, max_value=5),
    words=st.integers(min_value=2, max_value=120),
    limit=st.one_of(st.none(), st.integers(min_value=16, max_value=10_000)),
    strict=st.booleans(),
    flavor=st.sampled_from(["sglang", "vllm"]),
)
def test_random_conversations_never_lose_the_turns_that_fit(
    tmp_path_factory: pytest.TempPathFactory,
    context: int,
    answer: int,
    turns: int,
    words: int,
    limit: int | None,
    strict: bool,
    flavor: str,
) -> None:
    tmp = tmp_path_factory.mktemp("ctx")
    plans = write_conversations(tmp / "p.jsonl", 6, turns=turns, words=words)
    config = sim(context_length=context, mean_output_tokens=answer, flavor=flavor)
    strict = strict and limit is not None and limit < context
    with SimFleet(1, config) as fleet:
        cfg = fast_config(
            tmp / "p.jsonl", tmp / "run", fleet.urls, max_tokens=limit, strict_limit=strict
        )
        summary = generate(cfg, log=lambda _line: None)
    got = {c.id: c for c in completions(tmp / "run")}
    failed = {f.id: f for f in failures(tmp / "run")}
    assert set(got) | set(failed) == set(plans) and not set(got) & set(failed)
    for pid, f in failed.items():  # only a first request that does not fit fails the prompt
        assert f.reason == "context_length"
        need = first_request_tokens(plans[pid]) + (limit if strict and limit else MIN_LIMIT)
        assert need + 1 >= context, pid
    for pid, c in got.items():
        n = len(plans[pid])
        assert 1 <= len(c.turns) <= n
        if len(c.turns) < n:
            assert c.stop_reason is not None, pid  # a conversation cut short says why
        if c.stop_reason == STOP_CONTEXT:
            assert len(c.turns) < n
        for t in c.turns:
            assert t.usage.prompt_tokens + t.usage.completion_tokens <= context
    assert summary.stopped == dict(Counter(c.stop_reason for c in got.values() if c.stop_reason))
