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

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from draftdata.records import Message

DOMAINS = ("code", "math", "tool", "agent", "general")

# Per message and in total, only this much text is scanned: the signal is at the start, and it
# keeps the cost flat on 30K-character conversations.
_MAX_PER_MESSAGE = 3000
_MAX_TOTAL = 9000

# Everything below runs on the lower-cased text. Word lists are matched by one tokenising pass
# and set look-ups (regex alternations of literal words are ~20x slower in CPython's ``re``);
# multi-word phrases by ``str.count``; only structural patterns use regular expressions.


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_TOKEN = re.compile(r"[a-z][a-z0-9+#]*|\d+(?:\.\d+)?")

_AGENT_MARKER = re.compile(
    r"^\s*(?:thought|action(?: input)?|observation|act|think|final answer)\s*:", re.MULTILINE
)
_AGENT_PHRASES = (
    "take exact one of",
    "take exactly one of",
    "available actions",
    "interact with a household",
    "the output of the os",
    "you are an agent",
    "you are an autonomous agent",
    "you are an intelligent agent",
    "webshop",
    "web shop",
    "your task is to interact",
    "valid actions",
    "admissible actions",
    "i will play the role of",
    "i'will play the role",
    "environment feedback",
)
_TOOL_TAGS = ("<tools>", "<tool_call>", "<tool_response>", "<functioncall>")
_TOOL_SHAPE = re.compile(r"[\"']type[\"']\s*:\s*[\"']function[\"']|[\"']parameters[\"']\s*:\s*\{")

_CODE_LINE = re.compile(
    r"^\s*(?:def \w+\s*\(|class \w+[\s(:]|import \w+|from [\w.]+ import|#include\s*<|"
    r"public (?:static )?(?:void|int|class|string)|private \w+ \w+|function \w*\s*\(|"
    r"const \w+ = |let \w+ = |var \w+ = |console\.log\(|system\.out\.print|printf\(|"
    r"return [^.\n]*;|for \(.*;.*;|while \(|if \(.*\) ?\{|\}\s*else\s*\{|"
    r"select .+ from|insert into|create table|<\?php|<div|<html|\$ \w+|fn \w+\(|func \w+\()",
    re.MULTILINE,
)
_CODE_LANGS = _words(
    "python javascript typescript java c++ c# golang rust kotlin swift ruby php sql html css "
    "bash powershell perl scala haskell matlab verilog jquery"
)
_CODE_WORDS = _words(
    "regex function functions method methods class classes api compile compiler compiled "
    "docstring variable variables refactor debug bug bugs algorithm code coding program "
    "programming script snippet array arrays string strings recursion recursive runtime "
    "syntax exception library framework json dataframe pandas numpy react django flask git "
    "docker kubernetes implement implementation"
)
_CODE_PHRASES = (
    "shell script",
    "regular expression",
    "type hint",
    "unit test",
    "stack trace",
    "integer overflow",
)
_CODE_VERBS = _words("write implement create code develop build")
_CODE_OBJECTS = _words("function program script class method query code module endpoint")
_LATEX = re.compile(
    r"\\(?:frac|sqrt|int|sum|prod|lim|cdot|times|div|pi|theta|alpha|beta|infty|le|ge|neq|"
    r"binom|log|sin|cos|tan|mathbb|mathrm|left|right|begin\{(?:align|equation|pmatrix))|"
    r"\$[^$\n]{1,80}\$|[\^_]\{[^}]*\}|\^\d"
)
# an operator, a number, then "=": "3x + 2 = 11", "12 * 4 = "
_EQUATION = re.compile(r"[-+*/×÷]\s*\d+(?:\.\d+)?\s*=")
_MONEY = re.compile(r"\$\d")
_MATH_STRONG = _words(
    "solve equation equations simplify probability integer integers prime primes divisible "
    "remainder derivative integral polynomial quadratic matrix theorem prove factorial "
    "logarithm inequality arithmetic"
)
_MATH_STRONG_PHRASES = (
    "real number",
    "infinitely many",
    "geometric series",
    "geometric sequence",
    "how many ways",
)
_MATH_WORDS = _words(
    "calculate compute evaluate percent percentage ratio fraction average mean median vector "
    "triangle circle radius area perimeter volume angle digit digits exponent total twice per "
    "each dollar dollars cent cents rolled die dice coin coins"
)
_MATH_PHRASES = (
    "how many",
    "how much",
    "what is the value",
    "sum of",
    "product of",
    "function f",
    "half as",
)
_QUESTIONS = ("how many", "how much", "what is", "find", "what was", "calculate")


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


