"""The default output limit: context length minus the prompt's tokens, per request."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient

from draftdata.errors import ContextLengthError
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.limits import (
    FALLBACK_MAX_TOKENS,
    MIN_LIMIT,
    OutputLimit,
    estimate_tokens,
    message_bytes,
)
from draftdata.generate.engine.request import Request
from draftdata.records import Message, Turn, Usage


def endpoint(context: int | None = 8192, client: Any = None) -> Endpoint:
    ep = Endpoint(
        "http://x:1",
        client or FakeClient(),
        index=0,
        concurrency=4,
        default_concurrency=4,
        breaker_failures=5,
    )
    ep.context_length = context
    return ep


def user(text: str) -> Message:
    return Message(role="user", content=text)


def test_explicit_limit_that_fits_wins_and_unknown_context_falls_back() -> None:
    lim = OutputLimit(100, endpoint(), None)
    assert lim.limit([user("x" * 5_000)]) == 100 and not lim.clamped
    assert OutputLimit(100, endpoint(None), None).limit([user("x" * 50_000)]) == 100
    assert OutputLimit(None, endpoint(None), None).limit([user("hi")]) == FALLBACK_MAX_TOKENS


@settings(max_examples=300, deadline=None)
@given(
    context=st.integers(min_value=64, max_value=200_000),
    explicit=st.integers(min_value=1, max_value=300_000),
    prompt_bytes=st.integers(min_value=0, max_value=400_000),
    tokens_per_byte=st.one_of(st.none(), st.floats(min_value=0.05, max_value=1.0)),
    strict=st.booleans(),
)
def test_an_explicit_limit_is_clamped_to_the_room_the_context_leaves(
    context: int, explicit: int, prompt_bytes: int, tokens_per_byte: float | None, strict: bool
) -> None:
    """Any context, limit and prompt: a limit that does not fit is lowered to the room the
    estimated prompt leaves (never below MIN_LIMIT, never above the configured one) and says
    so; one that fits, or any with ``strict``, is sent as configured."""
    ep = endpoint(context)
    ep.tokens_per_byte = tokens_per_byte
    msgs = [user("x" * prompt_bytes)]
    lim = OutputLimit(explicit, ep, None, strict=strict)
    got = lim.limit(msgs)
    room = lim.room(msgs)
    assert room is not None
    est = estimate_tokens(msgs, None, tokens_per_byte or 0.5)
    assert room == context - est - 1
    if strict or explicit <= room:
        assert got == explicit and not lim.clamped
    else:
        assert got == min(explicit, max(MIN_LIMIT, room)) <= explicit
        assert lim.clamped == (got < explicit)  # a limit below MIN_LIMIT is not lowered
        assert got <= MIN_LIMIT or est + got < context  # it fits (SGLang: strictly below)


def test_default_fills_the_context_minus_the_prompt() -> None:
    lim = OutputLimit(None, endpoint(8192), None)
    short = lim.limit([user("hi")])
    long = lim.limit([user("word " * 1000)])
    assert 8000 < short < 8192
    assert long < short - 2000  # 5000 bytes at the pessimistic 0.5 token per byte


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(min_size=0, max_size=3000),
    tokens_per_byte=st.floats(min_value=0.05, max_value=1.0),
)
def test_estimate_is_at_least_the_true_count_at_the_learned_rate(
    text: str, tokens_per_byte: float
) -> None:
    """Whatever the text: bytes x the learned rate (the largest seen) + template tokens is
    never below a count made at that same rate, and the limit keeps within the context."""
    msgs = [Message(role="system", content="s"), user(text)]
    size = message_bytes(msgs)
    est = estimate_tokens(msgs, None, tokens_per_byte)
    assert est >= size * tokens_per_byte
    ep = endpoint(8192)
    ep.tokens_per_byte = tokens_per_byte
    limit = OutputLimit(None, ep, None).limit(msgs)
    assert limit >= MIN_LIMIT
    assert limit == MIN_LIMIT or est + limit < 8192


def test_learns_tokens_per_byte_from_the_first_answer() -> None:
    ep = endpoint(8192)
    lim = OutputLimit(None, ep, None)
    msgs = [user("a" * 4000)]
    before = lim.limit(msgs)
    lim.answered(msgs, Turn(content="ok", usage=Usage(prompt_tokens=1040, completion_tokens=5)))
    assert ep.tokens_per_byte == pytest.approx(0.25)
    assert OutputLimit(None, ep, None).limit(msgs) > before + 900


def test_a_short_prompt_with_template_overhead_does_not_shrink_later_limits() -> None:
    """A short prompt whose template adds much text of its own (a tool preamble) would pass for
    a high tokens-per-byte ratio; learnt only from requests of LEARN_MIN_BYTES or more, the
    ratio of a later long prompt is its own (the old rule kept the short prompt's 0.7 for the
    rest of the run and cut a long prompt's limit by thousands of tokens)."""
    ep = endpoint(8192)
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 150}}]
    short = [user("Hi")]
    lim = OutputLimit(None, ep, tools)
    lim.answered(short, Turn(content="ok", usage=Usage(prompt_tokens=190, completion_tokens=2)))
    assert ep.tokens_per_byte is None  # too short to learn from
    long = [user("word " * 1600)]  # 8,000 bytes of English: ~2,000 tokens
    lim = OutputLimit(None, ep, None)
    lim.answered(long, Turn(content="ok", usage=Usage(prompt_tokens=2040, completion_tokens=2)))
    assert ep.tokens_per_byte == pytest.approx(0.25, abs=0.01)
    assert OutputLimit(None, ep, None).limit(long) > 8192 - 2040 - 400


