"""Every adapter on rows we wrote, messy ones included, and the prompt-cutting modes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import RowError
from draftdata.prepare.adapters import ADAPTERS, SHAREGPT_ROLES, adapt, to_prompt
from draftdata.prepare.config import PROMPT_MODES
from draftdata.prepare.validate import REASONS, check_prompt
from draftdata.records import Message


def _reason(schema: str, row: Any) -> str:
    with pytest.raises(RowError) as exc:
        adapt(schema, row)
    return exc.value.reason


def test_infinity_instruct_keeps_labels_in_meta() -> None:
    row = {
        "id": 7,
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}],
        "label": {"ability_en": ["chat"]},
        "langdetect": "en",
        "source": "Subjective",
    }
    conv = adapt("infinity_instruct", row)
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.id == "7"
    assert conv.meta == {
        "label": {"ability_en": ["chat"]},
        "langdetect": "en",
        "source": "Subjective",
    }


@pytest.mark.parametrize("speaker", sorted(SHAREGPT_ROLES))
def test_sharegpt_role_spellings(speaker: str) -> None:
    row = {"conversations": [{"from": speaker.upper(), "value": "text"}]}
    assert adapt("sharegpt", row).messages[0].role == SHAREGPT_ROLES[speaker]


def test_sharegpt_function_call_and_observation() -> None:
    row = {
        "conversations": [
            {"from": "human", "value": "weather?"},
            {"from": "function_call", "value": '{"name": "w", "arguments": {"city": "Oslo"}}'},
            {"from": "observation", "value": '{"t": 3}'},
        ]
    }
    msgs = adapt("sharegpt", row).messages
    assert msgs[1].role == "assistant"
    assert msgs[1].tool_calls is not None
    call = msgs[1].tool_calls[0]
    assert call["function"] == {"name": "w", "arguments": '{"city": "Oslo"}'}
    assert msgs[2].role == "tool" and msgs[2].tool_call_id == call["id"]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"conversations": [{"from": "narrator", "value": "x"}]}, "unknown_role"),
        ({"conversations": [{"from": "human", "value": 5}]}, "non_string_content"),
        ({"conversations": [{"from": "human"}]}, "non_string_content"),
        ({"conversations": "human: hi"}, "wrong_type"),
        ({"conversations": ["hi"]}, "wrong_type"),
        ({"conversations": []}, "empty_content"),
        ({"id": 1}, "missing_field"),
        ({"conversations": [{"from": "function_call", "value": "{oops"}]}, "bad_tool_spec"),
        (["not", "an", "object"], "wrong_type"),
    ],
)
def test_sharegpt_messy_rows(row: Any, reason: str) -> None:
    assert _reason("sharegpt", row) == reason


def test_agentinstruct_trajectory() -> None:
    row = {
        "id": "os_1",
        "conversations": [
            {"from": "human", "loss": False, "value": "task"},
            {"from": "gpt", "loss": True, "value": "Act: bash"},
            {"from": "human", "loss": False, "value": "output"},
            {"from": "gpt", "loss": True, "value": "Act: answer(1)"},
        ],
    }
    conv = adapt("agentinstruct", row)
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.id == "os_1"


@pytest.mark.parametrize(
    ("schema", "row", "meta"),
    [
        (
            "webinstruct",
            {"question": "Q", "answer": "A", "source": "socratic"},
            {"source": "socratic"},
        ),
        (
            "codefeedback",
            {"query": "Q", "answer": "A", "resource": "r", "lang": "py"},
            {"resource": "r", "lang": "py"},
        ),
        (
            "metamath",
            {"type": "GSM_SV", "query": "Q", "original_question": "O", "response": "A"},
            {"type": "GSM_SV", "original_question": "O"},
        ),
        ("question_answer", {"question": "Q", "answer": "A"}, {}),
        ("query_response", {"query": "Q", "response": "A"}, {}),
    ],
)
def test_pair_schemas(schema: str, row: dict[str, Any], meta: dict[str, Any]) -> None:
    conv = adapt(schema, row)
    assert conv.messages == [
        Message(role="user", content="Q"),
        Message(role="assistant", content="A"),
    ]
    assert conv.meta == meta
    assert conv.id == ""


@pytest.mark.parametrize(
    ("schema", "row", "reason"),
    [
        ("webinstruct", {"question": "", "answer": "A"}, "empty_content"),
        ("webinstruct", {"answer": "A"}, "missing_field"),
        ("codefeedback", {"query": ["x"], "answer": "A"}, "non_string_content"),
        ("metamath", {"query": 42, "response": "A"}, "non_string_content"),
        ("query_response", {"query": None}, "missing_field"),
        ("alpaca", {"instruction": "  "}, "empty_content"),
        ("alpaca", {"instruction": "do", "input": 3}, "non_string_content"),
    ],
)
def test_pair_schemas_messy(schema: str, row: dict[str, Any], reason: str) -> None:
    assert _reason(schema, row) == reason


def test_pair_without_answer_is_a_prompt() -> None:
    conv = adapt("query_response", {"query": "Q"})
    assert conv.messages == [Message(role="user", content="Q")]


def test_alpaca_joins_instruction_and_input() -> None:
    conv = adapt(
        "alpaca", {"instruction": "Sort", "input": "3 1 2", "output": "1 2 3", "system": "S"}
    )
    assert [m.role for m in conv.messages] == ["system", "user", "assistant"]
    assert conv.messages[1].content == "Sort\n\n3 1 2"
    assert adapt("alpaca", {"instruction": "Sort", "input": ""}).messages[0].content == "Sort"


def test_openai_messages_and_tools_column() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    row = {
        "id": "x",
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A", "reasoning_content": "R"},
        ],
        "tools": json.dumps(tools),
    }
    conv = adapt("openai", row)
    assert conv.messages[2].reasoning_content == "R"
    assert conv.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]


def test_openai_specforge_conversations_and_sharegpt_turns() -> None:
    conv = adapt("openai", {"conversations": [{"role": "user", "content": "U"}]})
    assert conv.messages == [Message(role="user", content="U")]
    conv = adapt("openai", {"conversations": [{"from": "human", "value": "U"}]})
    assert conv.messages == [Message(role="user", content="U")]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown_role"),
        ({"messages": [{"role": "user", "content": {"a": 1}}]}, "non_string_content"),
        ({"messages": [{"role": 3, "content": "x"}]}, "wrong_type"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": "[{'broken'"}, "bad_tool_spec"),
    ],
)
def test_openai_messy(row: dict[str, Any], reason: str) -> None:
    assert _reason("openai", row) == reason


def test_to_prompt_modes() -> None:
    msgs = [
        Message(role="system", content="S"),
        Message(role="user", content="U1"),
        Message(role="assistant", content="A1"),
        Message(role="user", content="U2"),
        Message(role="assistant", content="A2"),
    ]
    assert to_prompt(msgs, "last_assistant") == msgs[:4]
    assert to_prompt(msgs, "regenerate") == [msgs[0], msgs[1], msgs[3]]
    assert to_prompt(msgs[:2], "last_assistant") == msgs[:2]


def test_regenerate_keeps_the_calls_tool_results_answer() -> None:
    """The original answers go, the structure stays: a tool-calling turn is kept as its calls
    alone, so generate can check the target's own call against the one the result answers."""
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msgs = [
        Message(role="user", content="U"),
        Message(role="assistant", content="Let me look.", reasoning_content="r", tool_calls=call),
        Message(role="tool", content="T", tool_call_id="c1"),
        Message(role="assistant", content="A"),
    ]
    assert to_prompt(msgs, "regenerate") == [
        msgs[0],
        Message(role="assistant", tool_calls=call),
        msgs[2],
    ]


