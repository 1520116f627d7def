"""What an answer may be (``generate/answers/bounds.py``): answers a real engine can give pass,
whatever their shape; each impossible count is named."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.generate.answers.bounds import (
    BYTES_PER_TOKEN,
    ID_BYTES,
    SLACK_TOKENS,
    answer_fault,
    body_limit,
)
from draftdata.records import Turn, Usage


def _turn(text: str, prompt: int, output: int, ids: bool, cached: int = 0) -> Turn:
    return Turn(
        content=text,
        output_token_ids=list(range(output)) if ids else None,
        usage=Usage(prompt_tokens=prompt, completion_tokens=output, cached_tokens=cached),
    )


@settings(max_examples=300, deadline=None)
@given(
    max_tokens=st.integers(1, 40_000),
    data=st.data(),
    request_bytes=st.integers(50, 200_000),
    ids=st.booleans(),
)
def test_answers_a_real_engine_can_give_pass(
    max_tokens: int, data: st.DataObject, request_bytes: int, ids: bool
) -> None:
    output = data.draw(st.integers(0, max_tokens))
    text_bytes = data.draw(st.integers(0, max(0, min(output * 8, 20_000))))
    prompt = data.draw(st.integers(1, request_bytes))
    cached = data.draw(st.integers(0, prompt))
    turn = _turn("é" * (text_bytes // 2), prompt, output, ids, cached)
    assert answer_fault([turn], max_tokens=max_tokens, request_bytes=request_bytes) is None
    # and the whole body of such an answer is within the size bound
    body = text_bytes * 6 + output * ID_BYTES + prompt * ID_BYTES + 2048
    assert body <= body_limit(request_bytes, max_tokens)


def test_each_impossible_count_is_named() -> None:
    def fault(turn: Turn, max_tokens: int | None = 100) -> str:
        said = answer_fault([turn], max_tokens=max_tokens, request_bytes=400)
        assert said is not None
        return said

    assert "negative" in fault(_turn("a", -7, 5, False))
    assert "negative" in fault(_turn("a", 7, -5, False))
    assert "cached" in fault(_turn("a", 7, 5, False, cached=8))
    assert "prompt tokens for a request of 400 bytes" in fault(_turn("a", 10**9, 5, False))
    assert "against max_tokens 100" in fault(_turn("a", 7, 10**12, False))
    assert "output token ids" in fault(_turn("a", 7, 100 + SLACK_TOKENS + 1, True))
    assert "bytes of text" in fault(_turn("x" * (BYTES_PER_TOKEN * 200), 7, 50, False))
    assert "bytes of text from 2 output tokens" in fault(_turn("x" * 10_000, 7, 2, False), None)
    mismatch = _turn("a", 7, 40, True)
    mismatch = Turn(content="a", output_token_ids=[1] * 5, usage=mismatch.usage)
    assert "token ids" in fault(mismatch)
