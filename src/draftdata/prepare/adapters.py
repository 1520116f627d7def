"""Source rows -> conversations: one small function per dataset schema, plus prompt trimming.

An adapter takes one decoded row (a dict) and returns a ``Conversation``: OpenAI-format
messages (the whole conversation, answers included), OpenAI tools or None, the source's own id if
it has one, and ``meta`` (source-specific fields kept for tracing). ``to_prompt`` then cuts the
conversation into what the target answers (``last_assistant`` or ``regenerate``). Adapters raise
``errors.RowError`` with a reason code; they never read files, classify or deduplicate.

Schemas (``SourceConfig.schema``): infinity_instruct, webinstruct, codefeedback, metamath,
hermes_fc, agentinstruct, and the generic sharegpt, openai, alpaca, question_answer,
query_response.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from draftdata.errors import RowError
from draftdata.prepare import hermes
from draftdata.prepare.validate import (
    BAD_TOOL_SPEC,
    EMPTY_CONTENT,
    MISSING_FIELD,
    NON_STRING_CONTENT,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    check_prompt,
    text_field,
)
from draftdata.records import Message
from draftdata.shared.conversation import Conversation

JsonDict = dict[str, Any]

# ShareGPT speakers (lower-cased) -> OpenAI roles. function_call is handled separately.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function": "tool",
    "ipython": "tool",
}


def _turns(row: JsonDict, key: str = "conversations") -> list[Any]:
    if key not in row or row[key] is None:
        raise RowError(MISSING_FIELD, f"{key}: missing")
    turns = row[key]
    if not isinstance(turns, list):
        raise RowError(WRONG_TYPE, f"{key}: expected a list, got {type(turns).__name__}")
    if not turns:
        raise RowError(EMPTY_CONTENT, f"{key}: empty conversation")
    return turns


def _speaker_text(turn: Any, i: int, key: str) -> tuple[str, str]:
    where = f"{key}[{i}]"
    if not isinstance(turn, dict):
        raise RowError(WRONG_TYPE, f"{where}: expected an object, got {type(turn).__name__}")
    speaker = turn.get("from", turn.get("role"))
    value = turn.get("value", turn.get("content"))
    if not isinstance(speaker, str):
        raise RowError(WRONG_TYPE, f"{where}.from: expected a string")
    if not isinstance(value, str):
        got = "missing" if value is None else type(value).__name__
        raise RowError(NON_STRING_CONTENT, f"{where}.value: expected a string, got {got}")
    return speaker.strip().lower(), value


def _row_id(row: JsonDict) -> str:
    """The row's own id ("" when it has none)."""
    value = row.get("id")
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()
    return ""


def _function_call(value: str, i: int) -> list[JsonDict]:
    try:
        call = hermes.parse_literal(value)
    except RowError as exc:
        raise RowError(BAD_TOOL_SPEC, f"conversations[{i}]: function_call: {exc.detail}") from exc
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise RowError(BAD_TOOL_SPEC, f"conversations[{i}]: function_call has no name")
    args = call.get("arguments", {})
    args_text = args if isinstance(args, str) else json.dumps(args, sort_keys=True)
    return [
        {
            "id": f"call_{i}_0",
            "type": "function",
            "function": {"name": call["name"], "arguments": args_text},
        }
    ]


def sharegpt(row: JsonDict, key: str = "conversations") -> Conversation:
    """Generic ShareGPT: ``conversations`` [{from, value}] with any common speaker spelling."""
    messages: list[Message] = []
    pending: list[str] = []  # ids of tool calls not yet answered
    for i, turn in enumerate(_turns(row, key)):
        speaker, value = _speaker_text(turn, i, key)
        if speaker == "function_call":
            calls = _function_call(value, i)
            pending.extend(c["id"] for c in calls)
            messages.append(Message(role="assistant", tool_calls=calls))
            continue
        role = SHAREGPT_ROLES.get(speaker)
        if role is None:
            raise RowError(UNKNOWN_ROLE, f"{key}[{i}].from: {speaker!r}")
        if role == "tool":
            messages.append(
                Message(
                    role="tool", content=value, tool_call_id=pending.pop(0) if pending else None
                )
            )
        else:
            messages.append(Message(role=role, content=value))
    return Conversation(messages=messages, id=_row_id(row))


