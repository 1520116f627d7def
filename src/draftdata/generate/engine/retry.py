"""The dispatcher's retry policy: what becomes of a job whose attempt failed, by the error's type.

The client maps every raw failure to a leaf of ``draftdata.errors`` (``client.py``); this
policy maps each type to one of three fates, and nothing else:

- ``RetryableServerError`` (429, 5xx, timeouts, resets, malformed bodies): ``Retry`` after a
  jittered exponential backoff (``backoff_base`` doubling per attempt, times 0.5-1.5, at most
  ``backoff_max``; at least the server's Retry-After within that), steered away from the
  endpoint it failed on; after ``max_attempts`` attempts, ``Fail`` with ``exhausted_retries``.
- ``FatalRequestError`` (context length, an invalid request): ``Fail`` with its ``reason`` at
  once: no other attempt would be answered otherwise. (For an invalid request the dispatcher
  first asks ``opening.EndpointRefusals`` whose fault it is: while another serving endpoint
  has not refused the job, it is asked there instead, uncharged.)
- ``EndpointFaultError`` (a refusal, an impossible answer): ``MoveOn``: the endpoint's fault,
  not the prompt's; the job is requeued at once elsewhere and the attempt is not counted.

Anything else is not a server's answer at all but a bug (the way httpx's
``map_httpcore_exceptions`` maps the exceptions it knows and re-raises the rest): it has no
fate here, and the dispatcher stops the run with it, its traceback intact (``dispatch.py``).

What the endpoint learns from a failure (its breaker, a health check) is the dispatcher's; this
module only decides the job's fate and holds no state but its random source.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from draftdata.errors import EndpointFaultError, FatalRequestError, ServerError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.work import Job


@dataclass(frozen=True, slots=True)
class Retry:
    """Try the job again after ``delay`` seconds, on another endpoint if one can take it."""

    delay: float


@dataclass(frozen=True, slots=True)
class Fail:
    """The job's samples become Failure records of ``reason``."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class MoveOn:
    """The endpoint's fault: requeue the job at once elsewhere; the attempt does not count."""


Fate = Retry | Fail | MoveOn


class RetryPolicy:
    """The fate of a failed attempt (module docstring)."""

    def __init__(self, config: GenerateConfig, rng: random.Random) -> None:
        self.cfg = config
        self.rng = rng

    def fate(self, job: Job, err: ServerError) -> Fate:
        """What becomes of ``job`` after ``err`` ended its attempt (``job.attempts`` counts
        that attempt)."""
        if isinstance(err, EndpointFaultError):
            return MoveOn()
        if isinstance(err, FatalRequestError):
            return Fail(err.reason, err.message)
        # RetryableServerError and its leaves (a bare ServerError is taken as one)
        if job.attempts >= self.cfg.max_attempts:
            return Fail("exhausted_retries", f"after {job.attempts} attempts: {err}")
        return Retry(self.backoff(job.attempts, err.retry_after))

    def backoff(self, attempts: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempts + 1`` (``backoff``)."""
        return backoff(attempts, retry_after, self.cfg, self.rng)


def backoff(
    attempts: int, retry_after: float | None, config: GenerateConfig, rng: random.Random
) -> float:
    """Seconds to wait before attempt ``attempts + 1``: jittered, exponential from
    ``backoff_base``, at least the server's Retry-After (within ``backoff_max``). Generate's
    retries and acceptance's wait the same."""
    delay = min(config.backoff_max, config.backoff_base * 2 ** (attempts - 1))
    delay *= 0.5 + rng.random()
    if retry_after is not None:
        delay = max(delay, min(retry_after, config.backoff_max))
    return float(delay)
