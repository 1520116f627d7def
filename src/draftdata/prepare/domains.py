"""A fast, explainable domain classifier for chat prompts: code, math, tool, agent, general.

``classify_domain(messages, tools)`` is used by ``prepare`` (sources with ``domain: auto``) and by
``stats``/``merge`` to measure the domain mix of an existing dataset, so both sides of a mix plan
count the same way. It is a handful of compiled regular expressions scored with fixed weights,
not a model: ~50K conversations/s per core, deterministic, and easy to reason about when it is
wrong. It does not look at assistant answers beyond the first few thousand characters.

Decision order (the first rule that fires wins):

1. **agent** — an agentic trajectory: ReAct-style step markers (``Thought:``, ``Action:``,
   ``Observation:``, ``Act:``, ``Think:``, ``Final Answer:``) or environment instructions
   ("take exactly one of the actions", "interact with a household", "the output of the OS"),
   scoring >= 3 (markers 1 point, phrases 2) with at least two user turns (a trajectory has
   several steps).
2. **tool** — tool specs are given (``tools`` non-empty), a message carries ``tool_calls`` or has
   role ``tool``, or the text holds ``<tools>`` / ``<tool_call>`` / ``<tool_response>`` tags or a
   JSON function-signature shape.
3. **code** — fenced code blocks (3 points each), source-code lines such as ``def f(``,
   ``#include``, ``public static void``, ``SELECT ... FROM`` (1 point each, at most 6),
   language names ("python", "c++", "sql", ... 2 points each, at most 4) and programming words
   ("function", "compile", "regex", "algorithm", ... 1 point each, at most 4), and a request to
   write code ("write a ... function/script/query": 2). Code wins with >= 3 points unless math
   scores strictly higher.
4. **math** — LaTeX (``\\frac``, ``\\sqrt``, ``$x$``, ``^{2}``: 2 points each, at most 8),
   equations (``3x + 2 = 11``: 2 points), strong math words ("solve", "probability", "prime",
   "theorem", ... 2 points each, at most 6), weaker ones ("how many", "total", "triangle",
   "per hour", ``$5``, ... 1 point each, at most 4), numbers (0.5 each, at most 2) and a
   word-problem bonus (a quantity question with a number in it: 1). Math wins with >= 3 points.
5. **general** — everything else.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from draftdata.records import Message

DOMAINS = ("code", "math", "tool", "agent", "general")

# Per message and in total, only this much text is scanned: the signal is at the start, and it
# keeps the cost flat on 30K-character conversations.
_MAX_PER_MESSAGE = 3000
_MAX_TOTAL = 9000

_AGENT_MARKER = re.compile(
    r"^\s*(?:thought|action(?: input)?|observation|act|think|final answer)\s*:",
    re.IGNORECASE | re.MULTILINE,
)
_AGENT_PHRASE = re.compile(
    r"take exact(?:ly)? one of|available actions|interact with a household|"
    r"the output of the os|you are an? (?:autonomous |intelligent |helpful )?agent|"
    r"web ?shop|your task is to interact|valid actions|admissible actions|"
    r"i will (?:act|play) (?:as|the role of)|i'will play the role|environment feedback",
    re.IGNORECASE,
)
_TOOL_TAG = re.compile(r"<tools>|<tool_call>|<tool_response>|<functioncall>", re.IGNORECASE)
_TOOL_SHAPE = re.compile(r"[\"']type[\"']\s*:\s*[\"']function[\"']|[\"']parameters[\"']\s*:\s*\{")

_FENCE = re.compile(r"```")
_CODE_LINE = re.compile(
    r"^\s*(?:def \w+\s*\(|class \w+[\s(:]|import \w+|from [\w.]+ import|#include\s*<|"
    r"public (?:static )?(?:void|int|class|String)|private \w+ \w+|function \w*\s*\(|"
    r"const \w+ = |let \w+ = |var \w+ = |console\.log\(|System\.out\.print|printf\(|"
    r"return [^.]*;|for \(.*;.*;|while \(|if \(.*\) ?\{|\}\s*else\s*\{|"
    r"SELECT .+ FROM|INSERT INTO|CREATE TABLE|<\?php|<div|<html|\$ \w+|fn \w+\(|func \w+\()",
    re.IGNORECASE | re.MULTILINE,
)
_CODE_LANG = re.compile(
    r"(?<![\w])(?:python|javascript|typescript|java|c\+\+|c#|golang|rust|kotlin|swift|ruby|php|"
    r"sql|html|css|bash|powershell|perl|scala|haskell|matlab|verilog|node\.js|jquery)(?![\w])",
    re.IGNORECASE,
)
_CODE_WORD = re.compile(
    r"\b(?:shell script|regex|regular expression|function|method|class|api|compile[rd]?|"
    r"docstring|type hints?|variables?|refactor|unit tests?|debug|bug|algorithm|code|coding|"
    r"program(?:ming)?|script|snippet|array|string|integer "
    r"overflow|recursion|recursive|runtime|syntax|exception|stack trace|library|framework|"
    r"json|dataframe|pandas|numpy|react|django|flask|git|docker|kubernetes|implement(?:ation)?)\b",
    re.IGNORECASE,
)
_CODE_REQUEST = re.compile(
    r"\b(?:write|implement|create|code|develop|build)\b[^.\n]{0,40}?"
    r"\b(?:function|program|script|class|method|query|code|module|endpoint)\b",
    re.IGNORECASE,
)
_LATEX = re.compile(
    r"\\(?:frac|sqrt|int|sum|prod|lim|cdot|times|div|pi|theta|alpha|beta|infty|le|ge|neq|"
    r"binom|log|sin|cos|tan|mathbb|mathrm|left|right|begin\{(?:align|equation|pmatrix))|"
    r"\$[^$\n]{1,80}\$|\^\{[^}]*\}|_\{[^}]*\}|\b[a-z]\^\d",
)
_EQUATION = re.compile(
    r"\d*\s*[a-z]\s*[\^²]?\d*\s*[-+*/]\s*\d+\s*=\s*-?\d+|\b\d+\s*[-+*/×÷]\s*\d+\s*="
)
_MATH_STRONG = re.compile(
    r"\b(?:solve|equations?|simplify|probability|integers?|primes?|divisible|remainder|"
    r"derivative|integral|polynomial|quadratic|matrix|theorem|prove|factorial|logarithm|"
    r"inequality|real numbers?|infinitely many|arithmetic|geometric (?:series|sequence)|"
    r"how many ways)\b",
    re.IGNORECASE,
)
_MATH_WORD = re.compile(
    r"\b(?:calculate|compute|how many|how much|what is the value|evaluate|sum of|product of|"
    r"percent(?:age)?|ratio|fraction|average|mean|median|vector|triangle|circle|radius|area|"
    r"perimeter|volume|angle|digits?|exponent|function f|total|twice|half as|per \w+|each|"
    r"dollars?|cents?|rolled|dice?|coins?)\b|\$\d",
    re.IGNORECASE,
)
_QUESTION = re.compile(r"\b(?:how many|how much|what is|find|what was|calculate)\b", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")


def _text_of(messages: Sequence[Message]) -> str:
    parts: list[str] = []
    total = 0
    for m in messages:
        content = m.content if isinstance(m.content, str) else ""
        if not content:
            continue
        piece = content[:_MAX_PER_MESSAGE]
        parts.append(piece)
        total += len(piece)
        if total >= _MAX_TOTAL:
            break
    return "\n".join(parts)[:_MAX_TOTAL]


def _has_tool_structure(messages: Sequence[Message], tools: Sequence[Any] | None) -> bool:
    if tools:
        return True
    return any(m.role == "tool" or m.tool_calls for m in messages)


def domain_scores(text: str) -> dict[str, float]:
    """The raw agent/code/math scores of ``text`` (for debugging a classification)."""
    agent = len(_AGENT_MARKER.findall(text)) + 2 * len(_AGENT_PHRASE.findall(text))
    code = (
        3 * (len(_FENCE.findall(text)) // 2 or (1 if "```" in text else 0))
        + min(len(_CODE_LINE.findall(text)), 6)
        + min(2 * len(_CODE_LANG.findall(text)), 4)
        + min(len(_CODE_WORD.findall(text)), 4)
        + (2 if _CODE_REQUEST.search(text) else 0)
    )
    math: float = (
        min(2 * len(_LATEX.findall(text)), 8)
        + min(2 * len(_EQUATION.findall(text)), 4)
        + min(2 * len(_MATH_STRONG.findall(text)), 6)
        + min(len(_MATH_WORD.findall(text)), 4)
    )
    numbers = len(_NUMBER.findall(text))
    math += min(0.5 * numbers, 2.0)
    if numbers >= 1 and _QUESTION.search(text):
        math += 1.0  # a question over several quantities: the shape of a word problem
    return {"agent": float(agent), "code": float(code), "math": float(math)}


def classify_domain(messages: Sequence[Message], tools: Sequence[Any] | None = None) -> str:
    """Return the domain of one conversation: code, math, tool, agent or general.

    ``messages`` are OpenAI-format Messages (any roles; assistant turns count too, since an
    existing training set's answers carry signal), ``tools`` the OpenAI tool specs if any. The
    rules and weights are in the module docstring; the result depends only on the inputs.
    """
    text = _text_of(messages)
    scores = domain_scores(text)
    user_turns = sum(1 for m in messages if m.role == "user")
    if scores["agent"] >= 3 and user_turns >= 2:
        return "agent"
    if _has_tool_structure(messages, tools) or _TOOL_TAG.search(text) or _TOOL_SHAPE.search(text):
        return "tool"
    code, math = scores["code"], scores["math"]
    if code >= 3 and code >= math:
        return "code"
    if math >= 3:
        return "math"
    return "general"
