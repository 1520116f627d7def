"""Multi-turn conversations against the simulator: the stop rule, regenerate prompts, seeds.

- A turn cut by max tokens, or a target turn that does not make the call whose tool result comes
  next, ends the conversation: the turns so far are committed, the completion says why, and
  generate's summary and ``stats`` count it.
- ``prompt_mode: regenerate`` keeps the user turns and tool results, so each gets its own answer
  (Infinity-Instruct's "Name a prime." + "And a larger one?" get two) and an agent's observation
  follows the target's own action.
- With a sampling seed, sample k sends seed + k, so the samples of a prompt differ.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.integration.generate.helpers import TOOLS, completions, fast_config, write_prompts

from draftdata.generate.config import Sampling
from draftdata.generate.stage import generate
from draftdata.prepare.config import DedupConfig, PrepareConfig, SourceConfig
from draftdata.prepare.stage import prepare
from draftdata.shared.conversation import (
    STOP_LENGTH,
    STOP_NO_TOOL_CALL,
    STOP_TOOL_MISMATCH,
    expand,
)
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.stats.compute import compute_stats

pytestmark = pytest.mark.integration

CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Accra"]


def sim(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {"time_scale": 0, "mean_output_tokens": 40, "output_sigma": 0.3}
    base.update(kw)
    return SimConfig(**base)


def test_a_cut_turn_stops_the_conversation(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 6, kind="multi")
    with SimFleet(1, sim(min_output_tokens=30)) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls, max_tokens=12))
    got = completions(tmp_path / "run")
    assert len(got) == 6
    for c in got:  # the second user turn is never sent after a cut answer
        assert [t.finish_reason for t in c.turns] == ["length"]
        assert c.stop_reason == STOP_LENGTH
    assert summary.stopped == {STOP_LENGTH: 6}
    assert any("stopped early: length 6" in line for line in summary.lines())
    stats = compute_stats(str(tmp_path / "run"))
    assert stats["stopped"] == {STOP_LENGTH: 6}


def _regenerate_sources(root: Path) -> list[SourceConfig]:
    infinity = root / "infinity.jsonl"
    rows = [
        {
            "id": "prime",
            "conversations": [
                {"from": "human", "value": "Name a prime."},
                {"from": "gpt", "value": "7"},
                {"from": "human", "value": "And a larger one?"},
                {"from": "gpt", "value": "11"},
            ],
        }
    ]
    infinity.write_text("".join(json.dumps(r) + "\n" for r in rows))
    agent = root / "agent.jsonl"
    with agent.open("w") as fh:
        for i, city in enumerate(CITIES):
            call = {
                "id": f"orig-{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            row = {
                "id": f"agent-{i}",
                "messages": [
                    {"role": "user", "content": f"Should I pack an umbrella for {city}?"},
                    {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"orig-{i}", "content": f"{city}: rain"},
                    {"role": "assistant", "content": "Yes, take one."},
                ],
                "tools": TOOLS,
            }
            fh.write(json.dumps(row) + "\n")
    return [
        SourceConfig(name="infinity", schema="infinity_instruct", path=str(infinity)),
        SourceConfig(name="agent", schema="openai", path=str(agent), domain="agent"),
    ]


@pytest.mark.parametrize("tool_call_rate", [1.0, 0.0])
def test_regenerate_answers_each_user_turn_and_tool_result(
    tmp_path: Path, tool_call_rate: float
) -> None:
    prep = prepare(
        PrepareConfig(
            sources=_regenerate_sources(tmp_path),
            out=str(tmp_path / "prompts"),
            prompt_mode="regenerate",
            dedup=DedupConfig(near=False),
        )
    )
    with SimFleet(1, sim(tool_call_rate=tool_call_rate)) as fleet:
        summary = generate(fast_config(prep.shards[0], tmp_path / "run", fleet.urls))
    got = {c.id: c for c in completions(tmp_path / "run")}
    prime = next(c for c in got.values() if c.source == "infinity")
    # both user turns answered, in order, the second after the target's own first answer
    assert len(prime.turns) == 2 and prime.stop_reason is None
    first, second = expand(prime)
    assert [m.content for m in first.context] == ["Name a prime."]
    assert [m.role for m in second.context] == ["user", "assistant", "user"]
    assert second.context[1].content == prime.turns[0].content
    assert second.context[2].content == "And a larger one?"

    agents = [c for c in got.values() if c.source == "agent"]
    assert len(agents) == len(CITIES)
    reasons: Counter[str | None] = Counter()
    for c in agents:
        reasons[c.stop_reason] += 1
        calls = [x["function"]["name"] for x in c.turns[0].tool_calls or []]
        if calls == ["get_weather"]:
            # the observation follows the target's own action, relinked to its call id
            assert len(c.turns) == 2 and c.stop_reason is None
            ctx = expand(c)[1].context
            assert [m.role for m in ctx] == ["user", "assistant", "tool"]
            assert ctx[1].tool_calls == c.turns[0].tool_calls
            assert ctx[2].tool_call_id == (c.turns[0].tool_calls or [{}])[0].get("id")
            assert ctx[2].content and ctx[2].content.endswith(": rain")
        else:  # no call, or another one: the original observation is never fed back
            assert len(c.turns) == 1
            assert c.stop_reason == (STOP_TOOL_MISMATCH if calls else STOP_NO_TOOL_CALL)
    if tool_call_rate == 0.0:
        assert reasons == {STOP_NO_TOOL_CALL: len(CITIES)}
    else:
        assert reasons[None] >= 1
    assert summary.stopped == {k: v for k, v in reasons.items() if k is not None}


def test_samples_of_one_prompt_send_seed_plus_k(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 3, kind="multi")  # multi-turn: one request chain per sample
    with SimFleet(1, sim()) as fleet:
        generate(
            fast_config(prompts, tmp_path / "run", fleet.urls, n=3, sampling=Sampling(seed=100))
        )
    got = completions(tmp_path / "run")
    assert len(got) == 9
    by_prompt: dict[str, list[Any]] = {}
    for c in got:
        assert c.sampling["seed"] == 100 + c.sample
        by_prompt.setdefault(c.id, []).append(tuple(t.content for t in c.turns))
    for answers in by_prompt.values():
        assert len(set(answers)) == 3  # the samples differ


def test_a_server_that_ignores_n_gets_one_seed_per_sample(tmp_path: Path) -> None:
    """Single-turn jobs ask for all samples at once; where the server answers fewer choices the
    rest go one request per sample, each with its own seed."""
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 4, kind="plain")
    with SimFleet(1, sim(max_choices=1)) as fleet:  # a server that ignores n: one choice
        generate(fast_config(prompts, tmp_path / "run", fleet.urls, n=3, sampling=Sampling(seed=5)))
    got = completions(tmp_path / "run")
    assert len(got) == 12
    for c in got:
        assert c.sampling["seed"] == 5 + c.sample
    for pid in {c.id for c in got}:
        assert len({c.turns[0].content for c in got if c.id == pid}) == 3