def test_later_turns_carry_the_earlier_answers() -> None:
    """Turn 2's limit starts from what the server counted for turn 1: its prompt, plus the
    answer as the history carries it (its reasoning dropped: only the content's share)."""
    ep = endpoint(8192)
    first = [user("question")]
    answer = Turn(
        content="c" * 1000,
        reasoning="r" * 3000,
        usage=Usage(prompt_tokens=20, completion_tokens=4000),
    )
    with_reasoning = [
        *first,
        Message(role="assistant", content="c" * 1000, reasoning_content="r" * 3000),
    ]
    without = [*first, Message(role="assistant", content="c" * 1000)]
    limits = []
    for history in (with_reasoning, without):
        lim = OutputLimit(None, ep, None)
        lim.answered(first, answer)
        lim.carried(history)
        limits.append(lim.limit([*history, user("and then?")]))
    kept, dropped = limits
    assert kept <= 8192 - 4020 - 1 and kept > 8192 - 4020 - 200
    # 1000 of 4000 bytes carried: about 1100 of the 4000 answer tokens
    assert dropped <= 8192 - 20 - 1100 - 1 and dropped > 8192 - 20 - 1100 - 200


async def test_context_length_answer_to_a_computed_limit_shrinks_and_retries() -> None:
    client = FakeClient(fail={1: ContextLengthError})
    ep = endpoint(8192, client)
    lim = OutputLimit(None, ep, None)
    turns, sent = await lim.send(Request(model="M", messages=[user("q")], max_tokens=8000))
    assert turns and sent.max_tokens == 2000
    assert [(b["max_tokens"], b["max_completion_tokens"]) for b in client.bodies] == [
        (8000, 8000),
        (2000, 2000),
    ]


async def test_context_length_with_a_strict_limit_is_the_prompts_failure() -> None:
    client = FakeClient(fail={1: ContextLengthError})
    lim = OutputLimit(8000, endpoint(8192, client), None, strict=True)
    with pytest.raises(ContextLengthError):
        await lim.send(Request(model="M", messages=[user("q")], max_tokens=8000))
    assert len(client.bodies) == 1


async def test_context_length_answer_to_an_explicit_limit_shrinks_unless_strict() -> None:
    """The server knows the context better than an estimate (or than nothing, when the
    context is unknown): its too-long answer to a configured limit lowers it, counted."""
    client = FakeClient(fail={1: ContextLengthError})
    lim = OutputLimit(8000, endpoint(None, client), None)
    assert lim.limit([user("q")]) == 8000 and not lim.clamped
    turns, sent = await lim.send(Request(model="M", messages=[user("q")], max_tokens=8000))
    assert turns and sent.max_tokens == 2000 and lim.clamped
