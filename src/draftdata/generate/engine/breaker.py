"""The circuit breaker of one endpoint: whether it takes work, and why not.

``state``: ``up`` (takes work), ``down`` (circuit open or unreachable; probed until healthy),
``starting`` (never answered yet). ``threshold`` retryable failures in a row open the circuit;
a re-admission is half-open (one more failure opens it again) and on probation until a request
succeeds. ``fault`` says why an endpoint is out (for the log and the stop lines); ``refusal`` is
set while it refuses chat requests (401/403/404/405/501), refuses with one 400 what the other
endpoints answer (``opening.EndpointRefusals``) or gives impossible answers (its fault, never a
prompt's), and such an endpoint is tried again with one trial admission after a growing
wait (``REFUSAL_RETRY_S`` doubling up to ``REFUSAL_RETRY_MAX_S``). ``serving`` is what the
engine's unavailability watch counts (up, and not on probation after a re-admission).

It holds state only: the dispatcher decides when to open it (``dispatch.py``), the engine's
reviver when to close it (``engine.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

State = Literal["up", "down", "starting"]
REFUSAL_RETRY_S = 30.0  # first wait before a refusing endpoint gets a trial request
REFUSAL_RETRY_MAX_S = 300.0


class Breaker:
    """Whether one endpoint takes work (module docstring)."""

    def __init__(self, threshold: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold  # retryable failures in a row that open the circuit
        self.state: State = "starting"
        self.failures = 0  # retryable failures in a row
        self.downs = 0  # times it was taken out
        self.fault: str | None = None  # why it is out of service now
        self.refusal: str | None = None  # "HTTP 401: ..." while it refuses chat requests
        self.refused_how = "refuses chat requests"  # or "gives impossible answers"
        self.retry_refused_at = 0.0  # clock time of the next trial after a refusal
        self._refusal_wait = REFUSAL_RETRY_S
        self.probation = False  # re-admitted; not yet answered a request since
        self.recovered = False  # answered after refusing (the engine logs it once)
        self._clock = clock

    @property
    def accepting(self) -> bool:
        """Whether the dispatcher may send work here now."""
        return self.state == "up"

    @property
    def serving(self) -> bool:
        """Up and trusted: not out of service and not on trial after a re-admission."""
        return self.state == "up" and not self.probation

    def success(self) -> None:
        """A request answered: the failure count, the probation and any refusal end."""
        self.failures = 0
        self.probation = False
        if self.refusal is not None:
            self.refusal = None
            self.recovered = True
            self._refusal_wait = REFUSAL_RETRY_S

    def failure(self, *, retryable: bool) -> bool:
        """A request failed; True when the circuit should open now (a failure that is the
        request's own, not retryable, does not count)."""
        if not retryable:
            return False
        self.failures += 1
        return self.state == "up" and self.failures >= self.threshold

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
        self.failures = self.threshold - 1 if half_open else 0
