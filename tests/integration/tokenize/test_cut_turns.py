"""A turn cut by the token limit, wherever the cut falls, is never a mismatch (issue 31).

The shape (generated): the simulator with the demo tokenizer answers the same kind of prompt
under every token limit from 1 to 48, with and without tools, so the cut falls at every place
of an answer: inside ``<think>``, inside the reasoning, right at ``</think>``, in the newlines
the template writes after it, inside the content, inside a tool call. For every cut answer:

- with the served token ids, tokenize keeps the served ids, each verified (a cut the stored text
  cannot place is verified against the prefix of the turn's rendering the ids spell:
  ``verified.cut``); where the ids go on past what the stored turn holds (a second tool call
  cut half-way, which the parser dropped) the sample is the served ids up to there
  (``verified.cut_trimmed``); none is mismatched or left unverifiable;
- without them (the rendered path), every sample is a prefix of what the server showed the
  target and the target wrote: no token the target did not write.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest
from tests.unit.tokenize.helpers import WEATHER_TOOL

from draftdata.generate.config import GenerateConfig, Override
from draftdata.generate.stage import generate
from draftdata.records import Completion
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet
from draftdata.store.read import iter_completions
from draftdata.store.run import Run
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.encode import TokenizeContext
from draftdata.tokenize.stage import tokenize

pytestmark = pytest.mark.integration

LIMITS = range(1, 49)


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory: pytest.TempPathFactory, demo_tokenizer: Path) -> Path:
    root = tmp_path_factory.mktemp("cuts")
    rows = []
    for limit in LIMITS:
        for j in range(4):
            row: dict[str, object] = {
                "id": f"p{limit}_{j}",
                "domain": f"cut{limit}",
                "messages": [{"role": "user", "content": f"Question {j}: {limit}?"}],
            }
            if j == 3:
                row["tools"] = [WEATHER_TOOL]
            rows.append(row)
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sim = SimConfig(
        tokenizer=str(demo_tokenizer),
        time_scale=0,
        mean_output_tokens=30,
        reasoning_share=0.5,
        tool_call_rate=1.0,
    )
    with SimFleet(1, sim) as fleet:
        summary = generate(
            GenerateConfig(
                prompts=str(prompts),
                endpoints=fleet.urls,
                out=str(root / "run"),
                progress="plain",
                max_tokens=400,
                overrides=[Override(domain=f"cut{n}", max_tokens=n) for n in LIMITS],
            ),
            handle_signals=False,
            log=lambda _line: None,
        )
    assert summary.completed == len(rows)
    return root / "run"


def _where(ctx: TokenizeContext, c: Completion) -> str:
    """Where the cut fell in the served output."""
    out = ctx.decode(c.turns[-1].output_token_ids or [])
    if "<tool_call>" in out:
        return "tool_call"
    if "</think>" not in out:
        return "think_open" if out.strip() in ("", "<think>") else "reasoning"
    after = out.split("</think>", 1)[1]
    return "content" if after.strip() else f"after_think{after.count(chr(10))}"


def _cut(run: Path) -> list[Completion]:
    return [c for c in iter_completions(str(run)) if c.turns[-1].finish_reason == "length"]


def test_every_cut_position_is_covered(cut_run: Path, demo_tokenizer: Path) -> None:
    ctx = TokenizeContext(str(demo_tokenizer))
    seen = Counter(_where(ctx, c) for c in _cut(cut_run))
    for where in ("think_open", "reasoning", "after_think0", "after_think1", "content"):
        assert seen[where], seen
    assert seen["tool_call"], seen


def test_served_ids_of_a_cut_turn_are_kept_and_verified(
    cut_run: Path, demo_tokenizer: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tok"
    summary = tokenize(
        TokenizeConfig(run=str(cut_run), tokenizer=str(demo_tokenizer), out=str(out))
    )
    assert summary.count("mismatched") == 0, summary.mismatches
    assert summary.count("unverifiable") == 0, summary.counts
    assert summary.count("verified.cut") > 0
    assert summary.count("verified") == summary.count("path.token_ids")
    ctx = TokenizeContext(str(demo_tokenizer))
    rows = {r["id"]: r for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()}
    trimmed = 0
    for c in _cut(cut_run):
        t = c.turns[-1]
        if len(c.turns) != 1 or c.id not in rows:
            continue  # too few loss tokens (a 1-token answer) is counted, not written
        row = rows[c.id]
        served = [*(t.prompt_token_ids or []), *(t.output_token_ids or [])]
        n, kept = len(t.prompt_token_ids or []), len(row["input_ids"])
        assert n < kept <= len(served) and row["input_ids"] == served[:kept], c.id
        assert row["loss_mask"] == [0] * n + [1] * (kept - n)
        if kept < len(served):
            trimmed += 1
            assert _where(ctx, c) == "tool_call" and t.tool_calls, c.id
    assert trimmed == summary.count("verified.cut_trimmed")


def test_the_rendered_path_never_trains_past_what_was_written(
    cut_run: Path, demo_tokenizer: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    with Run.open(str(plain), settings={"copy": True}) as run:
        for c in iter_completions(str(cut_run)):
            turns = [
                msgspec.structs.replace(t, prompt_token_ids=None, output_token_ids=None)
                for t in c.turns
            ]
            run.add_completion(msgspec.structs.replace(c, turns=turns))
    out = tmp_path / "tok"
    summary = tokenize(TokenizeConfig(run=str(plain), tokenizer=str(demo_tokenizer), out=str(out)))
    assert summary.count("path.rendered") == summary.count("completions")
    ctx = TokenizeContext(str(demo_tokenizer))
    rows = {r["id"]: r for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()}
    for c in _cut(cut_run):
        if len(c.turns) != 1 or c.id not in rows:
            continue
        t = c.turns[-1]
        served = ctx.decode([*(t.prompt_token_ids or []), *(t.output_token_ids or [])])
        row = rows[c.id]
        assert served.startswith(ctx.decode(row["input_ids"])), (c.id, _where(ctx, c))
