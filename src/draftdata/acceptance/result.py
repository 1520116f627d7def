"""What an acceptance measurement writes: ``acceptance.json`` and ``suggested_mix.json``.

``acceptance.json`` (format ``draftdata.acceptance/1``) holds, per domain, the prompts measured,
the output tokens, the speculative counts (drafts, draft tokens, accepted tokens), the two
figures a drafter is judged by (``acceptance_rate``, ``mean_accept_length``) and the
per-position acceptance where the engine gives it, plus the total over every domain, the model,
the servers and the settings of the measurement.

``suggested_mix.json`` (format ``draftdata.suggested_mix/1``) is a mix for ``prepare`` and
``merge --mix``, by this rule: a domain's weight is its *miss rate* 1 - acceptance_rate (the share
of draft tokens the target rejects: where the drafter has the most to learn); shares are the
weights normalised, and no domain gets less than ``min_share`` (default 0.05), so a domain where
the drafter is already good keeps some data and does not vanish from the next training set.
Floors are met by water-filling: a domain under its floor is set to it and the others share what
is left in proportion to their weights.
"""

from __future__ import annotations

from typing import Any

import msgspec

from draftdata.acceptance.counters import SpecCounts
from draftdata.errors import InputError

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
