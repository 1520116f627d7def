"""One endpoint as the dispatcher sees it: the server, and four small parts it holds.

An ``Endpoint`` wraps a chat client (``client.EndpointClient`` or anything with the same
``chat``/``close``/``token_ids_supported`` surface: the transport seam) and what the server is
(its model, context length, capacity, tokens per byte, whether it honours ``n``). Its state is
in four parts, each with one job:

- ``slots`` (``Slots``, below): the sequences running there now (a request with ``n`` choices
  holds ``n``) and their estimated ``outstanding_tokens`` (the dispatcher's tie-breaker);
- ``concurrency`` (``concurrency.ConcurrencyController``): how many sequences it may run, fitted
  to the server's KV cache and following its waiting queue;
- ``breaker`` (``breaker.Breaker``): up, down or starting, the failures in a row that open it,
  a refusal and its trial, why it is out;
- ``meter`` (``Meter``, below): what it has done (requests, completions, tokens, errors, hedges
  won) and its measured speed (per-sequence decode rate, latency, output tokens per second).

The endpoint's own methods are the events that touch several parts (``acquire``/``release``
a request, ``record_success``/``record_failure``, ``set_capacity``) and the figures of a
progress row. Probing the server over HTTP lives at the bottom (``check_alive``, ``load_of``);
it uses ``draftdata.shared.endpoints`` and never raises for an unreachable server. This module does
not pick endpoints or retry requests (``dispatch.py`` does).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Literal, Protocol

import aiohttp

from draftdata.generate.answers.thinking import ThinkingMode
from draftdata.generate.engine.breaker import Breaker
from draftdata.generate.engine.concurrency import ConcurrencyController
from draftdata.generate.engine.request import Request
from draftdata.records import Turn
from draftdata.shared.endpoints import Capacity, Load, base_url, probe_load
from draftdata.support.redact import redact_url

_EWMA = 0.1
_ANSWERS_KEPT = 8192  # answers an endpoint's meter keeps (the rate window, the stall rule)


class ChatClient(Protocol):
    """What the engine needs from a transport (``client.EndpointClient`` is the real one)."""

    token_ids_supported: bool | None

    async def chat(self, request: Request) -> list[Turn]:
        """Send one chat request; Turns or a ``draftdata.errors.ServerError`` leaf."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class Slots:
    """The sequences running on one endpoint now, and their estimated tokens."""

    __slots__ = ("inflight", "outstanding_tokens")

    def __init__(self) -> None:
        self.inflight = 0  # sequences running here
        self.outstanding_tokens = 0

    def acquire(self, seqs: int, tokens: int) -> None:
        """Account a request of ``seqs`` sequences and ``tokens`` estimated tokens."""
        self.inflight += seqs
        self.outstanding_tokens += tokens

    def release(self, seqs: int, tokens: int) -> None:
        """Undo ``acquire`` when the request ends, whatever the outcome."""
        self.inflight -= seqs
        self.outstanding_tokens -= tokens


