"""Speculative decoding in the simulator: drafts proposed, tokens accepted, counted as engines do.

A server with ``SimConfig.spec_tokens`` K > 0 decodes speculatively: every verification step
proposes K draft tokens and accepts a prefix of them. Draft position i is accepted with
probability p given that positions 0..i-1 were (``accept_rate``, or ``accept_rate_for`` by the
prefix of the request's last user message, as ``mean_output_tokens_for`` picks lengths), so the
accepted count per step is a truncated geometric draw; the step emits the accepted drafts plus
the one token the target model adds (the "bonus" token). The expected figures are therefore::

    acceptance_rate    = accepted / draft tokens = (p + p^2 + ... + p^K) / K
    mean_accept_length = 1 + accepted / drafts   = 1 + p + p^2 + ... + p^K

(``expected``), which tests compare a measurement with. A choice is accounted when it is
served, with a generator seeded by the server's seed and the request, so a run is reproducible.

The counters are exposed the way each engine exposes them: the vLLM flavour in ``/metrics``
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position=}``,
global to the server); the SGLang flavour per request (``sglext.spec_tokens_details`` with
``spec_verify_ct``, ``spec_num_proposed_drafts``, ``spec_num_correct_drafts``,
``spec_accept_rate``, ``spec_accept_length`` and ``spec_correct_drafts_histogram``, when the
request asks with ``return_spec_tokens_details``) and in ``/server_info``
(``speculative_algorithm``, ``speculative_num_draft_tokens`` = K + 1, and
``internal_states[].avg_spec_accept_length``). Timing is not changed: a speculative server
here decodes at the speed of a plain one.
"""

from __future__ import annotations

import random

import msgspec


class SpecDraw(msgspec.Struct, kw_only=True):
    """The speculative figures of one served choice (SGLang's per-request details)."""

    verify_ct: int  # verification steps (vLLM: drafts)
    proposed: int  # draft tokens proposed (K per step)
    accepted: int  # draft tokens accepted
    histogram: list[int]  # steps that accepted exactly i drafts, i = 0..K

    def details(self, tokens: int) -> dict[str, object]:
        """SGLang's ``spec_tokens_details`` object for this choice of ``tokens`` output tokens."""
        return {
            "spec_accept_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "spec_accept_length": tokens / self.verify_ct if self.verify_ct else 0.0,
            "spec_num_correct_drafts": self.accepted,
            "spec_num_proposed_drafts": self.proposed,
            "spec_verify_ct": self.verify_ct,
            "spec_correct_drafts_histogram": list(self.histogram),
        }


class SpecCounters:
    """A server's running totals, as vLLM's spec-decode counters hold them."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.per_pos = [0] * k
        # recent (steps, emitted tokens) for SGLang's avg_spec_accept_length
        self._recent_steps = 0
        self._recent_tokens = 0

    def add(self, draw: SpecDraw, tokens: int) -> None:
        """Count one served choice."""
        self.drafts += draw.verify_ct
        self.draft_tokens += draw.proposed
        self.accepted += draw.accepted
        for accepted, steps in enumerate(draw.histogram):
            for pos in range(accepted):
                self.per_pos[pos] += steps
        self._recent_steps += draw.verify_ct
        self._recent_tokens += tokens

    def avg_accept_length(self) -> float:
        """Output tokens per verification step since the last call (SGLang's internal state)."""
        steps, tokens = self._recent_steps, self._recent_tokens
        self._recent_steps = self._recent_tokens = 0
        return tokens / steps if steps else 0.0


def draw(tokens: int, k: int, p: float, rng: random.Random) -> SpecDraw:
    """Decode ``tokens`` output tokens speculatively with K drafts per step (module docstring)."""
    histogram = [0] * (k + 1)
    done = steps = accepted = 0
    while done < tokens:
        a = 0
        while a < k and rng.random() < p:
            a += 1
        histogram[a] += 1
        accepted += a
        steps += 1
        done += a + 1
    return SpecDraw(verify_ct=steps, proposed=steps * k, accepted=accepted, histogram=histogram)


def expected(k: int, p: float) -> tuple[float, float]:
    """(acceptance rate, mean acceptance length) that K drafts at per-position rate p give."""
    s = sum(p**i for i in range(1, k + 1))
    return s / k, 1.0 + s
