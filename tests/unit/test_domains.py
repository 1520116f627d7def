"""The domain classifier on labelled examples we wrote, one group per domain, and its scoring
against the plain form it was first written in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.records import Message
from draftdata.shared import domains as d
from draftdata.shared.domains import DOMAINS, classify_domain, domain_scores


def _u(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


CODE = [
    "Write a Python function that returns the n-th Fibonacci number using memoization.",
    "Why does this fail?\n```js\nconst x = [1,2,3];\nconsole.log(x.map(y => y*2)\n```",
    'Fix the bug:\n#include <stdio.h>\nint main() {\n  printf("hi")\n}',
    "Write an SQL query that lists customers with more than 3 orders.\nSELECT name FROM customers",
    "Implement a binary search tree class in Java with insert and delete methods.",
    "How do I reverse a string in C++ without using the standard library?",
    "Explain the difference between a list and a tuple in Python, with code examples.",
    "Write a bash script that renames all .txt files in a directory to .md",
    "def add(a, b):\n    return a + b\n\nAdd type hints and a docstring to this function.",
    "Create a React component that fetches JSON from an API and renders a table.",
    "Write a Python function to compute the sum of all primes below n.",
    "My Rust program panics with 'index out of bounds'; here is the code:\nfn main() {\n}",
]
MATH = [
    "James buys 5 packs of beef that are 4 pounds each. The price of beef is $5.50 per pound. "
    "How much did he pay?",
    "Solve for x: 3x + 2 = 11.",
    "What is the value of $\\frac{1}{2} + \\frac{1}{3}$?",
    "Find the area of a triangle with sides 3, 4 and 5.",
    "Compute $\\sqrt{144} + 2^{3}$.",
    "Prove that there are infinitely many prime numbers.",
    "If a fair die is rolled twice, what is the probability that the sum is 7?",
    "What is the remainder when 2^{100} is divided by 7?",
    "A train travels 60 miles per hour for 3 hours. How many miles does it travel?",
    "Evaluate the integral $\\int_0^1 x^2 dx$.",
    "Simplify the expression (x^2 - 9)/(x - 3) for x not equal to 3.",
    "Tom has twice as many apples as Jane. Jane has 7 apples. How many apples do they have?",
]
GENERAL = [
    "Write a short poem about the sea at dawn.",
    "What are some good tips for a job interview?",
    "Summarise the plot of Pride and Prejudice in three sentences.",
    "Translate 'good morning, how are you?' into French.",
    "Who was the first president of the United States?",
    "Give me a recipe for a vegetarian lasagna.",
    "What is the capital of Australia?",
    "Explain why the sky is blue to a five-year-old.",
    "Draft a polite email declining a meeting invitation.",
    "What are the pros and cons of remote work?",
    "How many people live in Tokyo?",
    "Describe the history of the Roman Empire briefly.",
]


@pytest.mark.parametrize("text", CODE)
def test_code(text: str) -> None:
    assert classify_domain(_u(text)) == "code", domain_scores(text)


@pytest.mark.parametrize("text", MATH)
def test_math(text: str) -> None:
    assert classify_domain(_u(text)) == "math", domain_scores(text)


@pytest.mark.parametrize("text", GENERAL)
def test_general(text: str) -> None:
    assert classify_domain(_u(text)) == "general", domain_scores(text)


def test_tool_from_specs_calls_and_tags() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert classify_domain(_u("What's the weather in Paris?"), tools) == "tool"
    call = [
        Message(role="user", content="Weather in Paris?"),
        Message(role="assistant", tool_calls=[{"id": "c1", "type": "function", "function": {}}]),
        Message(role="tool", content='{"temp": 20}', tool_call_id="c1"),
    ]
    assert classify_domain(call) == "tool"
    system = Message(role="system", content="You may call functions. <tools>{'name': 'f'}</tools>")
    assert classify_domain([system, *_u("Book a flight to Rome.")]) == "tool"


def test_agent_trajectory() -> None:
    msgs = [
        Message(
            role="user",
            content="You are an assistant that will act like a person, I'will play the role of "
            "linux operating system. For each turn take exact one of the three actions: bash, "
            "finish or answer.\nHow many files are in /etc?",
        ),
        Message(role="assistant", content="Think: I should count files.\nAct: bash\nls /etc | wc"),
        Message(role="user", content="The output of the OS:\n212"),
        Message(role="assistant", content="Think: the answer is 212.\nAct: answer(212)"),
        Message(role="user", content="Now count the directories."),
    ]
    assert classify_domain(msgs) == "agent"


def test_react_trajectory_without_assistant_turns() -> None:
    msgs = [
        Message(
            role="user",
            content="Interact with a household to solve a task. Task: put a mug in the sink.",
        ),
        Message(role="user", content="Observation: You are in the kitchen. You see a mug."),
    ]
    assert classify_domain(msgs) == "agent"


def test_single_turn_with_agent_words_is_not_agent() -> None:
    assert classify_domain(_u("Thought: what is an agent in economics?")) != "agent"


def test_empty_and_none_content_are_general() -> None:
    assert classify_domain([Message(role="user", content="")]) == "general"
    assert classify_domain([Message(role="assistant", content=None)]) == "general"
    assert classify_domain([]) == "general"


def test_domains_constant_covers_results() -> None:
    assert set(DOMAINS) == {"code", "math", "tool", "agent", "general"}


def test_long_text_is_capped_and_fast_path_deterministic() -> None:
    msgs = _u("lorem ipsum " * 100_000 + "```python\nprint(1)\n```")
    # The fence is past the scanned window, so it does not count.
    assert classify_domain(msgs) == "general"
    assert classify_domain(msgs) == classify_domain(msgs)


# -- the scoring against its plain form ----------------------------------------------------------


def _plain_scores(text: str) -> dict[str, float]:
    """domain_scores as first written (one Python loop over the tokens, every regular
    expression run on every text): the reference the faster form must equal."""
    low = text.lower()
    tokens = d._TOKEN.findall(low)
    langs = words = strong = weak = numbers = 0
    request = False
    for i, tok in enumerate(tokens):
        if tok[0].isdigit():
            numbers += 1
            continue
        if tok in d._CODE_LANGS:
            langs += 1
        elif tok in d._CODE_WORDS:
            words += 1
        if tok in d._MATH_STRONG:
            strong += 1
        elif tok in d._MATH_WORDS:
            weak += 1
        if not request and tok in d._CODE_VERBS:
            request = any(t in d._CODE_OBJECTS for t in tokens[i + 1 : i + 9])

    def count(phrases: tuple[str, ...]) -> int:
        return sum(low.count(p) for p in phrases)

    agent = len(d._AGENT_MARKER.findall(low)) + 2 * count(d._AGENT_PHRASES)
    fences = low.count("```")
    code = (
        3 * (fences // 2 or (1 if fences else 0))
        + min(len(d._CODE_LINE.findall(low)), 6)
        + min(2 * langs, 4)
        + min(words + count(d._CODE_PHRASES), 4)
        + (2 if request else 0)
    )
    math = (
        min(2 * len(d._LATEX.findall(low)), 8)
        + min(2 * len(d._EQUATION.findall(low)), 4)
        + min(2 * (strong + count(d._MATH_STRONG_PHRASES)), 6)
        + min(weak + count(d._MATH_PHRASES) + len(d._MONEY.findall(low)), 4)
        + min(0.5 * numbers, 2.0)
    )
    if numbers >= 1 and any(q in low for q in d._QUESTIONS):
        math += 1.0
    return {"agent": float(agent), "code": float(code), "math": float(math)}


def _plain_tool_text(text: str) -> bool:
    low = text.lower()
    return any(tag in low for tag in d._TOOL_TAGS) or d._TOOL_SHAPE.search(low) is not None


_VOCAB = [
    *sorted(
        d._CODE_LANGS | d._CODE_WORDS | d._MATH_STRONG | d._MATH_WORDS | d._CODE_VERBS
        | d._CODE_OBJECTS
    ),
    *d._AGENT_PHRASES, *d._CODE_PHRASES, *d._MATH_STRONG_PHRASES, *d._MATH_PHRASES,
    *d._TOOL_TAGS, "thought:", "action:", "\\frac{1}{2}", "$x$", "x^{2}", "^2", "3x + 2 = 11",
    "12 * 4 =", "$5", "3.14", "٣", "#include <x>", "def f(", "select a from b",
    "'type': 'function'", '"parameters": {', "```", "c++", "c#", "+#", "Python", "HOW MANY",
    "x", "the", "and", "é",
]  # fmt: skip
_SEPARATORS = [" ", "  ", "\n", "\t", ", ", ". ", ":", "=", "$", "^", "_", "\\", "(", "{", ""]


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.sampled_from(_VOCAB) | st.text(max_size=6), st.sampled_from(_SEPARATORS)),
        max_size=60,
    )
)
def test_scores_equal_the_plain_form(parts: list[tuple[str, str]]) -> None:
    """The scoring's faster form (set look-ups mapped over the tokens, regular expressions
    skipped when a character they need is absent) scores every text as the plain loop did."""
    text = "".join(w + s for w, s in parts)
    assert domain_scores(text) == _plain_scores(text)
    assert d._has_tool_text(text) == _plain_tool_text(text)
