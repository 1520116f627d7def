"""The expected answer length per domain that a mix in tokens plans with.

A drafter learns from loss tokens, and answers differ ~10x in length between domains, so a
mix in tokens needs each domain's expected tokens per new prompt before anything is generated:

- from a pilot's forecast (``--lengths RUN/forecast.json``, or the run folder: its newest
  forecast): ``by_domain.<d>.output_tokens_per_prompt`` (the run's expected output tokens per
  prompt of that domain, failed prompts counted as none), else its ``mean_output_tokens``;
- else, with ``--mix-by tokens``, measured from the existing set's answers (the mean loss tokens
  of its answered rows per domain, ``draftdata.shared.tokens``' estimate).

A domain the source has no figure for takes the mean over the others (weighted by their
prompts or rows), and says so. ``--mix-by auto`` (the default) plans in tokens when
``--lengths`` is given and in rows otherwise, as prepare always did. The existing set's tokens
are its answers' measured loss tokens where it has answers, else its rows times the lengths.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from draftdata.errors import ConfigError
from draftdata.prepare.config import PrepareConfig
from draftdata.prepare.reference import Existing
from draftdata.shared.tokens import ESTIMATE_ERROR
from draftdata.store.forecast import read_forecast


class Lengths(msgspec.Struct, kw_only=True, frozen=True):
    """Expected tokens of one new prompt's answer per domain, and where they come from."""

    per_domain: dict[str, float]
    source: str  # the forecast's URL, or "existing answers"
    existing_tokens: dict[str, float]  # the existing set's tokens per domain
    existing_measured: bool  # from its answers (else its rows times the lengths)
    notes: list[str] = msgspec.field(default_factory=list)


def _from_forecast(location: str) -> tuple[dict[str, float], dict[str, float], str]:
    url, data = read_forecast(location)
    lengths: dict[str, float] = {}
    weights: dict[str, float] = {}
    for name, row in data.by_domain.items():
        value = row.output_tokens_per_prompt or row.mean_output_tokens
        if value is not None and value > 0 and row.measured:
            domain = "" if name == "(none)" else name
            lengths[domain] = float(value)
            weights[domain] = float(row.prompts or 1)
    if not lengths:
        raise ConfigError(
            f"--lengths {location}: the forecast ({url}) has no measured domain; run a larger "
            "pilot (`generate --pilot`)"
        )
    return lengths, weights, url


def precheck(config: PrepareConfig, existing: Existing) -> None:
    """Refuse, before the sources are read, what ``resolve`` would refuse after: a ``lengths``
    file that is not a forecast, or tokens asked for with no length to plan with."""
    if config.lengths:
        _from_forecast(config.lengths)
    elif config.mix_by == "tokens" and not existing.has_answers:
        raise ConfigError(_NO_LENGTHS)


_NO_LENGTHS = (
    "--mix-by tokens: the expected answer lengths are unknown; give --lengths "
    "RUN/forecast.json (a pilot's forecast: `draftdata generate ... --pilot 0.01`) "
    "or an existing: dataset whose rows hold answers"
)


def resolve(
    config: PrepareConfig, existing: Existing, domains: Iterable[str]
) -> tuple[bool, Lengths | None]:
    """(plan in tokens?, the lengths) for ``config`` (module docstring); ``domains`` are the
    domains the plan shows. ConfigError (one line) when tokens are asked for and no length is
    known."""
    by_tokens = config.mix_by == "tokens" or (config.mix_by == "auto" and bool(config.lengths))
    if config.lengths:
        lengths, weights, source = _from_forecast(config.lengths)
    elif by_tokens:
        if not existing.has_answers:
            raise ConfigError(_NO_LENGTHS)
        lengths = {
            d: existing.loss_tokens[d] / n for d, n in existing.answered.items() if n and d
        } or {d: existing.loss_tokens[d] / n for d, n in existing.answered.items() if n}
        weights = {d: float(existing.answered[d]) for d in lengths}
        source = "existing answers"
    else:
        return False, None
    notes: list[str] = []
    total_w = sum(weights.values())
    fallback = sum(lengths[d] * weights[d] for d in lengths) / total_w
    for d in sorted(set(domains) | set(existing.counts) | set(config.mix)):
        if d not in lengths:
            lengths[d] = fallback
            notes.append(
                f"no expected length for domain {d or '(none)'} in {source}: the mean over "
                f"the others ({fallback:,.0f} tokens) is used"
            )
    measured = existing.has_answers
    ex_tokens: dict[str, float] = {}
    for d, rows in existing.counts.items():
        answered = existing.answered.get(d, 0)
        if measured and answered:
            ex_tokens[d] = existing.loss_tokens[d] / answered * rows  # scaled to the mix's rows
        else:
            ex_tokens[d] = rows * lengths[d]
    if source == "existing answers":
        notes.append(f"the existing answers' loss tokens are {ESTIMATE_ERROR}")
    if existing.counts and not measured:
        notes.append(
            "the existing set holds no answers to measure: its tokens are its rows times "
            "the expected lengths"
        )
    return by_tokens, Lengths(
        per_domain=dict(sorted(lengths.items())),
        source=source,
        existing_tokens=ex_tokens,
        existing_measured=measured,
        notes=notes,
    )
