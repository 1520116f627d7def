"""The JSON rows of each export format: what each drafter trainer reads, under its field names.

Whole-conversation formats (one row per completion, built from the assembled conversation):

- ``sharegpt``: ``{"id", "conversations": [{"role", "content", "reasoning_content"?,
  "tool_calls"?, "tool_call_id"?}], "tools"?}`` (SpecForge's conversation input).
- ``openai``: ``{"id", "messages": [...], "tools"?}`` (also TensorRT Model Optimizer's newer
  ``{"messages"}`` input).
- ``modelopt`` (what ``merge`` writes; ``export`` writes the per-turn ``modelopt_row``):
  ``{"conversation_id", "conversations": [{"role", "content", ...}], "tools"?}``.
- ``eagle``: ShareGPT ``{"id", "conversations": [{"from": "human"|"gpt", "value"}]}`` (the
  original EAGLE scripts, which map only ``human``/``gpt`` and assert strict alternation; a
  conversation they cannot read is left out, ``eagle_problem`` says why). A value is a
  string, so an assistant turn's reasoning is written the way Qwen3 writes it
  (``<think>\\n…\\n</think>\\n\\n`` before the answer) and its tool calls as
  ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>``.

Per-turn formats (one row per generated turn: the history as the target saw it, then that turn,
so a trainer that trains only a row's last assistant turn trains exactly what the target wrote
even where the chat template rewrites history):

- ``specforge``: the ``sharegpt`` row shape, one row per turn (``<id>#<turn>`` when the
  completion has several turns; ``tools`` and ``tool_calls`` as JSON strings, see
  ``specforge_row``); train with SpecForge's ``train_only_last_turn``.
- ``specforge-text``: ``{"id", "text"}``, the turn's context and output rendered with the
  target's chat template (SpecForge ``is_preformatted``).
- ``modelopt``: ``{"id", "conversation_id", "messages", "tools"?}`` (``modelopt_row``): the
  turn's context with the tools written into the system message, then the turn; read with the
  chat template ``export`` writes beside it (``export/modelopt.py``).
- ``speculators``: ``{"id": "<primary_id>_gen<k>", "primary_id", "input_ids", "loss_mask",
  "conversations", "text", "metadata": {"finish_reason", "usage", "endpoint",
  "sampling_params", ...}}``, speculators' regeneration rows, which its preprocessing passes
  through as they are.

Every row also carries ``id``, ``source`` and ``domain`` (trainers ignore fields they do not
read; ``stats`` and ``merge`` read them back instead of classifying the rows again). This module
builds rows; it reads and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from draftdata.records import JsonDict, Message

CONVERSATION_FORMATS = ("sharegpt", "openai", "modelopt", "eagle")
PER_TURN_FORMATS = ("specforge", "specforge-text", "speculators", "modelopt")
TOKENIZER_FORMATS = ("specforge-text", "speculators", "modelopt")  # export needs --tokenizer

_EAGLE_SPEAKERS = {"user": "human", "assistant": "gpt", "system": "system", "tool": "tool"}


def message_dict(m: Message, include_reasoning: bool = True) -> JsonDict:
    """One OpenAI-format message as a JSON object (unset fields left out, content "" when
    None, ``reasoning_content`` on assistant turns unless ``include_reasoning`` is off)."""
    d: JsonDict = {"role": m.role, "content": m.content or ""}
    if m.role == "assistant" and include_reasoning and m.reasoning_content is not None:
        d["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        d["tool_calls"] = m.tool_calls
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.name:
        d["name"] = m.name
    return d


def clean_message(m: JsonDict, include_reasoning: bool = True) -> JsonDict:
    """``message_dict`` of a message given as a dict (keys with None values left out)."""
    return message_dict(
        Message(
            role=m["role"],
            content=m.get("content"),
            reasoning_content=m.get("reasoning_content"),
            tool_calls=m.get("tool_calls"),
            tool_call_id=m.get("tool_call_id"),
            name=m.get("name"),
        ),
        include_reasoning,
    )


def _tool_call_text(call: JsonDict) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):  # else kept as the string the target wrote
            args = json.loads(args)
    body = json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def eagle_value(m: Message, include_reasoning: bool = True) -> str:
    """The ShareGPT ``value`` of a message: its content, and for an assistant turn its
    reasoning before it and its tool calls after it, in Qwen3's own notation."""
    text = m.content or ""
    if m.role != "assistant":
        return text
    if include_reasoning and m.reasoning_content is not None:
        text = f"<think>\n{m.reasoning_content.strip(chr(10))}\n</think>\n\n{text.lstrip(chr(10))}"
    for call in m.tool_calls or []:
        text = f"{text}\n{_tool_call_text(call)}" if text else _tool_call_text(call)
    return text


