"""Hermes function-calling text -> OpenAI ``tools``, ``tool_calls`` and tool messages.

NousResearch/hermes-function-calling-v1 writes function signatures as Python literals (single
quotes, ``True``/``None``) inside ``<tools>...</tools>`` in the system prompt, calls inside
``<tool_call>...</tool_call>`` in gpt turns and results inside ``<tool_response>...
</tool_response>`` in tool turns. This module parses those blocks *safely*: JSON first, then
``ast.literal_eval`` (which only builds literals — strings, numbers, tuples, lists, dicts, sets,
booleans, None — and never evaluates code), with a size limit. A block it cannot read raises
``RowError(bad_tool_spec, what)``. It does not decide what a prompt
is; the adapters in ``adapters.py`` call it.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from draftdata.errors import RowError
from draftdata.prepare.validate import BAD_TOOL_SPEC

_OPEN, _CLOSE = "<tools>", "</tools>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_MAX_LITERAL = 200_000  # characters; literal_eval on huge or deeply nested input is a DoS


def _bad(detail: str) -> RowError:
    """A block that is neither JSON nor a Python literal, or holds no usable spec or call."""
    return RowError(BAD_TOOL_SPEC, detail)


def parse_literal(text: str) -> Any:
    """Parse ``text`` as JSON, else as a Python literal; raise RowError if neither."""
    text = text.strip()
    if not text:
        raise _bad("empty block")
    try:
        return json.loads(text)
    except ValueError:
        pass
    if len(text) > _MAX_LITERAL:
        raise _bad(f"block of {len(text)} characters is too long to parse")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise _bad(f"not JSON or a Python literal ({type(exc).__name__})") from exc


def _parse_many(text: str) -> list[Any]:
    # One literal (a list or a dict), or several dicts one after another on separate lines.
    try:
        value = parse_literal(text)
    except RowError:
        parts = [p for p in re.split(r"(?<=\})\s*\n\s*(?=\{)", text.strip()) if p.strip()]
        if len(parts) < 2:
            raise
        return [parse_literal(p) for p in parts]
    return value if isinstance(value, list) else [value]


def to_openai_tool(spec: Any) -> dict[str, Any]:
    """Normalise one tool spec (OpenAI-shaped, or a bare ``{name, parameters}``) to OpenAI."""
    if not isinstance(spec, dict):
        raise _bad(f"tool spec is a {type(spec).__name__}, expected a dict")
    if spec.get("type") == "function" and isinstance(spec.get("function"), dict):
        fn = spec["function"]
    elif "name" in spec:
        fn = spec
    else:
        raise _bad("tool spec has no function name")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _bad("tool spec has no function name")
    out: dict[str, Any] = {"name": fn["name"]}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise _bad(f"parameters of {fn['name']!r} is not a dict")
    out["parameters"] = params
    return {"type": "function", "function": out}


def parse_tools_block(system: str) -> tuple[list[dict[str, Any]] | None, str]:
    """Find ``<tools>...</tools>`` in a system prompt: (OpenAI tools or None, text without it).

    Returns ``(None, system)`` when there is no block; raises RowError when the block
    cannot be parsed or holds no valid spec.
    """
    # The Hermes preamble itself says "within <tools></tools> XML tags": skip empty blocks. A
    # spec's own text may contain "</tools>", so a block that does not parse is widened to the
    # next closing tag before giving up.
    tools: list[dict[str, Any]] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    while (start := system.find(_OPEN, pos)) != -1:
        ends = [m.start() for m in re.finditer(re.escape(_CLOSE), system[start:])]
        if not ends:
            raise _bad("<tools> block is not closed")
        body_start = start + len(_OPEN)
        first = system[body_start : start + ends[0]]
        if not first.strip():
            pos = start + ends[0] + len(_CLOSE)
            continue
        error: RowError | None = None
        for end in ends:
            try:
                found = [to_openai_tool(x) for x in _parse_many(system[body_start : start + end])]
            except RowError as exc:
                error = error or exc
                continue
            tools.extend(found)
            spans.append((start, start + end + len(_CLOSE)))
            pos = start + end + len(_CLOSE)
            break
        else:
            assert error is not None
            raise error
    if not spans:
        return None, system
    if not tools:
        raise _bad("<tools> block holds no spec")
    rest = system
    for a, b in reversed(spans):
        rest = rest[:a] + rest[b:]
    return tools, re.sub(r"\n{3,}", "\n\n", rest.strip())


def tools_from_column(value: Any) -> list[dict[str, Any]] | None:
    """The ``tools`` column some Hermes configs carry (a JSON/literal string or a list)."""
    if value is None or value == "" or value == []:
        return None
    specs = _parse_many(value) if isinstance(value, str) else value
    if not isinstance(specs, list):
        specs = [specs]
    return [to_openai_tool(s) for s in specs] or None


def parse_tool_calls(text: str, turn: int) -> tuple[str | None, list[dict[str, Any]]]:
    """Split an assistant turn into (text outside the calls or None, OpenAI tool_calls).

    Call ids are ``call_<turn>_<k>`` so they are stable and match the tool messages that follow.
    """
    calls: list[dict[str, Any]] = []
    for k, m in enumerate(_CALL.finditer(text)):
        call = parse_literal(m.group(1))
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise _bad("<tool_call> has no function name")
        args = call.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = parse_literal(args)
        calls.append(
            {
                "id": f"call_{turn}_{k}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(args, sort_keys=True)},
            }
        )
    rest = _CALL.sub("", text).strip() if calls else text.strip()
    return (rest or None), calls


def parse_tool_responses(text: str) -> list[tuple[str | None, str]]:
    """The results in a tool turn as (function name if known, content); the raw text if none.

    A response that parses as a literal is re-encoded as JSON (what OpenAI tool messages hold).
    """
    blocks = [m.group(1).strip() for m in _RESPONSE.finditer(text)] or [text.strip()]
    out: list[tuple[str | None, str]] = []
    for block in blocks:
        try:
            value = parse_literal(block)
        except RowError:
            out.append((None, block))
            continue
        name = value.get("name") if isinstance(value, dict) else None
        out.append((name if isinstance(name, str) else None, json.dumps(value, sort_keys=True)))
    return out