def infinity_instruct(row: JsonDict) -> Conversation:
    """BAAI/Infinity-Instruct: ShareGPT turns plus ``label``, ``langdetect``, ``source``."""
    conv = sharegpt(row)
    meta = {k: row[k] for k in ("label", "langdetect", "source") if row.get(k) is not None}
    return msgspec.structs.replace(conv, meta=meta)


def agentinstruct(row: JsonDict) -> Conversation:
    """THUDM/AgentInstruct-style trajectories: ShareGPT turns with a per-turn ``loss`` flag."""
    return sharegpt(row)


def _pair(
    row: JsonDict, q: str, a: str, meta_keys: tuple[str, ...], system: str | None = None
) -> Conversation:
    question = text_field(row, q)
    messages = [Message(role="user", content=question)]
    answer = row.get(a)
    if isinstance(answer, str) and answer.strip():
        messages.append(Message(role="assistant", content=answer))
    if system is not None and isinstance(row.get(system), str) and row[system].strip():
        messages.insert(0, Message(role="system", content=row[system]))
    meta = {k: row[k] for k in meta_keys if row.get(k) is not None}
    return Conversation(messages=messages, id=_row_id(row), meta=meta)


def question_answer(row: JsonDict) -> Conversation:
    """Generic ``question`` / ``answer`` pairs."""
    return _pair(row, "question", "answer", ())


def query_response(row: JsonDict) -> Conversation:
    """Generic ``query`` / ``response`` pairs."""
    return _pair(row, "query", "response", ())


def webinstruct(row: JsonDict) -> Conversation:
    """TIGER-Lab/WebInstructSub: ``question``, ``answer``, ``source``."""
    return _pair(row, "question", "answer", ("source",))


def codefeedback(row: JsonDict) -> Conversation:
    """m-a-p/CodeFeedback-Filtered-Instruction: ``query``, ``answer``, ``resource``, ``lang``."""
    return _pair(row, "query", "answer", ("resource", "lang"))


def metamath(row: JsonDict) -> Conversation:
    """meta-math/MetaMathQA: ``query``, ``response``, ``type``, ``original_question``."""
    return _pair(row, "query", "response", ("type", "original_question"))


def alpaca(row: JsonDict) -> Conversation:
    """Alpaca: ``instruction`` (+ optional ``input``) -> user, ``output`` -> assistant."""
    instruction = text_field(row, "instruction")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise RowError(NON_STRING_CONTENT, f"input: expected a string, got {type(extra).__name__}")
    user = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    messages = [Message(role="user", content=user)]
    output = row.get("output")
    if isinstance(output, str) and output.strip():
        messages.append(Message(role="assistant", content=output))
    if isinstance(row.get("system"), str) and row["system"].strip():
        messages.insert(0, Message(role="system", content=row["system"]))
    return Conversation(messages=messages, id=_row_id(row))


def openai(row: JsonDict) -> Conversation:
    """OpenAI chat format: ``messages`` (or SpecForge ``conversations``) of {role, content, ...}."""
    key = "messages" if "messages" in row else "conversations"
    messages: list[Message] = []
    for i, m in enumerate(_turns(row, key)):
        if not isinstance(m, dict):
            raise RowError(WRONG_TYPE, f"{key}[{i}]: expected an object")
        if "role" not in m and "from" in m:
            speaker, value = _speaker_text(m, i, key)
            m = {"role": SHAREGPT_ROLES.get(speaker, speaker), "content": value}
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise RowError(NON_STRING_CONTENT, f"{key}[{i}].content: {type(content).__name__}")
        try:
            messages.append(msgspec.convert(m, Message))
        except msgspec.ValidationError as exc:
            raise RowError(WRONG_TYPE, f"{key}[{i}]: {exc}") from exc
        if messages[-1].role not in ("system", "user", "assistant", "tool"):
            raise RowError(UNKNOWN_ROLE, f"{key}[{i}].role: {messages[-1].role!r}")
    tools = row.get("tools")
    try:
        parsed = hermes.tools_from_column(tools)
    except RowError as exc:
        raise RowError(BAD_TOOL_SPEC, f"tools: {exc.detail}") from exc
    return Conversation(messages=messages, tools=parsed, id=_row_id(row))