def eagle_problem(messages: list[Message], tools: list[JsonDict] | None) -> str | None:
    """Why EAGLE's data scripts cannot read ``messages`` as the target saw them (None: they
    can). They map only ``human``/``gpt`` (any other speaker is a KeyError), assert that the
    speakers alternate starting with the user, and put their own system prompt first, so a
    system message, a tools block (Qwen3 renders it as a system turn) and tool results have
    no place in a row."""
    if any(m.role == "system" for m in messages):
        return "system_message"
    if tools:
        return "tools"
    if any(m.role not in ("user", "assistant") for m in messages):
        return "tool_message"
    if any(m.role != ("user", "assistant")[k % 2] for k, m in enumerate(messages)):
        return "not_alternating"
    if not messages:
        return "empty"
    return None


def conversation_row(
    fmt: str,
    rid: str,
    messages: list[Message],
    *,
    source: str,
    domain: str,
    tools: list[JsonDict] | None,
    include_reasoning: bool = True,
) -> JsonDict:
    """The row of one whole conversation in ``fmt`` (one of ``CONVERSATION_FORMATS``)."""
    row: JsonDict
    if fmt == "eagle":
        turns = [
            {
                "from": _EAGLE_SPEAKERS.get(m.role, m.role),
                "value": eagle_value(m, include_reasoning),
            }
            for m in messages
        ]
        row = {"id": rid, "conversations": turns}
    else:
        msgs = [message_dict(m, include_reasoning) for m in messages]
        if fmt == "openai":
            row = {"id": rid, "messages": msgs}
        elif fmt == "modelopt":
            row = {"conversation_id": rid, "id": rid, "conversations": msgs}
        else:
            row = {"id": rid, "conversations": msgs}
    if tools:
        row["tools"] = tools
    row["source"] = source
    row["domain"] = domain
    return row


def modelopt_row(
    rid: str,
    messages: list[JsonDict],
    *,
    source: str,
    domain: str,
    tools: list[JsonDict] | None,
) -> JsonDict:
    """One ``modelopt`` row: ``messages`` as ModelOpt's reader wants them (its ``messages``
    key), the conversation id it names rows by, and the tools as a JSON string (information
    only: the tools block is already in the system message, ModelOpt passes no tools)."""
    row: JsonDict = {"id": rid, "conversation_id": rid, "messages": messages}
    if tools:
        row["tools"] = json.dumps(tools, ensure_ascii=False)
    row["source"] = source
    row["domain"] = domain
    return row


def per_turn_id(base: str, turn: int, n_turns: int) -> str:
    """The id of turn ``turn``'s row: the completion's id when it has one turn, else
    ``<id>#<turn>`` (the rule of tokenize's per-turn samples)."""
    return base if n_turns == 1 else f"{base}#{turn}"


def specforge_row(
    rid: str,
    context: list[JsonDict],
    turn: JsonDict,
    *,
    source: str,
    domain: str,
    tools: list[JsonDict] | None,
    include_reasoning: bool = True,
) -> JsonDict:
    """One ``specforge`` row: the context the target saw (as sent), then its turn.

    ``tools`` and each message's ``tool_calls`` are JSON strings, as SpecForge's own JSONL
    reader writes them (``safe_conversations_generator``; its preprocessing parses them back):
    a loader that gives the column one Arrow type unifies nested objects across rows (a key one
    tool schema lacks becomes ``null`` in its rendering; arguments that are an object in one row
    and a string in another do not load). ``datasets`` 5 reads such columns as Json; 4.x, which
    speculators still accepts, does not."""
    msgs = [clean_message(m, include_reasoning) for m in [*context, turn]]
    for m in msgs:
        if "tool_calls" in m:
            m["tool_calls"] = json.dumps(m["tool_calls"], ensure_ascii=False)
    row: JsonDict = {"id": rid, "conversations": msgs}
    if tools:
        row["tools"] = json.dumps(tools, ensure_ascii=False)
    row["source"] = source
    row["domain"] = domain
    return row


def text_row(rid: str, text: str, *, source: str, domain: str) -> JsonDict:
    """One ``specforge-text`` row (SpecForge's pre-formatted input)."""
    return {"id": rid, "text": text, "source": source, "domain": domain}


def speculators_row(
    primary_id: str,
    turn: int,
    *,
    input_ids: list[int],
    loss_mask: list[int],
    conversations: list[JsonDict],
    text: str,
    metadata: dict[str, Any],
    source: str,
    domain: str,
) -> JsonDict:
    """One ``speculators`` row: id ``<primary_id>_gen<turn>`` as its regenerator names them."""
    return {
        "id": f"{primary_id}_gen{turn}",
        "primary_id": primary_id,
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "conversations": conversations,
        "text": text,
        "metadata": metadata,
        "source": source,
        "domain": domain,
    }
