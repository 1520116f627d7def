"""The simulator's answer planning and its SGLang/vLLM parser emulation (pure functions)."""

from __future__ import annotations

import random
import statistics

from draftdata.sim.answers import (
    digest,
    draw_length,
    looks_like_code,
    parse_completion,
    plan_answer,
    split_chunk,
)
from draftdata.sim.tokens import ApproxTokenizer, manual_completion

TEXT = (
    "<think>\nwhy not\n</think>\n\nThe answer.\n"
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
)


def _parse(text: str, flavor: str, **kw: bool) -> object:
    opts = dict(reasoning_parser=True, thinking=True, include_reasoning=True, tool_parser=False)
    opts.update(kw)
    return parse_completion(text, flavor=flavor, **opts)


def test_reasoning_split_keeps_newlines_like_both_engines() -> None:
    text = "<think>\nstep one\n</think>\n\nfinal"
    for flavor in ("sglang", "vllm"):
        p = _parse(text, flavor)
        assert p.reasoning == "\nstep one\n"  # type: ignore[attr-defined]
        assert p.content == "\n\nfinal"  # type: ignore[attr-defined]


def test_truncated_think_block_is_all_reasoning() -> None:
    text = "<think>\nstill thinking"
    s = _parse(text, "sglang")
    v = _parse(text, "vllm")
    assert s.reasoning == v.reasoning == "\nstill thinking"  # type: ignore[attr-defined]
    assert s.content == ""  # type: ignore[attr-defined]
    assert v.content is None  # type: ignore[attr-defined]


def test_tool_calls_sglang_strips_content_vllm_keeps_it() -> None:
    s = _parse(TEXT, "sglang", tool_parser=True)
    v = _parse(TEXT, "vllm", tool_parser=True)
    assert [c.name for c in s.tool_calls] == ["f"]  # type: ignore[attr-defined]
    assert s.tool_calls[0].arguments == '{"a": 1}'  # type: ignore[attr-defined]
    assert s.content == "The answer."  # type: ignore[attr-defined]
    assert v.content == "\n\nThe answer.\n"  # type: ignore[attr-defined]


def test_no_parser_leaves_raw_text_in_content() -> None:
    p = _parse(TEXT, "sglang", reasoning_parser=False)
    assert p.content == TEXT  # type: ignore[attr-defined]
    assert p.reasoning is None  # type: ignore[attr-defined]


def test_include_reasoning_false_drops_reasoning() -> None:
    p = _parse("<think>\nx\n</think>\n\ny", "vllm", include_reasoning=False)
    assert p.reasoning is None  # type: ignore[attr-defined]
    assert p.content == "\n\ny"  # type: ignore[attr-defined]


def test_split_chunk_reassembles_the_message() -> None:
    p = _parse(TEXT, "vllm", tool_parser=True)
    _, ends = ApproxTokenizer().encode(TEXT)
    reasoning, content, calls = "", "", []
    prev = 0
    for e in ends:
        r, c, done = split_chunk(p, TEXT, prev, e)  # type: ignore[arg-type]
        reasoning, content, calls = reasoning + r, content + c, calls + done
        prev = e
    assert reasoning == p.reasoning  # type: ignore[attr-defined]
    assert content == p.content  # type: ignore[attr-defined]
    assert calls == [0]


def test_lengths_are_long_tailed_with_the_configured_mean() -> None:
    rng = random.Random(1)
    xs = [draw_length(rng, 2700, 0.8, 8) for _ in range(20000)]
    assert abs(statistics.mean(xs) - 2700) < 100
    assert statistics.median(xs) < 2400  # median below mean: a right tail
    assert max(xs) > 4 * 2700


def test_plan_is_deterministic_and_respects_options() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": "integer"}, "q": {"type": "string"}},
                    "required": ["n", "q"],
                },
            },
        }
    ]

    def plan(seed: int, **kw: object) -> dict[str, object]:
        opts: dict[str, object] = dict(
            target_tokens=200, reasoning=True, reasoning_share=0.6, code=False, tools=None
        )
        opts.update(kw)
        opts.setdefault("tool_call", False)
        return plan_answer(random.Random(seed), **opts)  # type: ignore[arg-type]

    assert plan(3) == plan(3)
    assert plan(3) != plan(4)
    assert "reasoning_content" not in plan(3, reasoning=False)
    code = plan(3, code=True)
    assert "```python" in str(code["content"])
    called = plan(3, tools=tools, tool_call=True)
    fn = called["tool_calls"][0]["function"]  # type: ignore[index]
    assert fn["name"] == "lookup"
    assert isinstance(fn["arguments"]["n"], int)
    assert isinstance(fn["arguments"]["q"], str)


def test_manual_rendering_matches_qwen3_layout() -> None:
    answer = {
        "reasoning_content": "r",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert manual_completion(answer, True) == (
        '<think>\nr\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )


def test_code_detection_and_digest() -> None:
    assert looks_like_code("Write a Python function that sorts")
    assert not looks_like_code("What is the capital of France?")
    assert digest("a", 1) == digest("a", 1) != digest("a", 2)
