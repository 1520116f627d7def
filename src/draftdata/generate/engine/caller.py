"""The dispatcher's client: one attempt of a job (a ``Copy``) as HTTP requests, turn by turn.

The engine's layers, top down, each a reader can stop at (as httpx's ``Client.send`` stacks
``_send_handling_auth`` over ``_send_handling_redirects`` over one transport call):

    Dispatcher._attempt        decides: place, retry, fail, take an endpoint out (dispatch.py)
    Caller.call                one attempt: a request per remaining turn of the conversation
    OutputLimit.send           one request, retried with a smaller limit on a context-length
                               answer to a limit it computed (limits.py)
    EndpointClient.chat        one HTTP request; raw failures -> ServerError leaves (client.py)

``call`` returns an ``Answer`` (the turns of each sample, the body that was answered, why the
conversation stopped early) or raises the ``ServerError`` leaf the client raised. A later turn
that does not fit the context (no room left by the estimate, or the server's
``ContextLengthError``) is not an error: the conversation stops with ``context``, keeping the
turns that fit. Each answered request teaches the endpoint (``Endpoint.record_success``: its
breaker, rates and fitted capacity).

It decides nothing about retries, endpoints or the queue; it counts what it sent
(``requests_ok``, ``clamped``) for the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from draftdata.errors import ContextLengthError, FatalRequestError
from draftdata.generate.answers.thinking import joined
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.client import request_body
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.limits import MIN_LIMIT, OutputLimit
from draftdata.generate.engine.request import Request
from draftdata.generate.engine.work import Copy, Job
from draftdata.records import Message, Turn
from draftdata.shared.conversation import STOP_CONTEXT, turn_message
from draftdata.shared.tokens import turn_tokens


@dataclass(frozen=True, slots=True)
class Answer:
    """What one attempt produced: the turns of each sample (one list per sample answered), the
    body of the last request that was answered, its messages left empty (the record's exact
    parameters, ``_parameters``), why the
    conversation stopped before its last request (None when it did not), and the servers'
    default thinking mode every turn was written in (None: unknown, ``thinking.py``)."""

    per_sample: list[list[Turn]]
    body: dict[str, Any]
    stop: str | None = None
    server_thinking: bool | None = None


def _parameters(request: Request | None) -> dict[str, Any]:
    """The body of ``request`` as the record keeps it: its messages left empty (the record
    holds the prompt's own; ``work.completions`` drops the key), the rest as sent."""
    if request is None:
        return {}
    return request_body(msgspec.structs.replace(request, messages=[]))


class Caller:
    """Runs one attempt of a job on its endpoint (module docstring)."""

    def __init__(
        self, config: GenerateConfig, *, model: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg = config
        self.model = model  # the run's model, for an endpoint that reports none
        self.clock = clock
        self.requests_ok = 0  # requests answered
        self.clamped = 0  # ... sent with less than max_tokens, to fit the context

    async def call(self, copy: Copy) -> Answer:
        """The copy's requests, one per remaining turn (``conversation.TurnPlan``)."""
        job, ep = copy.job, copy.endpoint
        if not len(job.plan):
            raise FatalRequestError("the prompt has no turn to answer")
        turns = list(job.turns)
        if self.cfg.token_ids == "off" or ep.client.token_ids_supported is False:
            await ep.thinking.first()  # answers without ids need the mode (thinking.py)
        mark = ep.thinking.mark()  # the mode these requests are written in

        def answer(
            per_sample: list[list[Turn]], request: Request | None, stop: str | None = None
        ) -> Answer:
            mode = ep.thinking.since(mark)
            if job.turns:  # turns an earlier attempt wrote, maybe on another endpoint
                mode = joined(mode, job.turns_thinking)
            return Answer(per_sample, _parameters(request), stop, mode)

        keep = self.cfg.keep_reasoning_history
        answered: Request | None = None  # the last answered request
        request: Request | None = None
        strict = self.cfg.strict_limit
        limit = OutputLimit(job.max_tokens, ep, job.prompt.tools, strict=strict)
        for t in range(len(turns), len(job.plan)):
            messages = job.plan.context(t, turns, keep_reasoning=keep)
            request = self._request(job, ep, messages, limit.limit(messages))
            room = limit.room(messages) if turns and not strict else None
            if room is not None and room < MIN_LIMIT:  # the history alone fills the context
                return answer([turns], answered or request, STOP_CONTEXT)
            sent = copy.sent = self.clock()
            try:
                got, request = await limit.send(request)
            except ContextLengthError:
                if turns:
                    return answer([turns], answered or request, STOP_CONTEXT)
                raise
            answered = request
            self._answered(copy, got, self.clock() - sent, limit.clamped)
            limit.answered(messages, got[0])
            if not job.multi_turn:
                return answer([[x] for x in got], request)
            turns.append(got[0])
            stop = job.plan.stop_reason(t, got[0])
            if stop is not None:  # the turn broke the conversation: keep what we have
                return answer([turns], request, stop)
            limit.carried([*messages, turn_message(got[0], keep_reasoning=keep)])
            if job.copies == [copy]:  # the only copy: checkpoint for a retry
                mode = ep.thinking.since(mark)
                job.turns_thinking = joined(mode, job.turns_thinking) if job.turns else mode
                job.turns = list(turns)
        return answer([turns], request)

    async def ask_again(
        self, job: Job, ep: Endpoint, messages: list[Message] | None = None
    ) -> None:
        """Send a request of ``job`` to ``ep`` again (``messages``: its context, by default its
        first request's), its output limited to what the sampling allows at least (a token,
        or the extra body's ``min_tokens``), and drop the answer: the canary of
        ``recheck.py`` (was an answered request refused now?). Raises the ``ServerError``
        leaf the client raised."""
        if messages is None:
            messages = job.plan.context(0, [], keep_reasoning=self.cfg.keep_reasoning_history)
        least = self.cfg.extra_body.get("min_tokens")
        limit = max(1, least if isinstance(least, int) else 0)
        await ep.client.chat(self._request(job, ep, messages, limit))

    def _request(self, job: Job, ep: Endpoint, messages: list[Message], max_tokens: int) -> Request:
        """The request of ``job`` on ``ep`` with ``messages`` and output limit ``max_tokens``
        (an attempt's, turn by turn, and ``ask_again``'s)."""
        return Request(
            messages=messages,
            tools=job.prompt.tools,
            model=self.cfg.model or ep.model or self.model,
            max_tokens=max_tokens,
            sampling=job.request_sampling,
            reasoning=job.reasoning,
            n=len(job.samples),
            token_ids=self.cfg.token_ids != "off",
            extra_body=self.cfg.extra_body,
        )

    def _answered(self, copy: Copy, got: list[Turn], latency: float, clamped: bool) -> None:
        """Count one answered request and teach its endpoint."""
        self.requests_ok += 1
        self.clamped += clamped
        output = sum(turn_tokens(x)[0] for x in got)  # usage, else ids, else the text
        copy.endpoint.record_success(
            output, got[0].usage.prompt_tokens, latency=latency, seqs=len(got)
        )