# Rows of any shape in every schema's vocabulary: the keys adapters read, turns in both the
# ShareGPT (from/value) and OpenAI (role/content) spellings, values of every JSON type.
_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_speakers = st.sampled_from([*SHAREGPT_ROLES, "function_call", "GPT ", "nobody"])
_texts = st.sampled_from(
    [
        "hello there",
        "",
        '{"name": "f", "arguments": {"a": 1}}',
        "<tools>[{'name': 'f'}]</tools> be brief",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        '<tool_response>{"name": "f", "content": 1}</tool_response>',
    ]
)
_good_turn = st.builds(
    lambda sk, vk, s, v: {sk: s, vk: v},
    st.sampled_from(["from", "role"]),
    st.sampled_from(["value", "content"]),
    _speakers,
    _texts,
)
_odd_turn = st.builds(lambda a, b: {"from": a, "value": b}, _json, _json)
_turn = _good_turn | _good_turn | _json | _odd_turn
_turns = st.lists(_turn, min_size=1, max_size=4)
_fields = ["id", "tools", "query", "question", "answer", "response", "instruction", "input",
           "output", "system", "label", "source"]  # fmt: skip
_object_row = st.fixed_dictionaries(
    {},
    optional={
        "conversations": _turns | _turns | _json,
        "messages": _turns | _turns | _json,
        **{key: _texts | _texts | _json for key in _fields},
    },
)
_row = _object_row | _object_row | _json


@pytest.mark.parametrize("schema", sorted(ADAPTERS))
@settings(max_examples=150, deadline=None)
@given(row=_row, mode=st.sampled_from(PROMPT_MODES))
def test_any_row_is_a_prompt_or_a_reject(schema: str, row: Any, mode: str) -> None:
    """No row shape makes an adapter raise anything but RowError (a crash would end the
    prepare run instead of rejecting one row)."""
    try:
        conv = adapt(schema, row)
        check_prompt(to_prompt(conv.messages, mode), 32_000)
    except RowError as err:
        assert err.reason in REASONS
        return
    json.dumps(conv.meta)  # what prepare writes into meta must be encodable


def test_hermes_role_content_spelling_keeps_the_original_turns() -> None:
    row = {"conversations": [{"role": "user", "content": "hi"}, {"role": "gpt", "content": "yo"}]}
    conv = adapt("hermes_fc", row)
    original = [{"from": "user", "value": "hi"}, {"from": "gpt", "value": "yo"}]
    assert conv.meta["original"] == original
