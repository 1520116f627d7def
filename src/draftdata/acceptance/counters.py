"""Speculative-decoding figures: one record of counts, read from either engine's own shape.

``SpecCounts`` holds what a measurement adds up (verification steps = drafts, draft tokens
proposed, draft tokens accepted, accepted per draft position) and derives the two figures a
drafter is judged by: ``acceptance_rate`` = accepted / draft tokens, and ``mean_accept_length``
= 1 + accepted / drafts (the tokens one target step yields, the bonus token included).

Two sources, both as the engines report them:

- vLLM's Prometheus counters, global to the server (``vllm:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
  ``..._num_accepted_tokens_per_pos_total{position="i"}``): ``from_vllm_metrics``; a
  measurement subtracts two readings (``minus``).
- SGLang's per-request ``sglext.spec_tokens_details`` (``spec_verify_ct``,
  ``spec_num_proposed_drafts``, ``spec_num_correct_drafts``, and
  ``spec_correct_drafts_histogram``: steps that accepted exactly i drafts): ``from_sglang``.

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

_PREFIX = "vllm:spec_decode_"
_LINE = re.compile(r"^(vllm:spec_decode_[a-z_]+)(\{[^}]*\})?\s+([-+0-9.eE]+)\s*$")
_POSITION = re.compile(r'position="(\d+)"')


class SpecCounts(msgspec.Struct, kw_only=True):
    """Counts of speculative decoding over some requests (module docstring)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: list[float] = msgspec.field(default_factory=list)

    def plus(self, other: SpecCounts) -> SpecCounts:
        """The sum of two counts."""
        n = max(len(self.per_position), len(other.per_position))
        pos = [
            (self.per_position[i] if i < len(self.per_position) else 0.0)
            + (other.per_position[i] if i < len(other.per_position) else 0.0)
            for i in range(n)
        ]
        return SpecCounts(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            per_position=pos,
        )

    def minus(self, before: SpecCounts) -> SpecCounts:
        """What accrued since ``before`` (a reading of the same counters earlier)."""
        return self.plus(
            SpecCounts(
                drafts=-before.drafts,
                draft_tokens=-before.draft_tokens,
                accepted=-before.accepted,
                per_position=[-x for x in before.per_position],
            )
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens over proposed ones (None before any draft)."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_accept_length(self) -> float | None:
        """Tokens per verification step, the bonus token included (None before any step)."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    def position_rates(self) -> list[float]:
        """Per draft position i: the share of steps whose draft token i was accepted."""
        if self.drafts <= 0:
            return []
        return [x / self.drafts for x in self.per_position]


def from_vllm_metrics(text: str) -> SpecCounts | None:
    """vLLM's spec-decode counters from a ``/metrics`` text, summed over engines and models;
    None when the server exposes none (it does not decode speculatively)."""
    totals: dict[str, float] = {}
    positions: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIX):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("_per_pos_total"):
            pos = _POSITION.search(labels)
            if pos:
                i = int(pos.group(1))
                positions[i] = positions.get(i, 0.0) + value
            continue
        totals[name] = totals.get(name, 0.0) + value
    drafts = totals.get(_PREFIX + "num_drafts_total")
    if drafts is None:
        return None
    n = max(positions) + 1 if positions else 0
    return SpecCounts(
        drafts=drafts,
        draft_tokens=totals.get(_PREFIX + "num_draft_tokens_total", 0.0),
        accepted=totals.get(_PREFIX + "num_accepted_tokens_total", 0.0),
        per_position=[positions.get(i, 0.0) for i in range(n)],
    )


def _details(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict)]
    return []


def from_sglang(answer: dict[str, Any]) -> SpecCounts | None:
    """The counts of one SGLang chat answer (every choice), from ``sglext.spec_tokens_details``;
    None when the answer carries none."""
    ext = answer.get("sglext")
    details = _details(ext.get("spec_tokens_details")) if isinstance(ext, dict) else []
    if not details:
        return None
    total = SpecCounts()
    for d in details:
        hist = [float(x) for x in d.get("spec_correct_drafts_histogram") or []]
        # steps whose draft i was accepted = steps that accepted more than i drafts
        per_pos = [sum(hist[i + 1 :]) for i in range(max(len(hist) - 1, 0))]
        total = total.plus(
            SpecCounts(
                drafts=float(d.get("spec_verify_ct") or 0),
                draft_tokens=float(d.get("spec_num_proposed_drafts") or 0),
                accepted=float(d.get("spec_num_correct_drafts") or 0),
                per_position=per_pos,
            )
        )
    return total