def hermes_fc(row: JsonDict, keep_original: bool = True) -> Conversation:
    """NousResearch/hermes-function-calling-v1: ``<tools>`` literals -> OpenAI tools and calls.

    The system turn's ``<tools>`` block becomes ``tools`` (or the ``tools`` column, when there
    is no block) and is cut from the system text; ``<tool_call>`` blocks in gpt turns become
    ``tool_calls``; ``<tool_response>`` blocks in tool turns become tool messages answering the
    calls in order. ``meta.original`` keeps the source turns verbatim.
    """
    messages: list[Message] = []
    tools: list[JsonDict] | None = None
    pending: list[str] = []
    original: list[JsonDict] = []  # the source turns verbatim, in either spelling
    turns = _turns(row)
    tools = hermes.tools_from_column(row.get("tools"))
    for i, turn in enumerate(turns):
        speaker, value = _speaker_text(turn, i, "conversations")
        original.append({"from": turn.get("from", turn.get("role")), "value": value})
        role = SHAREGPT_ROLES.get(speaker)
        if role is None:
            raise RowError(UNKNOWN_ROLE, f"conversations[{i}].from: {speaker!r}")
        if role == "system":
            found, rest = hermes.parse_tools_block(value)
            tools = found or tools
            if rest.strip():
                messages.append(Message(role="system", content=rest))
        elif role == "assistant":
            text, calls = hermes.parse_tool_calls(value, i)
            pending.extend(c["id"] for c in calls)
            messages.append(Message(role="assistant", content=text, tool_calls=calls or None))
        elif role == "tool":
            for name, content in hermes.parse_tool_responses(value):
                call_id = pending.pop(0) if pending else None
                messages.append(
                    Message(role="tool", content=content, tool_call_id=call_id, name=name)
                )
        else:
            messages.append(Message(role=role, content=value))
    meta: JsonDict = {k: row[k] for k in ("category", "subcategory", "task") if row.get(k)}
    if keep_original:
        meta["original"] = original
    return Conversation(messages=messages, tools=tools, id=_row_id(row), meta=meta)


Adapter = Callable[[JsonDict], Conversation]

ADAPTERS: dict[str, Adapter] = {
    "infinity_instruct": infinity_instruct,
    "webinstruct": webinstruct,
    "codefeedback": codefeedback,
    "metamath": metamath,
    "hermes_fc": hermes_fc,
    "agentinstruct": agentinstruct,
    "sharegpt": sharegpt,
    "openai": openai,
    "alpaca": alpaca,
    "question_answer": question_answer,
    "query_response": query_response,
}


def adapt(schema: str, row: Any, keep_original: bool = True) -> Conversation:
    """Run the adapter for ``schema`` on one decoded row; a non-object row is ``wrong_type``."""
    if not isinstance(row, dict):
        raise RowError(WRONG_TYPE, f"row: expected an object, got {type(row).__name__}")
    if schema == "hermes_fc":
        return hermes_fc(row, keep_original)
    return ADAPTERS[schema](row)


def to_prompt(messages: list[Message], mode: str) -> list[Message]:
    """Cut a whole conversation into the prompt the target answers.

    ``last_assistant``: everything before the last assistant turn (the whole conversation when
    it has none). ``regenerate``: the system, user and tool turns, with every original assistant
    answer dropped but the structure kept: an assistant turn that called tools stays as its
    ``tool_calls`` alone (no text, no reasoning), so generate knows which call each tool result
    answers and stops a conversation where the target's own call differs
    (``draftdata.shared.conversation``). Generate answers each user turn and each tool result in
    turn.
    """
    if mode == "regenerate":
        return [
            Message(role="assistant", tool_calls=m.tool_calls) if m.role == "assistant" else m
            for m in messages
            if m.role != "assistant" or m.tool_calls
        ]
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return messages[:i]
    return messages


def fitting_schemas(rows: list[Any], mode: str, max_chars: int) -> list[str]:
    """The schemas under which the most of ``rows`` become a valid prompt (in ``ADAPTERS``
    order; empty when none reads any): the likely schema of a source whose rows the configured
    one rejects all of."""
    fits: dict[str, int] = {}
    for schema in ADAPTERS:
        for row in rows:
            try:
                check_prompt(to_prompt(adapt(schema, row, False).messages, mode), max_chars)
            except RowError:
                continue
            fits[schema] = fits.get(schema, 0) + 1
    best = max(fits.values(), default=0)
    return [s for s, n in fits.items() if n == best and best > 0]
