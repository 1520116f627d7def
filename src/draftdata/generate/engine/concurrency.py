"""The concurrency controller of one endpoint: how many sequences the dispatcher sends it at once.

With ``concurrency: auto`` the limit starts from the server's capacity plus a short queue (else
the configured default) and follows the server's waiting queue so that it stays short but
non-empty. The capacity (``fitted``) is what the server can really run at once: its KV cache
(``Capacity.kv_tokens``: SGLang's ``max_total_tokens``, vLLM's KV blocks) over the tokens one
sequence is expected to hold (prompt + output, a prior from the run's settings until answers
teach the mean), never above the server's running cap (SGLang's ``max_running_requests``,
fleet.yaml's ``max_running_requests``). A running cap alone is a scheduling limit, not room:
SGLang's automatic one is 2048 whatever its KV pool holds. A fixed ``concurrency: N`` is N.

It only holds the limit and what sets it; the endpoint (``endpoint.py``) says how many
sequences run, and the engine probes the server's load (``engine.py``).
"""

from __future__ import annotations

import math
from typing import Literal

from draftdata.shared.endpoints import Capacity, Load

_HELD_PRIOR_WEIGHT = 4.0  # pseudo-answers the prior of held tokens counts as
_REFIT = 0.1  # relative change of the fitted capacity that moves an auto limit


def queue_target(running: int) -> int:
    """How many requests we like to see waiting on a server running ``running`` (>= 2, ~5%)."""
    return max(2, math.ceil(0.05 * running))


class ConcurrencyController:
    """The sequence limit of one endpoint (module docstring)."""

    def __init__(self, concurrency: int | Literal["auto"], default_concurrency: int) -> None:
        self.auto = concurrency == "auto"
        self.limit = default_concurrency if concurrency == "auto" else int(concurrency)
        self.max_limit = max(self.limit * 8, 1024)
        self.running_cap: int | None = None  # the server's (else fleet.yaml's) running cap
        self.kv_tokens: int | None = None  # tokens the server's KV cache holds
        self.held_prior: float | None = None  # tokens a sequence is expected to hold, at first
        self._held_n = 0  # answered sequences, and the tokens they held (prompt + output)
        self._held_sum = 0.0
        self._fitted_at: int | None = None  # the fitted capacity the limit was last set from
        self.last_load: Load | None = None
        self._high_waits = 0  # probes in a row with a long server queue

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

    def held(self, seqs: int, tokens: int) -> None:
        """An answer of ``seqs`` sequences held ``tokens`` (prompt + output): learn the mean,
        and move an auto limit when the fitted capacity changed."""
        if tokens <= 0:
            return
        # n sequences of one request share its prompt (the server caches it once)
        self._held_n += max(1, seqs)
        self._held_sum += tokens
        self._refit()

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

    def set_capacity(self, cap: Capacity | None, fleet_max: int | None = None) -> None:
        """Take the server's running cap and KV cache (else the fleet file's running cap);
        with ``auto`` it sets the starting limit (``fitted``)."""
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

    def adapt(self, load: Load, inflight: int) -> int | None:
        """Follow the server's queue (auto only), with ``inflight`` sequences of ours running
        there; returns the new limit if it changed.

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
                and inflight >= self.limit - 1
                and (cap is None or load.running < cap)
            ):
                grown = self.limit + max(1, math.ceil(self.limit * 0.25))
                self.limit = min(self.max_limit, grown)
        return self.limit if self.limit != old else None

    def rate_limited(self, inflight: int) -> None:
        """A 429 with ``inflight`` sequences running there: back off a little (auto only)."""
        if self.auto:
            self.limit = max(1, min(self.limit, inflight) - max(1, self.limit // 10))
