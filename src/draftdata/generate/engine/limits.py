"""The output limit of one request: an explicit ``max_tokens``, or (the default) what fills the
endpoint's context; never more than the context has room for.

With no ``--max-tokens`` a request may write up to ``context length - prompt tokens`` (SGLang
refuses ``prompt + max_new >= context``, so one token less). The context length comes from the
endpoint (SGLang ``/server_info`` ``context_length``, vLLM ``/v1/models`` ``max_model_len``) or
the fleet file. The prompt's tokens are counted per request, since later turns of a
multi-turn prompt carry the earlier answers:

- what the server already counted is exact: after a turn, the next request's prefix holds that
  turn's ``usage.prompt_tokens`` plus the answer as the history carries it (without its
  reasoning unless kept: its share of ``usage.completion_tokens`` by bytes, plus 10%), so only
  the new messages are estimated;
- new messages are estimated from their UTF-8 bytes times the endpoint's tokens-per-byte, the
  largest ratio its answers to requests of ``LEARN_MIN_BYTES`` or more have shown so far
  (``INITIAL_TOKENS_PER_BYTE`` before any), plus a few template tokens per message.

An explicit ``max_tokens`` that does not fit (the prompt's tokens plus the limit exceed the
context) is a configuration error, not the prompt's: the request is sent with the room there is
(``clamped`` says so, and the dispatcher counts it for the summary's one line) instead of being
refused by the server and recorded as a ``context_length`` failure. ``strict`` (``--strict-limit``)
sends the configured limit as it is: a prompt that does not fit with it is the prompt's failure
(the stage refuses, before any request, a limit that fits no request at all).

An estimate can be short for an unusual prompt: a context-length answer to a request whose limit
was computed or lowered here (decided by the error's type) is retried at once with a quarter of
the limit, up to ``SHRINK_TRIES`` times; then it is the prompt's own failure. With an unknown
context length the limit is ``FALLBACK_MAX_TOKENS`` (or the explicit one, shrunk the same way
when the server says it does not fit). This module holds no I/O but the chat call it wraps;
``dispatch.py`` uses it.
"""

from __future__ import annotations

import math

import msgspec

from draftdata.errors import ContextLengthError
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.request import Request
from draftdata.records import JsonDict, Message, Turn
from draftdata.shared.tokens import turn_tokens

INITIAL_TOKENS_PER_BYTE = 0.5  # pessimistic for English and code (~0.25-0.3), fine for CJK
PER_MESSAGE_TOKENS = 8  # role markers and separators of a chat template
FIXED_TOKENS = 32  # generation prompt, an empty think block, BOS
FALLBACK_MAX_TOKENS = 4096  # the context length is unknown
# the least request size (bytes) the tokens-per-byte ratio is learnt from: in a shorter one the
# template's own text (a tool preamble, a default system prompt) would pass for prompt tokens
# and raise the ratio for the rest of the run
LEARN_MIN_BYTES = 1024
MIN_LIMIT = 16
SHRINK_TRIES = 2


def message_bytes(messages: list[Message], tools: list[JsonDict] | None = None) -> int:
    """UTF-8 size of what a template renders from ``messages`` and ``tools`` (content, reasoning,
    tool calls and specs)."""
    n = 0
    for m in messages:
        n += len((m.content or "").encode("utf-8"))
        if m.reasoning_content:
            n += len(m.reasoning_content.encode("utf-8"))
        if m.tool_calls:
            n += len(msgspec.json.encode(m.tool_calls))
    if tools:
        n += len(msgspec.json.encode(tools))
    return n


def estimate_tokens(
    messages: list[Message], tools: list[JsonDict] | None, tokens_per_byte: float
) -> int:
    """An upper-leaning estimate of the prompt tokens of ``messages`` (and ``tools``)."""
    size = message_bytes(messages, tools)
    return math.ceil(size * tokens_per_byte) + PER_MESSAGE_TOKENS * len(messages) + FIXED_TOKENS


