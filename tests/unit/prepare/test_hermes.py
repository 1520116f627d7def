"""Hermes function-calling: Python-literal tool specs, calls and responses, parsed safely."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import RowError
from draftdata.prepare import hermes
from draftdata.prepare.adapters import adapt, to_prompt


def tools_block(tools: list[dict[str, Any]]) -> str:
    """Hermes-style ``<tools>`` text with Python-literal specs, as such datasets hold it."""
    return "<tools>\n" + repr(list(tools)) + "\n</tools>"


SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags.\n{block}\nFor each function call return a json object."
)


def _tool(name: str, desc: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": sorted(props)},
        },
    }


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
_texts = st.text(min_size=0, max_size=40)
_props = st.dictionaries(
    _names,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "boolean"]), "description": _texts}
    ),
    max_size=4,
)


@given(st.lists(st.tuples(_names, _texts, _props), min_size=1, max_size=4))
def test_tools_block_round_trip(specs: list[tuple[str, str, dict[str, Any]]]) -> None:
    tools = [_tool(n, d, p) for n, d, p in specs]
    parsed, rest = hermes.parse_tools_block(SYSTEM.format(block=tools_block(tools)))
    assert parsed == tools
    assert "<tools>\n" not in rest and rest.startswith("You are a function calling AI model")


def test_bare_specs_one_per_line_and_literals() -> None:
    block = (
        "<tools>\n{'name': 'a', 'parameters': {'type': 'object', 'properties': {}}, "
        "'strict': True}\n{'name': 'b', 'description': None}\n</tools>"
    )
    tools, _ = hermes.parse_tools_block(block)
    assert tools is not None
    assert [t["function"]["name"] for t in tools] == ["a", "b"]
    assert tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    "block",
    [
        "<tools>\n[{'type': 'function', 'function': {'name': 'oops', 'parameters': {\n</tools>",
        "<tools>__import__('os').system('echo pwned')</tools>",
        "<tools>[1, 2]</tools>",
        "<tools>[{'description': 'no name'}]</tools>",
        "<tools>[{'name': 'f', 'parameters': 'not a dict'}]</tools>",
    ],
)
def test_bad_specs_raise_and_never_evaluate(block: str, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RowError, match=r"^bad_tool_spec: "):
        hermes.parse_tools_block(block)
    assert "pwned" not in capfd.readouterr().out


def test_no_block_and_empty_mention_leave_text() -> None:
    assert hermes.parse_tools_block("plain") == (None, "plain")
    assert hermes.parse_tools_block("within <tools></tools> tags") == (
        None,
        "within <tools></tools> tags",
    )


def test_tool_calls_and_responses() -> None:
    text, calls = hermes.parse_tool_calls(
        "Let me check.\n<tool_call>\n{'arguments': {'city': 'Oslo', 'days': 2}, 'name': 'w'}"
        "\n</tool_call>"
        '<tool_call>{"name": "x", "arguments": "{\\"a\\": 1}"}</tool_call>',
        turn=2,
    )
    assert text == "Let me check."
    assert calls[0] == {
        "id": "call_2_0",
        "type": "function",
        "function": {
            "name": "w",
            "arguments": json.dumps({"city": "Oslo", "days": 2}, sort_keys=True),
        },
    }
    assert calls[1]["function"]["arguments"] == '{"a": 1}'
    assert hermes.parse_tool_calls("no calls", 0) == ("no calls", [])
    out = hermes.parse_tool_responses(
        "<tool_response>\n{'name': 'w', 'content': {'t': 3}}\n</tool_response>"
        "<tool_response>free text</tool_response>"
    )
    assert out == [("w", '{"content": {"t": 3}, "name": "w"}'), (None, "free text")]


def _row() -> dict[str, Any]:
    tools = [_tool("get_weather", "Weather", {"city": {"type": "string"}})]
    return {
        "id": "h1",
        "category": "Utility",
        "conversations": [
            {"from": "system", "value": SYSTEM.format(block=tools_block(tools))},
            {"from": "human", "value": "Weather in Oslo?"},
            {
                "from": "gpt",
                "value": "<tool_call>\n{'arguments': {'city': 'Oslo'}, 'name': 'get_weather'}"
                "\n</tool_call>",
            },
            {
                "from": "tool",
                "value": "<tool_response>\n{'name': 'get_weather', 'content': {'t': 3}}"
                "\n</tool_response>",
            },
            {"from": "gpt", "value": "It is 3 degrees."},
        ],
    }


def test_hermes_row_to_openai() -> None:
    conv = adapt("hermes_fc", _row())
    assert conv.tools is not None and conv.tools[0]["function"]["name"] == "get_weather"
    roles = [m.role for m in conv.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = conv.messages[2].tool_calls
    assert call is not None and call[0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert conv.messages[3].tool_call_id == call[0]["id"]
    assert conv.messages[3].name == "get_weather"
    assert "<tools>\n" not in (conv.messages[0].content or "")
    assert conv.meta["original"][2]["value"].startswith("<tool_call>")
    assert conv.meta["category"] == "Utility"
    prompt = to_prompt(conv.messages, "last_assistant")
    assert prompt[-1].role == "tool"


def test_hermes_bad_spec_is_a_reject() -> None:
    row = _row()
    row["conversations"][0]["value"] = "<tools>[{'name': 'f', </tools>"
    with pytest.raises(RowError) as exc:
        adapt("hermes_fc", row)
    assert exc.value.reason == "bad_tool_spec"


def test_hermes_tools_column_and_no_original() -> None:
    row = {
        "conversations": [{"from": "human", "value": "hi"}],
        "tools": [{"name": "f", "parameters": {"type": "object"}}],
    }
    conv = adapt("hermes_fc", row, keep_original=False)
    assert conv.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert "original" not in conv.meta


def test_literal_size_limit() -> None:
    with pytest.raises(RowError, match=r"^bad_tool_spec: "):
        hermes.parse_literal("[" + "1," * 150_000 + "]'")
