"""A `reasoning: server` run renders in the thinking mode the server used.

The simulator started with thinking off (``--reasoning off``) puts the empty
``<think>\\n\\n</think>\\n\\n`` into every prompt after the generation prompt. The requests
leave the mode to the server (no ``enable_thinking``). Without token ids, generate asks the
server once at the start and records the mode in the run's manifest; with token ids, tokenize
reads it from each served prompt. Either way the empty think block is prompt (loss 0), and the
served ids verify.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet
from draftdata.store.read import iter_completions
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.encode import TokenizeContext
from draftdata.tokenize.stage import tokenize

pytestmark = pytest.mark.integration

EMPTY_THINK = "<think>\n\n</think>\n\n"


def _run(root: Path, tokenizer: Path, sim: SimConfig, token_ids: str) -> Path:
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Q {i}?"}]}) + "\n"
            for i in range(6)
        )
    )
    out = root / "run"
    with SimFleet(1, sim) as fleet:
        summary = generate(
            GenerateConfig(
                prompts=str(prompts),
                endpoints=fleet.urls,
                out=str(out),
                progress="plain",
                max_tokens=200,
                token_ids=token_ids,  # type: ignore[arg-type]
            ),
            handle_signals=False,
            log=lambda _line: None,
        )
    assert summary.completed == 6
    return out


def _loss_texts(ctx: TokenizeContext, out: Path) -> list[str]:
    rows = [r for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return [
        ctx.decode([i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
        for r in rows
    ]


@pytest.mark.parametrize("token_ids", ["off", "on"])
def test_server_thinking_off_is_recorded_and_rendered(
    demo_tokenizer: Path, tmp_path: Path, token_ids: str
) -> None:
    sim = SimConfig(
        tokenizer=str(demo_tokenizer), time_scale=0, mean_output_tokens=30, reasoning="off"
    )
    run = _run(tmp_path, demo_tokenizer, sim, token_ids)
    settings = json.loads((run / "manifest.json").read_text())["settings"]
    assert settings["reasoning"] == "server"
    out = tmp_path / "tok"
    summary = tokenize(TokenizeConfig(run=str(run), tokenizer=str(demo_tokenizer), out=str(out)))
    assert summary.count("samples") == 6 and summary.count("mismatched") == 0
    assert "server_chat_template_kwargs" not in settings  # per answer, not once per run
    if token_ids == "off":  # probed, recorded with each answer, checked against its tokens
        assert {c.server_thinking for c in iter_completions(str(run))} == {False}
        assert summary.count("thinking.prompt_tokens") == 6
    else:  # read from each completion's served prompt ids (nothing asked)
        assert {c.server_thinking for c in iter_completions(str(run))} == {None}
        assert summary.count("thinking_off_from_served_ids") == 6
        assert summary.count("verified") == 6
    ctx = TokenizeContext(str(demo_tokenizer))
    rows = [r for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    for row, loss in zip(rows, _loss_texts(ctx, out), strict=True):
        text = ctx.decode(row["input_ids"])
        assert EMPTY_THINK in text  # the server's prompt held it ...
        assert "<think>" not in loss and "</think>" not in loss  # ... never as target output
