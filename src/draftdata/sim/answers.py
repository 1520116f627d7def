"""What a simulated model says, and how a server's parsers split it into response fields.

``plan_answer`` draws one deterministic answer for (seed, prompt, sample index): an output length
from a lognormal with the configured mean (long-tailed, like real reasoning traces), reasoning
words, content words (with a fenced code block when the prompt looks like code) and, when tools
are offered, sometimes tool calls with arguments built from the tool's JSON schema.

``parse_completion`` mirrors the engines' Qwen3 reasoning parser and Hermes/Qwen tool parser on
the generated text: it returns the message fields plus character spans (reasoning, content,
tool call) so streaming can emit exactly the same split chunk by chunk:

- SGLang (``reasoning_content``): text between ``<think>`` and ``</think>`` is reasoning (not
  stripped); without ``</think>`` (cut by max_tokens) everything is reasoning and content is "".
  Content before a tool call is stripped; content is never null.
- vLLM (``reasoning``): same split; content that is empty is null; a truncated think block is
  all reasoning with content null.

It does no I/O and knows nothing of HTTP.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from typing import Any

import msgspec

_WORD_TEXT = (
    "the a of to and in is that for it as with on this be by are we can which from at an value "
    "first then next so if not or each step result number case check answer because function "
    "list order input output data state model time point set count total sum term given assume "
    "consider note means follows equal larger smaller both only also since compute define "
    "update return apply keep remove add split merge sort find test edge problem solution "
    "approach idea reason simple direct careful final clear small large left right start end "
    "middle part whole error bound range index key map tree node graph path cost rate ratio "
    "average mean score weight length width height area volume angle"
)
_WORDS = _WORD_TEXT.split()
_CODE_HINT = re.compile(
    r"\b(code|function|python|java|rust|golang|c\+\+|javascript|sql|script|program|class|"
    r"implement|bug|compile|def|regex|algorithm)\b|```",
    re.IGNORECASE,
)
_TOOL_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


class ToolCallOut(msgspec.Struct, frozen=True):
    """One parsed tool call: the OpenAI ``tool_calls[]`` entry minus id/index."""

    name: str
    arguments: str


class Parsed(msgspec.Struct, frozen=True):
    """Message fields of one choice and the spans they come from.

    ``spans`` is a list of ``(start, end, kind)`` over the generated text in order, kind in
    ``reasoning``, ``content``, ``tool`` (a whole tool-call block, index into tool_calls via
    ``tool_ends``) or ``skip`` (markers the parser removes).
    """

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCallOut]
    spans: list[tuple[int, int, str]]
    tool_ends: list[int]


def digest(*parts: Any) -> int:
    """A stable 64-bit seed from JSON-able parts (Python's hash() is salted per process)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big")


def draw_length(rng: random.Random, mean: int, sigma: float, minimum: int) -> int:
    """An output length from a lognormal whose mean is ``mean`` (median ~ mean * e^-s^2/2)."""
    mu = math.log(mean) - sigma * sigma / 2
    return max(minimum, round(rng.lognormvariate(mu, sigma)))


def _sentences(rng: random.Random, words: int) -> str:
    out: list[str] = []
    left = words
    para = 0
    while left > 0:
        n = min(left, rng.randint(6, 18))
        sent = rng.choices(_WORDS, k=n)
        sent[0] = sent[0].capitalize()
        out.append(" ".join(sent) + ".")
        left -= n
        para += 1
        if left > 0 and para % 5 == 0:
            out.append("\n\n")
    text = " ".join(out)
    return text.replace(" \n\n ", "\n\n")


def _code_block(rng: random.Random, lines: int) -> str:
    body = []
    for i in range(max(1, lines)):
        a, b = rng.choice(_WORDS), rng.choice(_WORDS)
        if i % 4 == 0:
            body.append(f"def {a}_{b}(x, y):")
        elif i % 4 == 3:
            body.append(f"    return {a}_{i} + y")
        else:
            body.append(f"    {a}_{i} = x * {rng.randint(2, 99)}")
    return "```python\n" + "\n".join(body) + "\n```"


def looks_like_code(prompt_text: str) -> bool:
    """Whether the last user turn asks for code (the answer then carries a code fence)."""
    return _CODE_HINT.search(prompt_text) is not None


def _arg_value(rng: random.Random, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if kind == "integer":
        return rng.randint(1, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_arg_value(rng, schema.get("items", {"type": "string"})) for _ in range(2)]
    if kind == "object":
        return _arguments(rng, schema)
    return " ".join(rng.choices(_WORDS, k=rng.randint(1, 3)))


def _arguments(rng: random.Random, params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        return {}
    props = params.get("properties")
    if not isinstance(props, dict):
        return {}
    required = set(params.get("required") or [])
    out: dict[str, Any] = {}
    for name, schema in props.items():
        if name in required or rng.random() < 0.5:
            out[str(name)] = _arg_value(rng, schema)
    return out


def plan_answer(
    rng: random.Random,
    *,
    target_tokens: int,
    reasoning: bool,
    reasoning_share: float,
    code: bool,
    tools: list[dict[str, Any]] | None,
    tool_call: bool,
) -> dict[str, Any]:
    """An assistant message (``reasoning_content``, ``content``, ``tool_calls``) of about
    ``target_tokens`` words, drawn from ``rng``."""
    answer: dict[str, Any] = {"role": "assistant"}
    budget = max(2, target_tokens - 6)
    if reasoning:
        r_words = max(1, int(budget * reasoning_share))
        answer["reasoning_content"] = _sentences(rng, r_words)
        budget = max(1, budget - r_words)
    if tool_call and tools:
        fns = [t.get("function", t) for t in tools if isinstance(t, dict)]
        fns = [f for f in fns if isinstance(f, dict) and f.get("name")]
        if fns:
            calls = []
            for _ in range(1 if rng.random() < 0.8 else 2):
                fn = rng.choice(fns)
                args = _arguments(rng, fn.get("parameters"))
                calls.append(
                    {"type": "function", "function": {"name": fn["name"], "arguments": args}}
                )
            answer["content"] = ""
            answer["tool_calls"] = calls
            return answer
    if code and budget > 12:
        lines = max(1, budget // 12)
        intro = _sentences(rng, max(1, budget // 4))
        outro = _sentences(rng, max(1, budget // 8))
        answer["content"] = f"{intro}\n\n{_code_block(rng, lines)}\n\n{outro}"
    else:
        answer["content"] = _sentences(rng, budget)
    return answer


def _tool_spans(
    text: str, start: int, flavor: str
) -> tuple[list[tuple[int, int, str]], list[ToolCallOut], list[int], str | None]:
    """Spans for text[start:] with tool parsing: content before the first valid call."""
    calls: list[ToolCallOut] = []
    ends: list[int] = []
    blocks: list[tuple[int, int]] = []
    for m in _TOOL_BLOCK.finditer(text, start):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(ToolCallOut(name=obj["name"], arguments=args_text))
        blocks.append((m.start(), m.end()))
        ends.append(m.end())
    if not calls:
        return [(start, len(text), "content")], [], [], text[start:]
    spans: list[tuple[int, int, str]] = []
    first = blocks[0][0]
    pre = text[start:first]
    if flavor == "sglang":
        # SGLang's detector strips the normal text before the first call.
        lead = len(pre) - len(pre.lstrip())
        stripped = pre.strip()
        spans.append((start, start + lead, "skip"))
        spans.append((start + lead, start + lead + len(stripped), "content"))
        spans.append((start + lead + len(stripped), first, "skip"))
        content: str | None = stripped
    else:
        spans.append((start, first, "content"))
        content = pre
    pos = first
    for b0, b1 in blocks:
        if b0 > pos:
            spans.append((pos, b0, "skip"))
        spans.append((b0, b1, "tool"))
        pos = b1
    if pos < len(text):
        spans.append((pos, len(text), "skip"))
    return spans, calls, ends, content


def parse_completion(
    text: str,
    *,
    flavor: str,
    reasoning_parser: bool,
    thinking: bool,
    include_reasoning: bool,
    tool_parser: bool,
) -> Parsed:
    """Split generated ``text`` as the flavour's reasoning and tool parsers would."""
    spans: list[tuple[int, int, str]] = []
    reasoning: str | None = None
    rest = 0
    if reasoning_parser and (thinking or "<think>" in text):
        body = 0
        if text.startswith("<think>"):
            spans.append((0, 7, "skip"))
            body = 7
        end = text.find("</think>", body)
        if end >= 0:
            reasoning = text[body:end]
            spans.append((body, end, "reasoning" if include_reasoning else "skip"))
            spans.append((end, end + 8, "skip"))
            rest = end + 8
        else:
            reasoning = text[body:]
            spans.append((body, len(text), "reasoning" if include_reasoning else "skip"))
            rest = len(text)
    calls: list[ToolCallOut] = []
    tool_ends: list[int] = []
    content: str | None
    if tool_parser and rest < len(text):
        more, calls, tool_ends, content = _tool_spans(text, rest, flavor)
        spans.extend(more)
    else:
        if rest < len(text):
            spans.append((rest, len(text), "content"))
        content = text[rest:]
    if not include_reasoning:
        reasoning = None
    if flavor == "sglang":
        reasoning = reasoning or None
        content = content or ""
    else:
        if content == "" and (reasoning_parser or calls):
            content = None
    return Parsed(
        reasoning=reasoning, content=content, tool_calls=calls, spans=spans, tool_ends=tool_ends
    )


def split_chunk(parsed: Parsed, text: str, a: int, b: int) -> tuple[str, str, list[int]]:
    """Reasoning text, content text and indexes of tool calls completed in text[a:b]."""
    reasoning: list[str] = []
    content: list[str] = []
    for s0, s1, kind in parsed.spans:
        lo, hi = max(a, s0), min(b, s1)
        if lo >= hi:
            continue
        if kind == "reasoning":
            reasoning.append(text[lo:hi])
        elif kind == "content":
            content.append(text[lo:hi])
    done = [i for i, e in enumerate(parsed.tool_ends) if a < e <= b]
    return "".join(reasoning), "".join(content), done
