"""parse_chat_response on hand-written SGLang / vLLM / OpenAI bodies."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import MalformedAnswerError
from draftdata.generate.answers.parse import (
    decode_chat_response,
    parse_chat_response,
    split_think,
)
from draftdata.records import Turn, Usage


def sglang_body(**choice_extra: Any) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "\n\nThe answer is 4.",
            "reasoning_content": "\n2 + 2 = 4.\n",
            "tool_calls": None,
        },
        "logprobs": None,
        "finish_reason": "stop",
        "matched_stop": 151645,
        **choice_extra,
    }
    return {
        "id": "abc",
        "object": "chat.completion",
        "created": 1,
        "model": "default",
        "choices": [choice],
        "usage": {
            "prompt_tokens": 12,
            "total_tokens": 20,
            "completion_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 4},
            "reasoning_tokens": 5,
        },
        "metadata": {"weight_version": "default"},
    }


def vllm_body(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 1,
        "model": "M",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "refusal": None, "annotations": None, **message},
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": 10,
            "total_tokens": 17,
            "completion_tokens": 7,
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
        **extra,
    }


def test_sglang_reasoning_content_and_usage() -> None:
    (turn,) = parse_chat_response(sglang_body())
    assert turn == Turn(
        content="\n\nThe answer is 4.",
        reasoning="\n2 + 2 = 4.\n",
        finish_reason="stop",
        usage=Usage(prompt_tokens=12, completion_tokens=8, cached_tokens=4),
    )


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_vllm_reasoning_field_old_and_new(field: str) -> None:
    (turn,) = parse_chat_response(vllm_body({"content": "\n\nHi.", field: "\nthink\n"}))
    assert (turn.reasoning, turn.content) == ("\nthink\n", "\n\nHi.")
    assert turn.usage == Usage(prompt_tokens=10, completion_tokens=7, cached_tokens=0)


def test_inline_think_is_split_like_the_parser() -> None:
    body = vllm_body({"content": "<think>\nlet me see\n</think>\n\nYes."})
    (turn,) = parse_chat_response(body)
    assert (turn.reasoning, turn.content) == ("\nlet me see\n", "\n\nYes.")


def test_unclosed_think_cut_by_max_tokens_is_all_reasoning() -> None:
    body = vllm_body({"content": "<think>\nstill thinking abo"})
    body["choices"][0]["finish_reason"] = "length"
    (turn,) = parse_chat_response(body)
    assert turn.reasoning == "\nstill thinking abo"
    assert turn.content is None
    assert turn.finish_reason == "length"


def test_sglang_cut_in_reasoning_gives_empty_content_as_none() -> None:
    body = sglang_body(finish_reason="length")
    body["choices"][0]["message"]["content"] = ""
    (turn,) = parse_chat_response(body)
    assert turn.content is None and turn.reasoning == "\n2 + 2 = 4.\n"


def test_close_marker_without_open_marker() -> None:
    # templates that put "<think>\n" into the generation prompt: the output starts in reasoning
    (turn,) = parse_chat_response(vllm_body({"content": "hmm\n</think>\n\nDone."}))
    assert (turn.reasoning, turn.content) == ("hmm\n", "\n\nDone.")


def test_plain_openai_answer_without_reasoning() -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    (turn,) = parse_chat_response(body)
    assert turn == Turn(
        content="Hello!", finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2)
    )


def test_reasoning_field_wins_over_inline_markers() -> None:
    # with a reasoning parser the content is final: markers there are the answer's own text
    body = vllm_body({"content": "Use <think> tags.", "reasoning": "r"})
    (turn,) = parse_chat_response(body)
    assert (turn.reasoning, turn.content) == ("r", "Use <think> tags.")


def test_tool_calls_sglang_and_vllm_shapes() -> None:
    sg = sglang_body(finish_reason="tool_calls")
    sg["choices"][0]["message"].update(
        content="",
        tool_calls=[
            {
                "id": "call_1",
                "index": 0,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    )
    (turn,) = parse_chat_response(sg)
    assert turn.tool_calls == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert turn.content is None and turn.finish_reason == "tool_calls"
    # arguments sent as an object are encoded to a JSON string
    v = vllm_body(
        {
            "content": "Let me check.",
            "tool_calls": [
                {"id": "t", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
            ],
        }
    )
    (turn,) = parse_chat_response(v)
    assert turn.content == "Let me check."
    assert turn.tool_calls == [
        {"id": "t", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    ]


def test_sglang_token_ids_on_choice() -> None:
    body = sglang_body(prompt_token_ids=[1, 2, 3], token_ids=[7, 8, 151645])
    (turn,) = parse_chat_response(body)
    assert turn.prompt_token_ids == [1, 2, 3]
    assert turn.output_token_ids == [7, 8, 151645]


def test_sglang_05_response_token_ids_per_choice() -> None:
    """SGLang 0.5.23 answers return_token_ids/return_prompt_token_ids with per-choice
    ``prompt_token_ids`` and ``response_token_ids`` (not ``token_ids``)."""
    body = sglang_body(prompt_token_ids=[1, 2, 3], response_token_ids=[7, 8, 151645])
    (turn,) = parse_chat_response(body)
    assert turn.prompt_token_ids == [1, 2, 3]
    assert turn.output_token_ids == [7, 8, 151645]
    raw = msgspec.json.encode(body)
    (fast,) = decode_chat_response(raw)
    assert fast.output_token_ids == [7, 8, 151645]
    two = sglang_body(prompt_token_ids=[1], response_token_ids=[5])
    second = {**two["choices"][0], "index": 1, "response_token_ids": [6, 9]}
    two["choices"].append(second)
    turns = parse_chat_response(two)
    assert [t.output_token_ids for t in turns] == [[5], [6, 9]]
    assert [t.usage.completion_tokens for t in turns] == [1, 2]  # each choice's own ids


def test_sglang_meta_info_token_ids() -> None:
    body = sglang_body(meta_info={"prompt_token_ids": [1], "output_ids": [5, 6]})
    (turn,) = parse_chat_response(body)
    assert (turn.prompt_token_ids, turn.output_token_ids) == ([1], [5, 6])
    body = sglang_body()
    body["meta_info"] = {"output_token_ids": [9]}
    (turn,) = parse_chat_response(body)
    assert turn.output_token_ids == [9]


def test_vllm_top_level_prompt_ids() -> None:
    body = vllm_body({"content": "x"}, prompt_token_ids=[4, 5])
    body["choices"][0]["token_ids"] = [6, 7]
    (turn,) = parse_chat_response(body)
    assert (turn.prompt_token_ids, turn.output_token_ids) == ([4, 5], [6, 7])


def test_n_choices_in_index_order_with_usage_split() -> None:
    body = sglang_body()
    first = body["choices"][0]
    long = "A" * 40
    second = {**first, "index": 1, "message": {**first["message"], "content": "B"}}
    body["choices"] = [second, {**first, "message": {**first["message"], "content": long}}]
    body["usage"]["completion_tokens"] = 30
    turns = parse_chat_response(body)
    assert [t.content for t in turns] == [long, "B"]
    assert sum(t.usage.completion_tokens for t in turns) == 30
    assert all(t.usage.prompt_tokens == 12 for t in turns)
    # longer text, larger share
    assert turns[0].usage.completion_tokens > turns[1].usage.completion_tokens


def test_n_choices_use_token_id_counts_when_present() -> None:
    body = sglang_body(token_ids=[1, 2, 3])
    first = body["choices"][0]
    body["choices"].append({**first, "index": 1, "token_ids": [1]})
    body["usage"]["completion_tokens"] = 4
    turns = parse_chat_response(body)
    assert [t.usage.completion_tokens for t in turns] == [3, 1]


def test_content_parts_are_joined() -> None:
    body = vllm_body({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    (turn,) = parse_chat_response(body)
    assert turn.content == "ab"


def test_sglang_native_finish_reason_object() -> None:
    body = sglang_body(finish_reason={"type": "length", "length": 8})
    assert parse_chat_response(body)[0].finish_reason == "length"


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"choices": []},
        {"choices": [{"index": 0}]},
        {"choices": [{"index": 0, "message": "hi"}]},
        {"choices": [{"message": {"content": 5}}]},
        {"choices": [{"message": {"content": "x", "tool_calls": [{"function": {}}]}}]},
        {"choices": [{"message": {"content": "x"}, "token_ids": ["a"]}]},
        {"choices": [{"message": {"content": "x"}, "meta_info": {"output_ids": "nope"}}]},
        {"object": "error", "message": "boom", "code": 500},
    ],
)
def test_malformed_bodies_raise(body: Any) -> None:
    with pytest.raises(MalformedAnswerError):
        parse_chat_response(body)


def test_decode_bytes_matches_dict_path_and_rejects_cut_json() -> None:
    body = sglang_body(token_ids=[1, 2])
    raw = msgspec.json.encode(body)
    assert decode_chat_response(raw) == parse_chat_response(body)
    with pytest.raises(MalformedAnswerError):
        decode_chat_response(raw[: len(raw) // 2])


_no_markers = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40)


@given(reasoning=_no_markers, content=_no_markers)
def test_split_think_round_trip(reasoning: str, content: str) -> None:
    assert split_think(f"<think>{reasoning}</think>{content}") == (reasoning, content)
    assert split_think(f"<think>{reasoning}") == (reasoning, "")
    assert split_think(content) == (None, content)


# -- property: bodies shaped by the simulator's own response builders --------------------------

_text = st.text(alphabet=st.characters(blacklist_characters="<>", codec="utf-8"), max_size=30)


@given(
    flavor=st.sampled_from(["sglang", "vllm"]),
    inline=st.booleans(),
    answers=st.lists(
        st.tuples(_text, _text, st.lists(st.tuples(_text, _text), max_size=2)),
        min_size=1,
        max_size=3,
    ),
    ids=st.booleans(),
)
def test_simulator_shaped_bodies_round_trip(
    flavor: str, inline: bool, answers: list[tuple[str, str, list[tuple[str, str]]]], ids: bool
) -> None:
    from draftdata.sim import shapes as sim_shapes
    from draftdata.sim.answers import Parsed

    choices = []
    for i, (reasoning, content, calls) in enumerate(answers):
        if inline:
            parsed = Parsed(
                reasoning=None,
                content=f"<think>{reasoning}</think>{content}",
                tool_calls=[],
                spans=[],
                tool_ends=[],
            )
        else:
            parsed = Parsed(
                reasoning=reasoning or None,
                content=content,
                tool_calls=[],
                spans=[],
                tool_ends=[],
            )
        wire_calls = [
            sim_shapes.tool_call(flavor, f"c{i}{k}", k, name or "f", args)
            for k, (name, args) in enumerate(calls)
        ]
        msg = sim_shapes.message(flavor, parsed, wire_calls)
        out_ids = list(range(i + 1)) if ids else None
        choices.append(
            sim_shapes.choice(flavor, i, msg, "stop", None, [9] if ids else None, out_ids)
        )
    usage = sim_shapes.usage(flavor, 5, sum(i + 1 for i in range(len(answers))), None, 0)
    body = sim_shapes.completion(flavor, "r", "m", choices, usage, [9] if ids else None)
    body = msgspec.json.decode(msgspec.json.encode(body))  # as it travels
    turns = parse_chat_response(body)
    assert len(turns) == len(answers)
    for i, (turn, (reasoning, content, calls)) in enumerate(zip(turns, answers, strict=True)):
        assert turn.reasoning == (reasoning or None)
        assert turn.content == (content or None)
        got_calls = [
            (c["function"]["name"], c["function"]["arguments"]) for c in turn.tool_calls or []
        ]
        assert got_calls == [(name or "f", args) for name, args in calls]
        assert turn.finish_reason == "stop"
        if ids:
            assert turn.prompt_token_ids == [9] and turn.output_token_ids == list(range(i + 1))
            assert turn.usage.completion_tokens == i + 1
        else:
            assert turn.output_token_ids is None
    assert sum(t.usage.completion_tokens for t in turns) == usage["completion_tokens"]