def _has_tool_text(text: str, low: str | None = None) -> bool:
    low = text.lower() if low is None else low
    if any(tag in low for tag in _TOOL_TAGS):
        return True
    return ":" in low and _TOOL_SHAPE.search(low) is not None  # the shape needs a ":"


def _count(text: str, phrases: Sequence[str]) -> int:
    return sum(map(text.count, phrases))


def _found(pattern: re.Pattern[str], low: str, needs: str) -> int:
    """Matches of ``pattern`` in ``low``; 0 at once when none of the characters every match
    contains (``needs``) is in the text (a C scan instead of the regex engine)."""
    if not any(c in low for c in needs):
        return 0
    return len(pattern.findall(low))


# Word counts in one C pass: each word maps to the classes it counts in (a token counts as a
# language before a code word and as a strong math word before a weak one, hence the set
# differences), a number (which _TOKEN_WORDS returns as "") to _NUMBER, and a Counter counts the
# classes.
_LANG, _CODE_WORD, _STRONG, _WEAK, _VERB, _NUMBER = 1, 2, 4, 8, 16, 32
_TOKEN_WORDS = re.compile(r"([a-z][a-z0-9+#]*)|\d+(?:\.\d+)?")  # _TOKEN, numbers as ""
_CLASS: dict[str, int] = {"": _NUMBER}
for _set, _bit in (
    (_CODE_LANGS, _LANG),
    (_CODE_WORDS - _CODE_LANGS, _CODE_WORD),
    (_MATH_STRONG, _STRONG),
    (_MATH_WORDS - _MATH_STRONG, _WEAK),
    (_CODE_VERBS, _VERB),
):
    for _word in _set:
        _CLASS[_word] = _CLASS.get(_word, 0) | _bit


def domain_scores(text: str) -> dict[str, float]:
    """The raw agent/code/math scores of ``text`` (for debugging a classification)."""
    low = text.lower()
    tokens = _TOKEN_WORDS.findall(low)
    per_class = Counter(map(_CLASS.get, tokens))
    counted = [(c, n) for c, n in per_class.items() if c]

    def total(bit: int) -> int:
        return sum(n for c, n in counted if c & bit)

    numbers, langs, words = total(_NUMBER), total(_LANG), total(_CODE_WORD)
    strong, weak = total(_STRONG), total(_WEAK)
    request = False
    if total(_VERB):
        for i in itertools.compress(range(len(tokens)), map(_CODE_VERBS.__contains__, tokens)):
            if not _CODE_OBJECTS.isdisjoint(tokens[i + 1 : i + 9]):
                request = True
                break

    agent = _found(_AGENT_MARKER, low, ":") + 2 * _count(low, _AGENT_PHRASES)
    fences = low.count("```")
    code = (
        3 * (fences // 2 or (1 if fences else 0))
        + min(len(_CODE_LINE.findall(low)), 6)
        + min(2 * langs, 4)
        + min(words + _count(low, _CODE_PHRASES), 4)
        + (2 if request else 0)
    )
    math = (
        min(2 * _found(_LATEX, low, "\\$^_"), 8)
        + min(2 * _found(_EQUATION, low, "="), 4)
        + min(2 * (strong + _count(low, _MATH_STRONG_PHRASES)), 6)
        + min(weak + _count(low, _MATH_PHRASES) + _found(_MONEY, low, "$"), 4)
        + min(0.5 * numbers, 2.0)
    )
    if numbers >= 1 and any(q in low for q in _QUESTIONS):
        math += 1.0  # a quantity question with a number in it: the shape of a word problem
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
    if _has_tool_structure(messages, tools) or _has_tool_text(text):
        return "tool"
    code, math = scores["code"], scores["math"]
    if code >= 3 and code >= math:
        return "code"
    if math >= 3:
        return "math"
    return "general"
