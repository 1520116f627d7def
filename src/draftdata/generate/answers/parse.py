"""Chat-completion bodies to Turns (the conversation rule lives in
``draftdata.shared.conversation``).

``parse_chat_response`` normalises one non-streaming ``chat.completion`` body of SGLang, vLLM
(``reasoning_content`` before 0.11, ``reasoning`` from 0.11 on) or a plain OpenAI server into one
``Turn`` per choice:

- reasoning from the reasoning field, else split from ``<think>...</think>`` in the content the
  way the engines' qwen3 reasoning parser splits it (text between the markers, not stripped;
  content is what follows ``</think>``). A think block cut by max tokens is all reasoning; a
  content with ``</think>`` but no opening marker (templates that put ``<think>`` in the
  generation prompt) has its head as reasoning. Empty content is normalised to None.
- tool calls in the OpenAI shape ``{id, type: "function", function: {name, arguments}}`` with
  ``arguments`` a JSON string (servers that send an object get it encoded).
- usage per choice: prompt and cached tokens describe the prompt every choice saw (so they
  repeat across choices of one request); completion tokens are the choice's own output ids
  when the server returned them, else the request's total split in proportion to text length.
- token ids from SGLang (per choice ``prompt_token_ids`` and ``response_token_ids``, as 0.5.x
  returns them for ``return_token_ids``/``return_prompt_token_ids``; older builds per choice
  ``token_ids``, or ``meta_info`` with ``output_ids``/``output_token_ids``) and vLLM
  (top-level ``prompt_token_ids``, per choice ``token_ids``).

A body that does not have this shape raises ``errors.MalformedAnswerError``. The module is pure:
no I/O, no HTTP, no retry policy (``client.py`` adds the status and hides secrets; the engine
decides).
"""

from __future__ import annotations

from typing import Any

import msgspec

from draftdata.errors import MalformedAnswerError
from draftdata.records import JsonDict, Turn, Usage

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


# -- the wire shape (both flavours; unknown fields ignored) ------------------------------------


class _Function(msgspec.Struct, kw_only=True, gc=False):
    name: str
    arguments: str | dict[str, Any] | None = None


class _ToolCall(msgspec.Struct, kw_only=True, gc=False):
    id: str | None = None
    type: str | None = None
    function: _Function


class _Message(msgspec.Struct, kw_only=True, gc=False):
    content: str | list[Any] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct, kw_only=True, gc=False):
    index: int | None = None
    message: _Message
    finish_reason: str | dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None  # SGLang 0.5.x
    output_token_ids: list[int] | None = None
    output_ids: list[int] | None = None
    meta_info: dict[str, Any] | None = None