class Meter:
    """What one endpoint has done in this command, and how fast it decodes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.requests = 0  # sent
        self.served = 0  # answered
        self.completed = 0  # completions committed from this endpoint (winning copies)
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.errors: Counter[str] = Counter()  # failure reason -> count
        self.hedges_won = 0
        # output tokens/s of one sequence here: EWMA tokens per sequence over EWMA latency, so
        # that a short answer (its latency mostly prefill and queueing) moves it little
        self.seq_rate: float | None = None
        self.latency: float | None = None  # EWMA seconds per request
        self._tokens: float | None = None  # EWMA output tokens per sequence
        # (time, output tokens) of the newest answers, newest last: the rate over a window,
        # and the answers since a time (the stall rule, dispatch.py)
        self.token_log: deque[tuple[float, int]] = deque(maxlen=_ANSWERS_KEPT)
        self._clock = clock
        self._since = clock()

    def answered(
        self, now: float, output_tokens: int, prompt_tokens: int, latency: float, seqs: int
    ) -> None:
        """Count one answered request and learn the per-sequence decode speed from it."""
        self.served += 1
        self.output_tokens += output_tokens
        self.prompt_tokens += prompt_tokens
        self.token_log.append((now, output_tokens))
        if latency > 0:
            per_seq = output_tokens / max(1, seqs)
            a = _EWMA
            if self._tokens is None or self.latency is None:
                self._tokens, self.latency = per_seq, latency
            else:
                self._tokens = (1 - a) * self._tokens + a * per_seq
                self.latency = (1 - a) * self.latency + a * latency
            self.seq_rate = self._tokens / self.latency

    def answers_since(self, t: float) -> int:
        """Requests answered at ``t`` or later (of the last ``_ANSWERS_KEPT``)."""
        n = 0
        for at, _ in reversed(self.token_log):
            if at < t:
                break
            n += 1
        return n

    @property
    def last_answer(self) -> float | None:
        """The clock time of the newest answer (None: none yet)."""
        return self.token_log[-1][0] if self.token_log else None

    def tokens_per_s(self, window: float) -> float:
        """Output tokens per second over the last ``window`` seconds."""
        now = self._clock()
        total = 0
        for at, n in reversed(self.token_log):
            if at < now - window:
                break
            total += n
        span = min(window, now - self._since)
        return total / span if span > 0 else 0.0


class Endpoint:
    """Dispatch state of one server (single event loop; no locking)."""

    def __init__(
        self,
        url: str,
        client: ChatClient,
        *,
        index: int,
        concurrency: int | Literal["auto"],
        default_concurrency: int,
        breaker_failures: int,
        clock: Any = time.monotonic,
        redact: Callable[[str], str] = str,
    ) -> None:
        self.address = base_url(url)  # what requests and probes go to (may hold a password)
        self.url = redact_url(self.address)  # what is shown and recorded: never a password
        self.redact = redact  # any text about this endpoint passes through it before it is kept
        self.name = self.url.split("://", 1)[-1]
        self.index = index
        self.client = client
        # what the server is
        self.capacity: Capacity | None = None
        self.model: str | None = None
        self.context_length: int | None = None  # tokens (server report, else the fleet file)
        self.tokens_per_byte: float | None = None  # largest prompt tokens per byte seen here
        self.server_n: bool = True  # False once a request with n > 1 got fewer choices back
        # its template's default thinking mode, as last probed (thinking.py; engine.py probes)
        self.thinking = ThinkingMode()
        # its parts
        self.slots = Slots()
        self.concurrency = ConcurrencyController(concurrency, default_concurrency)
        self.breaker = Breaker(breaker_failures, clock=clock)
        self.meter = Meter(clock)
        self._clock = clock
        # called with (answered at, latency s, output tokens) for every answered request: the
        # pilot measures the saturated decode rate with it (pilot.py); None: nobody listens
        self.on_answer: Callable[[float, float, int], None] | None = None

    @property
    def accepting(self) -> bool:
        """Whether the dispatcher may send work here now."""
        return self.breaker.state == "up"

    @property
    def free(self) -> int:
        """Free sequence slots (may be negative right after the limit shrank)."""
        return self.concurrency.limit - self.slots.inflight

    def acquire(self, seqs: int, tokens: int) -> None:
        """A request of ``seqs`` sequences and ``tokens`` estimated tokens starts here."""
        self.slots.acquire(seqs, tokens)
        self.meter.requests += 1

    def release(self, seqs: int, tokens: int) -> None:
        """Undo ``acquire`` when the request ends, whatever the outcome."""
        self.slots.release(seqs, tokens)

    def record_success(
        self, output_tokens: int, prompt_tokens: int, *, latency: float = 0.0, seqs: int = 1
    ) -> None:
        """A request answered: reset the breaker, count tokens, learn the decode speed and
        what a sequence holds."""
        self.breaker.success()
        now = self._clock()
        self.meter.answered(now, output_tokens, prompt_tokens, latency, seqs)
        if self.on_answer is not None:
            self.on_answer(now, latency, output_tokens)
        self.concurrency.held(seqs, prompt_tokens + output_tokens)

    def record_failure(self, reason: str, *, retryable: bool) -> bool:
        """Count a failed request; True when the breaker should open now."""
        self.meter.errors[reason] += 1
        return self.breaker.failure(retryable=retryable)

    def rate_limited(self) -> None:
        """A 429: the controller backs off a little (auto only)."""
        self.concurrency.rate_limited(self.slots.inflight)

    def adapt(self, load: Load) -> int | None:
        """The server's load now: the controller follows its queue (``adapt``)."""
        return self.concurrency.adapt(load, self.slots.inflight)

    def set_capacity(
        self, cap: Capacity | None, fleet_max: int | None = None, fleet_context: int | None = None
    ) -> None:
        """Take the server's reported capacity and context length (else the fleet file's);
        with ``auto`` the controller sets the starting limit from it."""
        self.capacity = cap
        if cap is not None and cap.model:
            self.model = cap.model
        context = (cap.context_length if cap is not None else None) or fleet_context
        if context:
            self.context_length = context
        self.concurrency.set_capacity(cap, fleet_max)

    def row(self, window: float) -> dict[str, Any]:
        """The endpoint's figures for progress lines and metrics snapshots."""
        m, load = self.meter, self.concurrency.last_load
        return {
            "url": self.url,
            "state": self.breaker.state,
            "inflight": self.slots.inflight,
            "limit": self.concurrency.limit,
            "capacity": self.concurrency.fitted(),
            "engine": self.capacity.engine if self.capacity else None,
            "requests": m.requests,
            "completed": m.completed,
            "output_tokens": m.output_tokens,
            "tokens_per_s": round(m.tokens_per_s(window), 1),
            "errors": dict(m.errors),
            "waiting": load.waiting if load else None,
            "fault": self.breaker.fault,
        }


# -- probing ------------------------------------------------------------------------------------


async def check_alive(session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
    """Whether the server answers: ``/health`` 200, or (no /health route) ``/v1/models`` 200."""
    root = base_url(url)
    for path in ("/health", "/v1/models"):
        try:
            async with session.get(root + path, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                await r.read()
                if r.status == 200:
                    return True
                if r.status != 404:
                    return False
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
    return False


async def load_of(session: aiohttp.ClientSession, ep: Endpoint, timeout: float) -> Load | None:
    """The server's running/waiting counts now (None when it cannot tell)."""
    engine = ep.capacity.engine if ep.capacity else "unknown"
    return await probe_load(session, ep.address, engine, timeout=timeout)
