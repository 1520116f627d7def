"""Speculative decoding's figures: counts as the engines report them, and the files of an
acceptance measurement (``draftdata acceptance``; ``stats`` and ``report`` read them too).

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

**The files.** ``acceptance.json`` (format ``draftdata.acceptance/1``) holds, per domain, the
prompts measured, the output tokens, the speculative counts (drafts, draft tokens, accepted
tokens), the two figures, and the per-position acceptance where the engine gives it, plus the
total over every domain, the model, the servers and the settings of the measurement.

``suggested_mix.json`` (format ``draftdata.suggested_mix/1``) is a mix for ``prepare`` and
``merge --mix``, by this rule: a domain's weight is its *miss rate* 1 - acceptance_rate (the share
of draft tokens the target rejects: where the drafter has the most to learn); shares are the
weights normalised, and no domain gets less than ``min_share`` (default 0.05), so a domain where
the drafter is already good keeps some data and does not vanish from the next training set.
Floors are met by water-filling: a domain under its floor is set to it and the others share what
is left in proportion to their weights.

Pure: no I/O (``read_acceptance`` decodes bytes its caller read).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from draftdata.errors import InputError

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


FORMAT = "draftdata.acceptance/1"
MIX_FORMAT = "draftdata.suggested_mix/1"
ACCEPTANCE_FILE = "acceptance.json"
MIX_FILE = "suggested_mix.json"
DEFAULT_MIN_SHARE = 0.05
MIX_RULE = (
    "weight = 1 - acceptance_rate (the drafter's miss rate), shares = weights normalised, "
    "each at least min_share (water-filled)"
)


class DomainAcceptance(msgspec.Struct, kw_only=True):
    """The acceptance figures of one domain (or of the total)."""

    prompts: int = 0
    failed: int = 0
    output_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_rate: float | None = None
    mean_accept_length: float | None = None
    per_position: list[float] = msgspec.field(default_factory=list)

    @classmethod
    def of(cls, counts: SpecCounts, *, prompts: int, failed: int, output_tokens: int) -> Any:
        """The figures of ``counts`` over ``prompts`` answered prompts."""
        rate, length = counts.acceptance_rate, counts.mean_accept_length
        return cls(
            prompts=prompts,
            failed=failed,
            output_tokens=output_tokens,
            drafts=round(counts.drafts),
            draft_tokens=round(counts.draft_tokens),
            accepted_tokens=round(counts.accepted),
            acceptance_rate=round(rate, 6) if rate is not None else None,
            mean_accept_length=round(length, 6) if length is not None else None,
            per_position=[round(r, 6) for r in counts.position_rates()],
        )


class Acceptance(msgspec.Struct, kw_only=True):
    """One measurement (``acceptance.json``)."""

    format: str = FORMAT
    created: str
    model: str | None
    endpoints: list[dict[str, Any]]
    settings: dict[str, Any]
    by_domain: dict[str, DomainAcceptance]
    total: DomainAcceptance
    warnings: list[str] = msgspec.field(default_factory=list)


def read_acceptance(data: bytes, where: str) -> Acceptance:
    """Decode an ``acceptance.json``; InputError naming ``where`` when it is not one."""
    try:
        out = msgspec.json.decode(data, type=Acceptance)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(f"{where}: not a draftdata acceptance measurement ({exc})") from exc
    if out.format != FORMAT:
        raise InputError(f"{where}: format {out.format!r}; this draftdata reads {FORMAT}")
    return out


def suggest_mix(
    rates: dict[str, float | None], min_share: float = DEFAULT_MIN_SHARE
) -> dict[str, float]:
    """Shares by the module docstring's rule; domains without a rate are left out."""
    weights = {d: max(0.0, 1.0 - r) for d, r in rates.items() if r is not None}
    if not weights:
        return {}
    floor = min(max(min_share, 0.0), 1.0 / len(weights))
    if sum(weights.values()) <= 0:  # a perfect drafter everywhere: keep the domains even
        weights = dict.fromkeys(weights, 1.0)
    fixed: dict[str, float] = {}
    while True:
        free = {d: w for d, w in weights.items() if d not in fixed}
        left = 1.0 - sum(fixed.values())
        total = sum(free.values())
        shares = {d: (left * w / total if total > 0 else left / len(free)) for d, w in free.items()}
        low = {d for d, s in shares.items() if s < floor - 1e-12}
        if not low:
            break
        for d in low:
            fixed[d] = floor
    out = {**fixed, **shares}
    return {d: round(out[d], 4) for d in sorted(out)}


def mix_document(mix: dict[str, float], min_share: float, source: str) -> dict[str, Any]:
    """``suggested_mix.json``: the shares, the ``--mix`` argument that spells them, the rule."""
    return {
        "format": MIX_FORMAT,
        "mix": mix,
        "mix_arg": ",".join(f"{d}={s:g}" for d, s in mix.items()),
        "rule": MIX_RULE,
        "min_share": min_share,
        "from": source,
    }
