"""What an answer may be: the size bound of a response body and the checks of its usage.

A server that answers a request for at most ``max_tokens`` tokens with a 50 MB body, with
negative or astronomical token counts, or with more tokens than it was allowed, is broken (a
gateway bug, a misconfigured proxy, a server that ignores the limit); what it says is not data.
The client (``client.py``) reads at most ``body_limit`` bytes of an answer and passes the
decoded turns through ``answer_fault``; either failing is an ``impossible`` answer, which the
dispatcher treats as the endpoint's fault (taken out, the job moved on, never committed).

The bounds are generous on purpose: a healthy engine is far inside them, so an endpoint is
never taken out for an answer a real engine can give.

- ``body_limit``: 1 MiB plus, per choice, ``BYTES_PER_TOKEN`` bytes of text and
  ``ID_BYTES`` bytes of token id per allowed output token, and ``ID_BYTES`` per byte of the
  request (prompt token ids: a byte-level tokenizer makes at most one token per byte).
- ``answer_fault``: no negative count; cached tokens within the prompt; prompt tokens within
  what the request's bytes can make (plus ``TEMPLATE_TOKENS`` for a template's own text);
  output tokens (usage and returned ids) within ``max_tokens`` (plus ``SLACK_TOKENS``); usage
  against the returned ids and against the text (no token writes more than
  ``BYTES_PER_TOKEN`` bytes).

Pure functions: no I/O, no policy.
"""

from __future__ import annotations

from draftdata.records import Turn

BASE_BYTES = 1 << 20
BYTES_PER_TOKEN = 128  # the most bytes one output token may take in the body (escaped text)
ID_BYTES = 12  # one token id in a JSON list ("151645, ")
TEMPLATE_TOKENS = 8192  # a chat template's own text (a default system prompt, tool preamble)
SLACK_TOKENS = 16  # engines that count an end-of-sequence token or two differently


def body_limit(request_bytes: int, max_tokens: int, n: int = 1) -> int:
    """The most bytes an answer to a request of ``request_bytes`` bytes asking for ``n``
    choices of at most ``max_tokens`` tokens may have."""
    per_choice = max_tokens * (BYTES_PER_TOKEN + ID_BYTES) + request_bytes * ID_BYTES
    return BASE_BYTES + max(1, n) * per_choice


def _text_bytes(turn: Turn) -> int:
    n = len((turn.content or "").encode("utf-8")) + len((turn.reasoning or "").encode("utf-8"))
    for call in turn.tool_calls or []:
        fn = call.get("function") or {}
        n += len(str(fn.get("name") or "").encode()) + len(str(fn.get("arguments") or "").encode())
    return n


def answer_fault(
    turns: list[Turn], *, max_tokens: int | None, request_bytes: int, n: int = 1
) -> str | None:
    """Why the answer ``turns`` to one request cannot be true (None when it can)."""
    for i, turn in enumerate(turns):
        where = f"choice {i}: " if len(turns) > 1 else ""
        u = turn.usage
        if min(u.prompt_tokens, u.completion_tokens, u.cached_tokens) < 0:
            return (
                f"{where}usage counts a negative number of tokens (prompt {u.prompt_tokens}, "
                f"output {u.completion_tokens}, cached {u.cached_tokens})"
            )
        if u.cached_tokens > u.prompt_tokens:
            return f"{where}usage says {u.cached_tokens} cached of {u.prompt_tokens} prompt tokens"
        prompt_cap = max(1, n) * (request_bytes + TEMPLATE_TOKENS)
        if u.prompt_tokens > prompt_cap:
            return (
                f"{where}usage says {u.prompt_tokens} prompt tokens for a request of "
                f"{request_bytes} bytes"
            )
        ids = turn.output_token_ids
        text = _text_bytes(turn)
        if max_tokens is not None:
            cap = max_tokens + SLACK_TOKENS
            if ids is not None and len(ids) > cap:
                return f"{where}{len(ids)} output token ids against max_tokens {max_tokens}"
            if text > BYTES_PER_TOKEN * cap:
                return f"{where}{text} bytes of text against max_tokens {max_tokens}"
        if ids is not None and len(turns) == 1 and u.completion_tokens > 0:
            gap = abs(u.completion_tokens - len(ids))
            if gap > SLACK_TOKENS + len(ids) // 100:
                return (
                    f"usage says {u.completion_tokens} output tokens but the answer has "
                    f"{len(ids)} token ids"
                )
        if u.completion_tokens > 0 and text > BYTES_PER_TOKEN * (u.completion_tokens + 1) + 4096:
            return f"{where}{text} bytes of text from {u.completion_tokens} output tokens"
    if max_tokens is not None:
        total = sum(t.usage.completion_tokens for t in turns)
        # one request's usage: the choices' counts add up to the request's
        if total > len(turns) * (max_tokens + SLACK_TOKENS):
            return (
                f"usage says {total:,} output tokens against max_tokens {max_tokens} "
                f"x {len(turns)} choice(s)"
            )
    return None
