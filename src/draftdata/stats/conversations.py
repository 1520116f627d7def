"""Conversation rows: every chat-shaped dataset shape -> the one ``conversation.Conversation``.

Chat datasets come in several shapes: our prompts (``{id, messages, source, domain, tools}``),
SpecForge training input (``{id, conversations: [{role, content, reasoning_content?}]}``),
ShareGPT (``conversations: [{from, value}]`` with human/gpt/...), plain OpenAI ``messages`` rows,
and a run's completions (prompt messages plus the regenerated assistant turns).
``row_to_conversation`` turns any of the dict shapes into a ``Conversation``;
``completion_to_conversation`` does the same for a Completion. ``CONVERSATION_SCHEMA`` is the
parquet form merge writes (``conversation/1``).

This module converts single rows; it does not open files (``readers.py`` does).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pyarrow as pa

from draftdata.records import (
    MAX_JSON_DEPTH,
    ROLES,
    Completion,
    Message,
    content_hash,
    sample_key,
    too_deep,
)
from draftdata.shared.conversation import Conversation, assemble
from draftdata.shared.formats import FORMAT_KEY, MESSAGE_TYPE

CONVERSATION_FORMAT = "conversation/1"

CONVERSATION_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("domain", pa.string()),
        ("conversations", pa.list_(MESSAGE_TYPE)),
        ("tools", pa.string()),  # JSON list of OpenAI tool specs, or null
    ],
    metadata={FORMAT_KEY: CONVERSATION_FORMAT.encode()},
)

# ShareGPT speaker names -> OpenAI roles (the variants seen in public datasets).
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "ipython": "tool",
    "function_call": "assistant",
    "function": "tool",
}

_json = msgspec.json.Encoder()


def _text(value: Any) -> str | None:
    """Message content as text: strings as is, OpenAI content-part lists joined."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in value]
        return "".join(p for p in parts if isinstance(p, str))
    return str(value)


def _json_field(value: Any, where: str) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{where}: not valid JSON") from exc
    if too_deep(value):  # any depth in a user's string field is a bad row, not a crash
        raise ValueError(f"{where}: nesting deeper than {MAX_JSON_DEPTH} levels")
    return value


def _message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
    if "role" in raw:
        role = raw["role"]
        content = _text(raw.get("content"))
    elif "from" in raw:
        speaker = str(raw["from"]).lower()
        role = _SHAREGPT_ROLES.get(speaker, speaker)
        content = _text(raw.get("value"))
    else:
        raise ValueError(f"{where}: no 'role' (OpenAI) or 'from' (ShareGPT) key")
    if role not in ROLES:
        raise ValueError(f"{where}.role: {role!r} is not one of {'/'.join(ROLES)}")
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    tool_calls = _json_field(raw.get("tool_calls"), f"{where}.tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise ValueError(f"{where}.tool_calls: expected a list")
    return Message(
        role=role,
        content=content,
        reasoning_content=_text(reasoning),
        tool_calls=tool_calls or None,
        tool_call_id=raw.get("tool_call_id") or None,
        name=raw.get("name") or None,
    )


def row_to_conversation(row: Any) -> Conversation:
    """Turn one dict row (SpecForge, ShareGPT, OpenAI messages, our prompts) into a Conversation.

    Raises ValueError('field: what is wrong') for a row that is not a conversation; the caller
    adds the file and line. A row without an id gets the content hash of its messages.
    """
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    turns = row.get("conversations")
    key = "conversations"
    if turns is None:
        turns, key = row.get("messages"), "messages"
    if turns is None:
        raise ValueError("no 'conversations' or 'messages' list")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{key}: expected a non-empty list")
    messages = [_message(m, f"{key}[{i}]") for i, m in enumerate(turns)]
    tools = _json_field(row.get("tools"), "tools")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools: expected a list of tool specs")
    tools = tools or None
    rid = row.get("id")
    ident = str(rid) if rid not in (None, "") else content_hash(messages, tools)
    source = row.get("source")
    domain = row.get("domain")
    return Conversation(
        id=ident,
        messages=messages,
        source=source if isinstance(source, str) else "",
        domain=domain if isinstance(domain, str) else "",
        tools=tools,
    )


def completion_to_conversation(c: Completion) -> Conversation:
    """The conversation a Completion stands for: its prompt with the target's own turns
    (``conversation.assemble``, the rule generate and export use), under its sample id."""
    return Conversation(
        id=sample_key(c.id, c.sample),
        messages=assemble(c),
        source=c.source,
        domain=c.domain,
        tools=c.tools,
    )


def conversation_row(conv: Conversation, domain: str | None = None) -> dict[str, Any]:
    """The ``CONVERSATION_SCHEMA`` row of a conversation (``domain`` overrides its label)."""
    return {
        "id": conv.id,
        "source": conv.source,
        "domain": conv.domain if domain is None else domain,
        "conversations": [
            {
                "role": m.role,
                "content": m.content,
                "reasoning_content": m.reasoning_content,
                "tool_calls": None if m.tool_calls is None else _json.encode(m.tool_calls).decode(),
                "tool_call_id": m.tool_call_id,
                "name": m.name,
            }
            for m in conv.messages
        ],
        "tools": None if conv.tools is None else _json.encode(conv.tools).decode(),
    }


def specforge_line(row: dict[str, Any]) -> bytes:
    """One SpecForge-style JSONL line from a ``CONVERSATION_SCHEMA`` row (nulls left out)."""
    msgs = []
    for m in row["conversations"]:
        item: dict[str, Any] = {"role": m["role"], "content": m["content"] or ""}
        if m.get("reasoning_content"):
            item["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            item["tool_calls"] = json.loads(m["tool_calls"])
        if m.get("tool_call_id"):
            item["tool_call_id"] = m["tool_call_id"]
        if m.get("name"):
            item["name"] = m["name"]
        msgs.append(item)
    out: dict[str, Any] = {"id": row["id"], "conversations": msgs}
    if row.get("tools"):
        out["tools"] = json.loads(row["tools"])
    out["source"] = row.get("source") or ""
    out["domain"] = row.get("domain") or ""
    return _json.encode(out)
