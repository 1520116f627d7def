"""One endpoint as the dispatcher sees it: state, slots, concurrency controller, counters.

An ``Endpoint`` wraps a chat client (``client.EndpointClient`` or anything with the same
``chat``/``close``/``token_ids_supported`` surface: the transport seam) with the policy state the
engine needs:

- ``state``: ``up`` (takes work), ``down`` (circuit open or unreachable; probed until healthy),
  ``starting`` (never answered yet);
- slots: ``limit`` sequences at once (a request with ``n`` choices holds ``n``), ``inflight``,
  and the estimated ``outstanding_tokens`` of what runs there (the dispatcher's tie-breaker);
- the concurrency controller (``adapt``): with ``concurrency: auto`` the limit starts from the
  server's capacity plus a short queue (else the configured default) and follows the server's
  waiting queue so that it stays short but non-empty. The capacity (``fitted``) is what the
  server can really run at once: its KV cache (``Capacity.kv_tokens``: SGLang's
  ``max_total_tokens``, vLLM's KV blocks) over the tokens one sequence is expected to hold
  (prompt + output, a prior from the run's settings until answers teach the mean), never above
  the server's running cap (SGLang's ``max_running_requests``, fleet.yaml's
  ``max_running_requests``). A running cap alone is a scheduling limit, not room: SGLang's
  automatic one is 2048 whatever its KV pool holds;
- the circuit breaker: ``breaker_failures`` retryable failures in a row open it;
- out of service: ``fault`` says why an endpoint is out (for the log and the stop lines);
  ``refusal`` is set while it refuses chat requests (401/403/404/405/501: its fault, never a
  prompt's), and such an endpoint is tried again with one trial admission after a growing wait
  (``REFUSAL_RETRY_S`` doubling up to ``REFUSAL_RETRY_MAX_S``); ``serving`` is what the engine's
  unavailability watch counts (up, and not on probation after a re-admission).

Probing the server over HTTP lives at the bottom (``check_alive``, ``load_of``); it uses
``draftdata.endpoints`` and never raises for an unreachable server. This module does not pick
endpoints or retry requests (``dispatch.py`` does).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Literal, Protocol

import aiohttp

from draftdata.endpoints import Capacity, Load, base_url, probe_load
from draftdata.records import Turn
from draftdata.redact import redact_url

State = Literal["up", "down", "starting"]
_EWMA = 0.1
_HELD_PRIOR_WEIGHT = 4.0  # pseudo-answers the prior of held tokens counts as
_REFIT = 0.1  # relative change of the fitted capacity that moves an auto limit
REFUSAL_RETRY_S = 30.0  # first wait before a refusing endpoint gets a trial request
REFUSAL_RETRY_MAX_S = 300.0


class ChatClient(Protocol):
    """What the engine needs from a transport (``client.EndpointClient`` is the real one)."""

    token_ids_supported: bool | None

    async def chat(self, body: dict[str, Any]) -> list[Turn]:
        """Send one chat-completions body; Turns or ``client.RequestError``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def queue_target(running: int) -> int:
    """How many requests we like to see waiting on a server running ``running`` (>= 2, ~5%)."""
    return max(2, math.ceil(0.05 * running))


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
        self.auto = concurrency == "auto"
        self.limit = default_concurrency if concurrency == "auto" else int(concurrency)
        self.max_limit = max(self.limit * 8, 1024)
        self.breaker_failures = breaker_failures
        self.state: State = "starting"
        self.capacity: Capacity | None = None
        self.running_cap: int | None = None  # the server's (else fleet.yaml's) running cap
        self.kv_tokens: int | None = None  # tokens the server's KV cache holds
        self.held_prior: float | None = None  # tokens a sequence is expected to hold, at first
        self._held_n = 0  # answered sequences, and the tokens they held (prompt + output)
        self._held_sum = 0.0
        self._fitted_at: int | None = None  # the fitted capacity the limit was last set from
        self.model: str | None = None
        self.context_length: int | None = None  # tokens (server report, else the fleet file)
        self.tokens_per_byte: float | None = None  # largest prompt tokens per byte seen here
        self.server_n: bool = True  # False once a request with n > 1 got fewer choices back
        self.inflight = 0  # sequences running here
        self.outstanding_tokens = 0
        self.consecutive_failures = 0
        self.last_load: Load | None = None
        self._high_waits = 0  # probes in a row with a long server queue
        # counters for progress and the summary
        self.requests = 0
        self.completed = 0  # completions committed from this endpoint (winning copies)
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.errors: Counter[str] = Counter()
        self.hedges_won = 0
        self.downs = 0
        self.served = 0  # requests answered by this command
        self.fault: str | None = None  # why it is out of service now
        self.refusal: str | None = None  # "HTTP 401: ..." while it refuses chat requests
        self.refused_how = "refuses chat requests"  # or "gives impossible answers"
        self.retry_refused_at = 0.0  # clock time of the next trial after a refusal
        self._refusal_wait = REFUSAL_RETRY_S
        self.probation = False  # re-admitted; not yet answered a request since
        self.recovered = False  # answered after refusing (the engine logs it once)
        self.seq_rate: float | None = None  # EWMA output tokens/s of one sequence here
        self.latency: float | None = None  # EWMA seconds per request
        self._clock = clock
        self._since = clock()
        self.token_log: deque[tuple[float, int]] = deque()  # (time, output tokens) window
        # called with (answered at, latency s, output tokens) for every answered request: the
        # pilot measures the saturated decode rate with it (pilot.py); None: nobody listens
        self.on_answer: Callable[[float, float, int], None] | None = None

    # -- slots --------------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """Whether the dispatcher may send work here now."""
        return self.state == "up"

    @property
    def serving(self) -> bool:
        """Up and trusted: not out of service and not on trial after a re-admission."""
        return self.state == "up" and not self.probation

    @property
    def free(self) -> int:
        """Free sequence slots (may be negative right after the limit shrank)."""
        return self.limit - self.inflight

    def acquire(self, seqs: int, tokens: int) -> None:
        """Account a request of ``seqs`` sequences and ``tokens`` estimated tokens."""
        self.inflight += seqs
        self.outstanding_tokens += tokens
        self.requests += 1

    def release(self, seqs: int, tokens: int) -> None:
        """Undo ``acquire`` when the request ends, whatever the outcome."""
        self.inflight -= seqs
        self.outstanding_tokens -= tokens

    # -- outcomes -----------------------------------------------------------------------------

    def record_success(
        self, output_tokens: int, prompt_tokens: int, *, latency: float = 0.0, seqs: int = 1
    ) -> None:
        """A request answered: reset the breaker, count tokens, learn the decode speed."""
        self.consecutive_failures = 0
        self.served += 1
        self.probation = False
        if self.refusal is not None:
            self.refusal = None
            self.recovered = True
            self._refusal_wait = REFUSAL_RETRY_S
        self.output_tokens += output_tokens
        self.prompt_tokens += prompt_tokens
        now = self._clock()
        self.token_log.append((now, output_tokens))
        if self.on_answer is not None:
            self.on_answer(now, latency, output_tokens)
        if output_tokens + prompt_tokens > 0:
            # n sequences of one request share its prompt (the server caches it once)
            self._held_n += max(1, seqs)
            self._held_sum += prompt_tokens + output_tokens
            self._refit()
        if latency > 0:
            rate = output_tokens / max(1, seqs) / latency
            a = _EWMA
            self.seq_rate = rate if self.seq_rate is None else (1 - a) * self.seq_rate + a * rate
            self.latency = latency if self.latency is None else (1 - a) * self.latency + a * latency

    def record_failure(self, error_class: str, *, retryable: bool) -> bool:
        """Count a failed request; True when the breaker should open now."""
        self.errors[error_class] += 1
        if not retryable:
            return False
        self.consecutive_failures += 1
        return self.state == "up" and self.consecutive_failures >= self.breaker_failures

    def mark_down(self, why: str | None = None) -> None:
        """Take the endpoint out (breaker open, unreachable, refusing); ``why`` for the log."""
        if self.state != "down":
            self.downs += 1
        self.state = "down"
        if why:
            self.fault = why

    def mark_refused(self, refusal: str, what: str = "refuses chat requests") -> bool:
        """It refused a chat request (``refusal``: "HTTP 401: ...") or, as ``what`` says, gave
        an impossible answer: out of service, with a trial after a growing wait. True when
        this is news (not a failed trial)."""
        news = self.refusal is None
        if not news:  # a trial was refused too: wait longer before the next
            self._refusal_wait = min(REFUSAL_RETRY_MAX_S, self._refusal_wait * 2)
        self.refusal = refusal
        self.refused_how = what
        self.retry_refused_at = self._clock() + self._refusal_wait
        self.mark_down(f"{what} ({refusal})")
        return news

    def mark_up(self, *, half_open: bool) -> None:
        """Admit the endpoint; ``half_open``: one more failure takes it out again, and it is
        on probation (not counted as serving) until a request succeeds."""
        self.state = "up"
        self.fault = None
        self.probation = half_open or self.refusal is not None
        self.consecutive_failures = self.breaker_failures - 1 if half_open else 0

    def tokens_per_s(self, window: float) -> float:
        """Output tokens per second over the last ``window`` seconds."""
        now = self._clock()
        while self.token_log and self.token_log[0][0] < now - window:
            self.token_log.popleft()
        span = min(window, now - self._since)
        return sum(n for _, n in self.token_log) / span if span > 0 else 0.0

    # -- concurrency --------------------------------------------------------------------------

    def held_tokens(self) -> float | None:
        """Tokens one sequence is expected to hold in the server's KV cache (its prompt and
        output): the mean over answers so far, shrunk toward ``held_prior`` while few."""
        prior = self.held_prior
        if prior is None or prior <= 0:
            return self._held_sum / self._held_n if self._held_n else None
        w = _HELD_PRIOR_WEIGHT
        return (w * prior + self._held_sum) / (w + self._held_n)

    def fitted(self) -> int | None:
        """How many sequences the server can run at once: its KV cache over the tokens one is
        expected to hold, never above its running cap; None when it tells neither."""
        held = self.held_tokens()
        kv_fit = max(1, int(self.kv_tokens // held)) if self.kv_tokens and held else None
        known = [c for c in (self.running_cap, kv_fit) if c]
        return min(known) if known else None

    def _apply_fit(self, known: int) -> None:
        # the server cannot run more than that: a short queue on top, never a long one; room
        # to grow a little covers requests in transit (a busy client)
        self.limit = known + queue_target(known)
        self.max_limit = known + max(2 * queue_target(known), known // 4)
        self._fitted_at = known

    def _refit(self) -> None:
        """Move an auto limit when what the answers taught changed the fitted capacity."""
        if not self.auto:
            return
        known, at = self.fitted(), self._fitted_at
        if known is not None and (at is None or abs(known - at) >= max(1, _REFIT * at)):
            self._apply_fit(known)

    def set_capacity(
        self, cap: Capacity | None, fleet_max: int | None = None, fleet_context: int | None = None
    ) -> None:
        """Take the server's reported capacity and context length (else the fleet file's);
        with ``auto`` it sets the starting limit (``fitted``)."""
        self.capacity = cap
        if cap is not None and cap.model:
            self.model = cap.model
        context = (cap.context_length if cap is not None else None) or fleet_context
        if context:
            self.context_length = context
        self.running_cap = (cap.max_running if cap is not None else None) or (
            fleet_max or self.running_cap
        )
        if cap is not None and cap.kv_tokens:
            self.kv_tokens = cap.kv_tokens
        if not self.auto:
            return
        known = self.fitted()
        if known:
            self._apply_fit(known)

    def adapt(self, load: Load) -> int | None:
        """Follow the server's queue (auto only); returns the new limit if it changed.

        Shrink (by at most 10% a probe, never below running + target) only when more than twice
        the target wait on two probes in a row: a queue is harmless for throughput, a starved
        server is not. Grow by 25% when nothing waits although we fill our limit and the server
        runs below its reported capacity (requests in transit, or a capacity it did not
        report)."""
        self.last_load = load
        if not self.auto:
            return None
        old = self.limit
        target = queue_target(load.running)
        if load.waiting > 2 * target:
            self._high_waits += 1
            if self._high_waits >= 2:
                step = max(1, math.ceil(self.limit * 0.1))
                self.limit = min(self.limit, max(1, load.running + target, self.limit - step))
        else:
            self._high_waits = 0
            cap = self.fitted()
            if (
                load.waiting == 0
                and self.inflight >= self.limit - 1
                and (cap is None or load.running < cap)
            ):
                grown = self.limit + max(1, math.ceil(self.limit * 0.25))
                self.limit = min(self.max_limit, grown)
        return self.limit if self.limit != old else None

    def rate_limited(self) -> None:
        """A 429: back off a little (auto only)."""
        if self.auto:
            self.limit = max(1, min(self.limit, self.inflight) - max(1, self.limit // 10))

    def row(self, window: float) -> dict[str, Any]:
        """The endpoint's figures for progress lines and metrics snapshots."""
        return {
            "url": self.url,
            "state": self.state,
            "inflight": self.inflight,
            "limit": self.limit,
            "capacity": self.fitted(),
            "engine": self.capacity.engine if self.capacity else None,
            "requests": self.requests,
            "completed": self.completed,
            "output_tokens": self.output_tokens,
            "tokens_per_s": round(self.tokens_per_s(window), 1),
            "errors": dict(self.errors),
            "waiting": self.last_load.waiting if self.last_load else None,
            "fault": self.fault,
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
