"""The final prompt check and its reason codes."""

from __future__ import annotations

import pytest

from draftdata.errors import RowError
from draftdata.prepare.validate import REASONS, check_prompt, text_field
from draftdata.records import Message

U = Message(role="user", content="hi")


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([], "no_user_turn"),
        ([Message(role="system", content="S")], "no_user_turn"),
        ([Message(role="wizard", content="x")], "unknown_role"),
        ([Message(role="user", content="  ")], "empty_content"),
        ([U, Message(role="assistant", content="")], "empty_content"),
        ([U, Message(role="tool")], "empty_content"),
        ([U, Message(role="assistant", content="ok")], "no_user_turn"),
        ([Message(role="user", content="bad \ud800 text")], "undecodable_text"),
        ([Message(role="user", content="bad \ufffd text")], "undecodable_text"),
        ([Message(role="user", content="x" * 101)], "too_long"),
    ],
)
def test_rejects(messages: list[Message], reason: str) -> None:
    with pytest.raises(RowError) as exc:
        check_prompt(messages, max_chars=100)
    assert exc.value.reason == reason
    assert reason in REASONS


def test_good_prompts_pass() -> None:
    check_prompt([U], 100)
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    check_prompt(
        [U, Message(role="assistant", tool_calls=calls), Message(role="tool", content="")], 100
    )
    check_prompt([Message(role="user", content="héllo wörld ✓")], 100)


def test_text_field() -> None:
    assert text_field({"q": "x"}, "q") == "x"
    for row, reason in (
        ({}, "missing_field"),
        ({"q": 1}, "non_string_content"),
        ({"q": ""}, "empty_content"),
    ):
        with pytest.raises(RowError) as exc:
            text_field(row, "q")
        assert exc.value.reason == reason
