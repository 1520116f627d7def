"""Oracle: our ids and loss masks equal transformers' apply_chat_template on the same turns.

The demo tokenizer's template has ``{% generation %}`` markers, so transformers'
``return_assistant_tokens_mask`` is the reference mask. A conversation the template keeps
intact is one sample and must match exactly; one it rewrites (earlier reasoning dropped) is
split per turn, and each sample must match apply_chat_template on that turn's conversation,
with loss only on that turn (the rewritten earlier turns are context, loss 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.unit.tokenize.helpers import WEATHER_TOOL, call, completion, context_upto
from transformers import AutoTokenizer

from draftdata.shared.formats import completions_table
from draftdata.tokenize.encode import TokenizeContext, tokenize_table

U = "user"
A = "assistant"


def msg(role: str, content: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


# name -> (conversation, tools, template kwargs, keep_reasoning_history, samples expected)
CASES: dict[
    str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], bool, int]
] = {
    "reasoning": (
        [
            msg("system", "Be brief."),
            msg(U, "What is 12*12?"),
            msg(A, "12*12 = 144.", reasoning_content="\n12*12 is 144.\n"),
        ],
        None,
        {},
        False,
        1,
    ),
    "unicode": (
        [
            msg(U, "Traduis «café» en 日本語 🙂"),
            msg(A, "コーヒー ☕ — «café» → 日本語: コーヒー", reasoning_content="naïve über ½ ∑"),
        ],
        None,
        {},
        False,
        1,
    ),
    "empty_reasoning": (
        [msg(U, "Say hi"), msg(A, "Hi!", reasoning_content="")],
        None,
        {},
        False,
        1,
    ),
    "no_reasoning_field": ([msg(U, "Say hi"), msg(A, "Hi!")], None, {}, False, 1),
    "thinking_off": (
        [msg(U, "Say hi"), msg(A, "Hi there.")],
        None,
        {"enable_thinking": False},
        False,
        1,
    ),
    "tool_call": (
        [
            msg(U, "Weather in Paris?"),
            msg(
                A,
                "",
                reasoning_content="Need the tool.",
                tool_calls=[call("get_weather", '{"city": "Paris"}')],
            ),
        ],
        [WEATHER_TOOL],
        {},
        False,
        1,
    ),
    "tool_chain_kept": (
        [
            msg(U, "Weather in Paris and Lima?"),
            msg(
                A,
                "Checking.",
                reasoning_content="Two calls.",
                tool_calls=[
                    call("get_weather", '{"city": "Paris"}'),
                    call("get_weather", '{"city": "Lima"}', 1),
                ],
            ),
            msg("tool", '{"temp": 20}', tool_call_id="call_0"),
            msg("tool", '{"temp": 25}', tool_call_id="call_1"),
            msg(A, "Paris 20, Lima 25.", reasoning_content="Both known."),
        ],
        [WEATHER_TOOL],
        {},
        True,
        1,
    ),
    "multi_turn": (
        [
            msg("system", "You are terse."),
            msg(U, "First?"),
            msg(A, "One.", reasoning_content="count"),
            msg(U, "Second?"),
            msg(A, "Two.", reasoning_content="count again"),
            msg(U, "Third, in 日本語?"),
            msg(A, "三。", reasoning_content=""),
        ],
        None,
        {},
        False,
        3,
    ),
    "tool_chain_history_dropped": (
        [
            msg(U, "Weather in Paris?"),
            msg(
                A,
                "",
                reasoning_content="Call it.",
                tool_calls=[call("get_weather", '{"city": "Paris"}')],
            ),
            msg("tool", '{"temp": 20}', tool_call_id="call_0"),
            msg(A, "It is 20.", reasoning_content="Known now."),
        ],
        [WEATHER_TOOL],
        {},
        False,
        2,
    ),
}


def _last_run(mask: list[int]) -> list[int]:
    # The oracle mask with only its last contiguous run of ones kept (the last turn).
    out = [0] * len(mask)
    i = len(mask) - 1
    while i >= 0 and mask[i] == 0:
        i -= 1
    while i >= 0 and mask[i] == 1:
        out[i] = 1
        i -= 1
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_ids_and_masks_equal_apply_chat_template(demo_tokenizer: Path, name: str) -> None:
    convo, tools, kwargs, keep, expected_samples = CASES[name]
    ctx = TokenizeContext(str(demo_tokenizer), keep_reasoning_history=keep)
    hf = AutoTokenizer.from_pretrained(str(demo_tokenizer))
    table = completions_table([completion(name, convo, tools=tools, kwargs=kwargs)])
    samples, counters = tokenize_table(table, ctx)
    rows = samples.to_pylist()
    assert len(rows) == expected_samples, counters.to_dict()
    n_turns = sum(m["role"] == A for m in convo)
    for row in rows:
        k = n_turns - 1 if len(rows) == 1 else int(row["id"].rsplit("#", 1)[1])
        conversation = convo if len(rows) == 1 else context_upto(convo, k, keep)
        oracle = hf.apply_chat_template(
            [{key: v for key, v in m.items() if v is not None} for m in conversation],
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **kwargs,
        )
        assert row["input_ids"] == list(oracle["input_ids"])
        mask = list(oracle["assistant_masks"])
        assert row["loss_mask"] == (mask if len(rows) == 1 else _last_run(mask))
        assert row["num_tokens"] == len(row["input_ids"])
        assert row["num_loss_tokens"] == sum(row["loss_mask"])
    if expected_samples > 1:
        assert [r["id"] for r in rows] == [f"{name}#{k}" for k in range(n_turns)][-len(rows) :]
        assert counters.counts["split_turns"] == 1


def test_mask_ends_on_end_of_turn_and_skips_generation_prompt(demo_tokenizer: Path) -> None:
    ctx = TokenizeContext(str(demo_tokenizer))
    convo, _, kwargs, _, _ = CASES["thinking_off"]
    samples, _ = tokenize_table(completions_table([completion("t", convo, kwargs=kwargs)]), ctx)
    row = samples.to_pylist()[0]
    loss = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    # Thinking off: the empty think block is part of the generation prompt, not loss.
    assert ctx.decode(loss) == "Hi there.<|im_end|>"
    assert ctx.decode(row["input_ids"]).endswith("<|im_end|>\n")
