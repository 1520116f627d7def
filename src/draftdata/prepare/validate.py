"""Row-level validation for prepare: reason codes and the final prompt check.

Every row that cannot become a good prompt raises ``errors.RowError(reason, detail)``; the
stage writes it to ``rejects.jsonl`` as ``{"source", "row", "reason", "detail"}`` and counts it
under ``rejected.<reason>``. Reasons are a closed set (``REASONS``) so reports and tests can rely on
them. This module does not read files or decide duplicates.
"""

from __future__ import annotations

from typing import Any

from draftdata.errors import RowError
from draftdata.records import DERIVED_ID, ROLES, Message, tool_order_fault
from draftdata.shared.readers.base import BAD_JSON, TOO_LONG, UNDECODABLE_TEXT

WRONG_TYPE = "wrong_type"
MISSING_FIELD = "missing_field"
EMPTY_CONTENT = "empty_content"
NON_STRING_CONTENT = "non_string_content"
UNKNOWN_ROLE = "unknown_role"
NO_USER_TURN = "no_user_turn"
BAD_TOOL_SPEC = "bad_tool_spec"
DUPLICATE_ID = "duplicate_id"
ORPHAN_TOOL = "orphan_tool"

REASONS = (
    BAD_JSON,
    WRONG_TYPE,
    MISSING_FIELD,
    EMPTY_CONTENT,
    NON_STRING_CONTENT,
    UNKNOWN_ROLE,
    NO_USER_TURN,
    TOO_LONG,
    BAD_TOOL_SPEC,
    UNDECODABLE_TEXT,
    DUPLICATE_ID,
    ORPHAN_TOOL,
    DERIVED_ID,
)


def text_field(row: dict[str, Any], key: str) -> str:
    """``row[key]`` as a non-empty string, or a RowError naming the key."""
    if key not in row or row[key] is None:
        raise RowError(MISSING_FIELD, f"{key}: missing")
    value = row[key]
    if not isinstance(value, str):
        raise RowError(NON_STRING_CONTENT, f"{key}: expected a string, got {type(value).__name__}")
    if not value.strip():
        raise RowError(EMPTY_CONTENT, f"{key}: empty")
    return value


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from "\ud800"-style escapes
        return False
    return "\ufffd" not in text


def check_prompt(messages: list[Message], max_chars: int) -> None:
    """Raise RowError if ``messages`` is not a usable prompt.

    A prompt has known roles, string contents, non-empty user/system text, assistant turns with
    content or tool calls, at least one user turn, ends with a user or tool turn, answers only
    preceding assistant tool calls with tool messages (``records.tool_order_fault``), holds only
    encodable text (no U+FFFD replacement characters or lone surrogates), and has at most
    ``max_chars`` characters of content in total.
    """
    if not messages:
        raise RowError(NO_USER_TURN, "messages: nothing before the answer")
    total = 0
    has_user = False
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise RowError(UNKNOWN_ROLE, f"{where}.role: {m.role!r}")
        content = m.content
        if content is not None and not isinstance(content, str):
            raise RowError(NON_STRING_CONTENT, f"{where}.content: {type(content).__name__}")
        text = content or ""
        if m.role in ("user", "system") and not text.strip():
            raise RowError(EMPTY_CONTENT, f"{where}: empty {m.role} message")
        if m.role == "assistant" and not text.strip() and not m.tool_calls:
            raise RowError(EMPTY_CONTENT, f"{where}: assistant message with no content")
        if m.role == "tool" and content is None:
            raise RowError(EMPTY_CONTENT, f"{where}: tool message without content")
        if not _encodable(text):
            raise RowError(UNDECODABLE_TEXT, f"{where}.content: undecodable characters")
        has_user = has_user or m.role == "user"
        total += len(text)
    if not has_user:
        raise RowError(NO_USER_TURN, "messages: no user turn")
    if messages[-1].role not in ("user", "tool"):
        raise RowError(NO_USER_TURN, f"messages: ends with a {messages[-1].role} turn")
    if (fault := tool_order_fault(messages)) is not None:
        raise RowError(ORPHAN_TOOL, fault)
    if total > max_chars:
        raise RowError(TOO_LONG, f"messages: {total} characters > max_chars {max_chars}")