class _Details(msgspec.Struct, kw_only=True, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, kw_only=True, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Body(msgspec.Struct, kw_only=True, gc=False):
    choices: list[_Choice]
    usage: _Usage | None = None
    prompt_token_ids: list[int] | None = None
    meta_info: dict[str, Any] | None = None


_body_decoder = msgspec.json.Decoder(_Body)
_json_encode = msgspec.json.Encoder().encode


def decode_chat_response(data: bytes) -> list[Turn]:
    """``parse_chat_response`` straight from the raw JSON bytes (the client's fast path)."""
    try:
        body = _body_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise MalformedAnswerError(f"not a chat completion: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise MalformedAnswerError(f"not valid JSON: {exc}") from exc
    return _turns(body)


def parse_chat_response(body: dict[str, Any]) -> list[Turn]:
    """One Turn per choice of a decoded chat-completion body, in choice index order.

    Raises MalformedAnswerError when ``body`` is not a chat completion (no choices, a choice without
    a message, fields of the wrong type).
    """
    if not isinstance(body, dict):
        raise MalformedAnswerError("not a chat completion: the body is not a JSON object")
    try:
        parsed = msgspec.convert(body, _Body)
    except msgspec.ValidationError as exc:
        raise MalformedAnswerError(f"not a chat completion: {exc}") from exc
    return _turns(parsed)


# -- pieces ------------------------------------------------------------------------------------


def split_think(text: str) -> tuple[str | None, str]:
    """(reasoning, content) of text with inline think markers, as the qwen3 parser splits it.

    ``<think>r</think>c`` -> ("r", "c"); an unclosed ``<think>r`` -> ("r", ""); ``r</think>c``
    (the opening marker was in the prompt) -> ("r", "c"); no markers -> (None, text).
    """
    start = text.find(THINK_OPEN)
    end = text.find(THINK_CLOSE)
    if start >= 0 and (end < 0 or start < end) and not text[:start].strip():
        body = start + len(THINK_OPEN)
        end = text.find(THINK_CLOSE, body)
        if end < 0:
            return text[body:], ""
        return text[body:end], text[end + len(THINK_CLOSE) :]
    if end >= 0 and start < 0:
        return text[:end], text[end + len(THINK_CLOSE) :]
    return None, text


def _content_text(content: str | list[Any] | None) -> str | None:
    if content is None or isinstance(content, str):
        return content
    # OpenAI content parts: [{"type": "text", "text": ...}, ...]
    parts: list[str] = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part, str):
            parts.append(part)
        else:
            raise MalformedAnswerError(f"message.content: unreadable content part {part!r:.80}")
    return "".join(parts)


def _tool_calls(calls: list[_ToolCall] | None) -> list[JsonDict] | None:
    if not calls:
        return None
    out: list[JsonDict] = []
    for call in calls:
        args = call.function.arguments
        if args is None:
            args = "{}"
        elif not isinstance(args, str):
            args = _json_encode(args).decode()
        entry: JsonDict = {"type": call.type or "function"}
        if call.id is not None:
            entry = {"id": call.id, **entry}
        entry["function"] = {"name": call.function.name, "arguments": args}
        out.append(entry)
    return out


def _int_list(value: Any, where: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise MalformedAnswerError(f"{where}: expected a list of token ids")
    return value


def _meta_ids(meta: dict[str, Any] | None, where: str) -> tuple[list[int] | None, list[int] | None]:
    if not meta:
        return None, None
    prompt = _int_list(meta.get("prompt_token_ids"), f"{where}.prompt_token_ids")
    output = None
    for key in ("output_token_ids", "output_ids", "token_ids"):
        output = _int_list(meta.get(key), f"{where}.{key}")
        if output is not None:
            break
    return prompt, output


def _finish(value: str | dict[str, Any] | None) -> str | None:
    if isinstance(value, dict):  # SGLang's native {"type": "stop", "matched": ...}
        kind = value.get("type")
        return kind if isinstance(kind, str) else None
    return value


def _split_total(total: int, weights: list[int]) -> list[int]:
    """``total`` split into integers proportional to ``weights`` (summing exactly to total)."""
    if not weights:
        return []
    wsum = sum(weights)
    if wsum <= 0:
        weights = [1] * len(weights)
        wsum = len(weights)
    shares = [total * w // wsum for w in weights]
    rest = total - sum(shares)
    for i in range(rest):
        shares[i % len(shares)] += 1
    return shares


def _turns(body: _Body) -> list[Turn]:
    if not body.choices:
        raise MalformedAnswerError("not a chat completion: no choices")
    choices = sorted(
        enumerate(body.choices), key=lambda ic: ic[1].index if ic[1].index is not None else ic[0]
    )
    usage = body.usage or _Usage()
    prompt_tokens = usage.prompt_tokens or 0
    cached = (usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0) or 0
    top_prompt, top_output = _meta_ids(body.meta_info, "meta_info")
    top_prompt = _int_list(body.prompt_token_ids, "prompt_token_ids") or top_prompt

    fields: list[tuple[str | None, str | None, list[JsonDict] | None, str | None]] = []
    ids: list[tuple[list[int] | None, list[int] | None]] = []
    weights: list[int] = []
    for _, ch in choices:
        msg = ch.message
        content = _content_text(msg.content)
        reasoning = msg.reasoning_content if msg.reasoning_content is not None else msg.reasoning
        if reasoning is None and content is not None:
            reasoning, content = split_think(content)
        calls = _tool_calls(msg.tool_calls)
        fields.append((reasoning or None, content or None, calls, _finish(ch.finish_reason)))
        m_prompt, m_output = _meta_ids(ch.meta_info, "choices[].meta_info")
        prompt_ids = ch.prompt_token_ids or m_prompt or top_prompt
        output_ids = ch.token_ids
        for alt in (ch.response_token_ids, ch.output_token_ids, ch.output_ids, m_output):
            if output_ids is None:
                output_ids = alt
        if output_ids is None and len(choices) == 1:
            output_ids = top_output
        ids.append((prompt_ids, output_ids))
        args = sum(len(c["function"]["arguments"]) for c in calls or [])
        weights.append(len(reasoning or "") + len(content or "") + args)

    total = usage.completion_tokens or 0
    if len(choices) == 1:
        completion = [total]
    elif all(o is not None for _, o in ids):
        completion = [len(o or []) for _, o in ids]
    else:
        completion = _split_total(total, weights)
    turns = []
    for (reasoning, content, calls, finish), (p_ids, o_ids), c_tokens in zip(
        fields, ids, completion, strict=True
    ):
        turns.append(
            Turn(
                content=content,
                reasoning=reasoning,
                tool_calls=calls,
                finish_reason=finish,
                prompt_token_ids=p_ids,
                output_token_ids=o_ids,
                usage=Usage(
                    prompt_tokens=prompt_tokens, completion_tokens=c_tokens, cached_tokens=cached
                ),
            )
        )
    return turns