class OutputLimit:
    """The limit for the requests of one conversation on one endpoint (see the module doc).

    ``explicit``: the configured ``max_tokens`` (None: fill the context); ``strict``: send it
    as configured, never lowered. ``limit(messages)`` gives the next request's limit (``clamped``:
    it is below ``explicit``, to fit the context); ``answered(messages, turn)`` records what the
    server counted, so the next turn's estimate starts from it; ``send`` runs one request with
    the shrink-on-context-length retry.
    """

    def __init__(
        self,
        explicit: int | None,
        ep: Endpoint,
        tools: list[JsonDict] | None,
        *,
        strict: bool = False,
    ) -> None:
        self.explicit = explicit
        self.ep = ep
        self.tools = tools
        self.strict = strict
        self.clamped = False  # the last request's limit is below ``explicit`` (to fit)
        self._known_messages = 0  # leading messages whose tokens the server counted
        self._known_tokens = 0
        self._prompt_tokens = 0  # of the last answered request
        self._answer_tokens = 0  # its output tokens (reasoning included)
        self._answer: Turn | None = None  # the last answer (its UTF-8 size: ``carried``)

    @property
    def auto(self) -> bool:
        """Whether the limit is computed here (no explicit max_tokens, known context)."""
        return self.explicit is None and self.ep.context_length is not None

    @property
    def shrinks(self) -> bool:
        """Whether a context-length answer is retried with a smaller limit: a computed one, or
        an explicit one unless ``strict``."""
        return self.auto or (self.explicit is not None and not self.strict)

    def room(self, messages: list[Message]) -> int | None:
        """The most output tokens a request of ``messages`` leaves room for in the endpoint's
        context (an upper-leaning estimate of its prompt; None when the context is unknown)."""
        context = self.ep.context_length
        if context is None:
            return None
        rate = self.ep.tokens_per_byte or INITIAL_TOKENS_PER_BYTE
        if self._known_messages and self._known_messages <= len(messages):
            new = messages[self._known_messages :]
            prompt = self._known_tokens + estimate_tokens(new, None, rate)
        else:
            prompt = estimate_tokens(messages, self.tools, rate)
        return context - prompt - 1

    def limit(self, messages: list[Message]) -> int:
        """``max_tokens`` for a request of ``messages`` (sets ``clamped``)."""
        self.clamped = False
        if self.explicit is not None and self.strict:
            return self.explicit
        room = self.room(messages)
        if room is None:
            return self.explicit if self.explicit is not None else FALLBACK_MAX_TOKENS
        if self.explicit is None:
            return max(MIN_LIMIT, room)
        if self.explicit <= room:
            return self.explicit
        lowered = min(self.explicit, max(MIN_LIMIT, room))
        self.clamped = lowered < self.explicit
        return lowered

    def answered(self, messages: list[Message], turn: Turn) -> None:
        """The server answered ``messages`` with ``turn``: learn the endpoint's tokens per byte
        (from a first request) and keep what it counted for the next turn."""
        usage = turn.usage
        if usage.prompt_tokens <= 0:
            return
        if not self._known_messages:
            size = message_bytes(messages, self.tools)
            overhead = PER_MESSAGE_TOKENS * len(messages) + FIXED_TOKENS
            if size >= LEARN_MIN_BYTES:
                seen = max(0.05, (usage.prompt_tokens - overhead) / size)
                self.ep.tokens_per_byte = max(self.ep.tokens_per_byte or 0.0, min(1.0, seen))
        self._prompt_tokens = usage.prompt_tokens
        self._answer_tokens = turn_tokens(turn)[0]  # usage, else token ids, else the text
        self._answer = turn  # sized by ``carried`` only (a single-turn job never asks)

    def carried(self, history: list[Message]) -> None:
        """The next request starts with ``history``: the last request's messages (counted by
        the server) plus the answer as the history carries it (without its reasoning unless
        kept), estimated from the answer's own tokens per byte with a 10% margin."""
        self._known_messages = len(history)
        answer = self._answer_tokens
        turn = self._answer
        answer_bytes = 0
        if turn is not None:
            answer_bytes = message_bytes(
                [
                    Message(
                        role="assistant",
                        content=turn.content,
                        reasoning_content=turn.reasoning,
                        tool_calls=turn.tool_calls,
                    )
                ]
            )
        if answer_bytes > 0 and history:
            kept = message_bytes(history[-1:])
            answer = min(answer, math.ceil(answer * kept / answer_bytes * 1.1))
        self._known_tokens = self._prompt_tokens + answer + PER_MESSAGE_TOKENS

    async def send(self, request: Request) -> tuple[list[Turn], Request]:
        """Send ``request``; a context-length answer to a computed or lowerable limit is retried
        with a smaller one (the returned request is the one that was answered)."""
        tries = 0
        while True:
            try:
                return await self.ep.client.chat(request), request
            except ContextLengthError:
                limit = request.max_tokens
                if not (self.shrinks and tries < SHRINK_TRIES and limit > MIN_LIMIT):
                    raise
            tries += 1
            self.clamped = self.explicit is not None
            request = request.with_max_tokens(max(MIN_LIMIT, limit // 4))
