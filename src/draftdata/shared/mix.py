"""Mix planning: how many prompts to take per domain and per source (prepare and merge).

Inputs: the existing dataset's domain counts ``E_d``, each source's usable prompts per domain
(after validation and dedup), fixed ``take`` values and ``max_take`` caps, a target mix ``t_d``
(shares of the *combined* set) and a budget ``B`` of new prompts.

Method. Fixed takes are allocated first (spread over the source's domains in proportion to what
it has) and count as already present. The remaining budget ``R`` is split over domains by
minimising the squared distance between the combined counts and the targets,
``sum_d (E_d + F_d + x_d - t_d * T)^2`` with ``T = E + F + R``, subject to ``sum x_d = R`` and
``0 <= x_d <= A_d`` (what the sources can supply). The solution is a water-fill,
``x_d = clip(t_d * T - E_d - F_d + lam, 0, A_d)``, with ``lam`` found by bisection; integers come
from the largest-remainder rule (ties broken by domain name). Each domain's count is then split
over the sources that have it in proportion to their supply, within their caps; what caps leave
unfilled goes back into another round. Without a mix the budget is spread over all usable
prompts in proportion. Everything is deterministic; sampling itself is in ``stage.py``.

In tokens (``lengths`` given: the expected loss tokens of one new prompt's answer per domain,
``L_d``, e.g. from a pilot's forecast) the targets are shares of the combined set's tokens: the
existing set's ``E_d`` tokens plus ``x_d * L_d``. For a token total ``T`` each domain wants
``x_d = clip((t_d * T - E_d) / L_d, 0, A_d)``; ``T`` is found by bisection where those add up
to ``R`` (``token_fill``), so every domain the supply and the existing set leave free lands on
its token share exactly, up to one row; the integers come from the same largest-remainder rule.
Rows left over when the targeted domains run out go to the others in proportion to supply.

A mix itself (what ``--mix`` and a config's ``mix:`` give) is read and checked here for every
stage: ``parse_mix`` (``code=0.35,math=0.2``), ``mix_from_json`` (a ``suggested_mix.json`` or
``{domain: share}``, already decoded), ``check_shares`` (finite, >= 0, not all zero),
``check_domains`` (every key a domain the data can have), ``sum_warning`` and ``normalised``.
Errors are one-line ConfigErrors naming where the mix came from (``--mix``, ``config: mix``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from draftdata.errors import ConfigError

# The pseudo-domain of a mix that pools every domain the mix does not name (merge).
OTHER = "other"


def parse_mix(text: str | None, where: str = "--mix") -> dict[str, float]:
    """``"code=0.35,math=0.2"`` -> ``{"code": 0.35, "math": 0.2}`` (shares as given).

    ConfigError names the bad piece: a missing ``=``, a non-number, a negative share, a domain
    given twice, or shares that are all zero.
    """
    if text is None or not text.strip():
        return {}
    mix: dict[str, float] = {}
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        name, eq, value = piece.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ConfigError(f"{where}: {piece!r}: expected DOMAIN=SHARE, e.g. code=0.35")
        try:
            share = float(value)
        except ValueError:
            raise ConfigError(f"{where}: {piece!r}: {value.strip()!r} is not a number") from None
        if name in mix:
            raise ConfigError(f"{where}: domain {name!r} given twice")
        mix[name] = share
    return check_shares(mix, where)


def mix_from_json(doc: Any, where: str) -> dict[str, float]:
    """The mix a decoded JSON document holds: a ``suggested_mix.json`` (its ``mix`` object) or
    any object of domain -> share; checked like every mix (``check_shares``)."""
    mix = doc.get("mix") if isinstance(doc, dict) and isinstance(doc.get("mix"), dict) else doc
    if not isinstance(mix, dict) or not mix:
        raise ConfigError(f"{where}: holds no mix (a suggested_mix.json or {{domain: share}})")
    return check_shares({str(k): v for k, v in mix.items()}, where)


def check_shares(mix: Mapping[str, Any], where: str) -> dict[str, float]:
    """``mix`` as floats, or ConfigError in one line: a share that is not a number, not finite
    or negative (naming its domain), or shares that are all zero. An empty mix is no mix."""
    out: dict[str, float] = {}
    for name, share in mix.items():
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise ConfigError(f"{where}: {name}: {share!r} is not a number")
        if not math.isfinite(share) or share < 0:
            raise ConfigError(f"{where}: {name}={share:g}: shares must be finite and >= 0")
        out[name] = float(share)
    if out and sum(out.values()) <= 0:
        raise ConfigError(f"{where}: the shares are all zero")
    return out


def check_domains(
    mix: Mapping[str, float], known: Iterable[str], where: str, fix: str = ""
) -> None:
    """ConfigError in one line when a key of ``mix`` is none of the ``known`` domains (a typo
    like ``kode`` would otherwise get nothing while the others share its part). ``fix`` is
    appended as the way out."""
    have = set(known)
    unknown = sorted(d for d in mix if d not in have)
    if unknown:
        names = ", ".join(repr(d) for d in unknown)
        raise ConfigError(
            f"{where}: {names} {'is' if len(unknown) == 1 else 'are'} no domain of the data "
            f"(the domains are {', '.join(sorted(have))}); fix the name"
            + (f", {fix}" if fix else "")
        )


def sum_warning(mix: Mapping[str, float], where: str = "--mix") -> str | None:
    """A one-line warning when the shares do not sum to 1 (they are normalised), else None."""
    total = sum(mix.values())
    if not mix or abs(total - 1.0) <= 1e-6:
        return None
    shown = ",".join(f"{k}={v / total:.3g}" for k, v in sorted(mix.items()))
    return f"warning: {where} shares sum to {total:g}, not 1; normalised to {shown}"


def normalised(mix: Mapping[str, float]) -> dict[str, float]:
    """The mix scaled to sum 1 (rounded to 12 digits), zero shares removed, keys sorted."""
    total = sum(mix.values())
    if total <= 0:
        return {}
    return {d: round(mix[d] / total, 12) for d in sorted(mix) if mix[d] > 0}


class Supply(msgspec.Struct, kw_only=True, frozen=True):
    """What one source can give: usable prompts per domain, a fixed take, a cap."""

    name: str
    available: dict[str, int]
    take: int | None = None
    max_take: int | None = None


class DomainRow(msgspec.Struct, kw_only=True, frozen=True):
    """One line of the plan table."""

    domain: str
    existing: int
    new: int
    available: int
    target: float | None
    before: float
    after: float
    # with lengths (a plan in tokens, or rows with lengths known): expected loss tokens
    tokens_per_row: float | None = None  # of one new prompt's answer
    existing_tokens: float | None = None
    new_tokens: float | None = None
    tokens_before: float | None = None  # share of the existing set's tokens
    tokens_after: float | None = None  # share of the combined set's expected tokens


class Plan(msgspec.Struct, kw_only=True, frozen=True):
    """The result: per-source, per-domain quotas and the before/after table."""

    per_source: dict[str, dict[str, int]]
    domains: list[DomainRow]
    budget: int | None
    total_new: int
    shortfall: int
    mix_by: str = "rows"  # what the target shares count: rows, or (expected) tokens
    fixed: int = 0  # new prompts taken by the sources' fixed ``take``, whatever the mix


def largest_remainder(
    shares: Mapping[str, float], total: int, caps: Mapping[str, int]
) -> dict[str, int]:
    """Round non-negative real ``shares`` (summing to ~``total``) to integers summing to
    ``min(total, sum caps)``, never above a cap; ties go to the smaller key."""
    out = {k: min(caps[k], math.floor(max(v, 0.0) + 1e-9)) for k, v in shares.items()}
    left = min(total, sum(caps.values())) - sum(out.values())
    order = sorted(shares, key=lambda k: (-(shares[k] - math.floor(shares[k] + 1e-9)), k))
    while left > 0:
        moved = False
        for k in order:
            if left == 0:
                break
            if out[k] < caps[k]:
                out[k] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return out


def _proportional(
    weights: Mapping[str, int], total: int, caps: Mapping[str, int]
) -> dict[str, int]:
    # Split ``total`` in proportion to ``weights`` within ``caps`` (water-fill on the multiplier).
    caps = {k: min(caps[k], weights[k]) for k in weights}
    if total >= sum(caps.values()):
        return dict(caps)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(min(caps[k], mid * w) for k, w in weights.items()) < total:
            lo = mid
        else:
            hi = mid
    return largest_remainder({k: min(caps[k], hi * w) for k, w in weights.items()}, total, caps)


def water_fill(ideal: Mapping[str, float], total: int, caps: Mapping[str, int]) -> dict[str, int]:
    """Integers ``x_d`` with sum ``min(total, sum caps)``, ``0 <= x_d <= caps[d]``, closest in
    squared distance to ``ideal`` (``x_d = clip(ideal_d + lam, 0, cap_d)``)."""
    total = min(total, sum(caps.values()))
    if total <= 0:
        return dict.fromkeys(ideal, 0)

    def filled(lam: float) -> float:
        return sum(min(max(ideal[d] + lam, 0.0), caps[d]) for d in ideal)

    lo = -max(ideal.values(), default=0.0) - 1.0
    hi = max(caps.values()) - min(ideal.values(), default=0.0) + 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if filled(mid) < total:
            lo = mid
        else:
            hi = mid
    real = {d: min(max(ideal[d] + hi, 0.0), float(caps[d])) for d in ideal}
    return largest_remainder(real, total, caps)


def token_fill(
    target: Mapping[str, float],
    base: Mapping[str, float],
    lengths: Mapping[str, float],
    total: int,
    caps: Mapping[str, int],
) -> dict[str, int]:
    """Integers ``x_d`` with sum ``min(total, sum caps)``, ``0 <= x_d <= caps[d]``, with which
    the token totals ``base_d + x_d * lengths_d`` land on the ``target`` shares (module
    docstring). Every domain in ``caps`` needs a length above 0."""
    total = min(total, sum(caps.values()))
    if total <= 0:
        return dict.fromkeys(caps, 0)
    aimed = [d for d in sorted(caps) if target.get(d, 0.0) > 0 and caps[d] > 0]

    def fill(t: float) -> dict[str, float]:
        return {
            d: min(max((target[d] * t - base.get(d, 0.0)) / lengths[d], 0.0), float(caps[d]))
            for d in aimed
        }

    real: dict[str, float] = dict.fromkeys(caps, 0.0)
    room = sum(caps[d] for d in aimed)
    if room <= total:  # every targeted domain takes all it has; the rest goes to the others
        real.update({d: float(caps[d]) for d in aimed})
        others = {d: caps[d] for d in caps if d not in aimed and caps[d] > 0}
        if others:
            real.update(
                {d: float(n) for d, n in _proportional(others, total - room, others).items()}
            )
    else:
        lo = 0.0
        hi = max((caps[d] * lengths[d] + base.get(d, 0.0)) / target[d] for d in aimed) + 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            if sum(fill(mid).values()) < total:
                lo = mid
            else:
                hi = mid
        real.update(fill(hi))
    return largest_remainder(real, total, caps)


def shares(counts: Mapping[str, float]) -> dict[str, float]:
    """Each key's fraction of the total (all 0 when the total is 0)."""
    total = sum(counts.values())
    return {k: (v / total if total else 0.0) for k, v in counts.items()}


def off_target(plan: Plan, slack: float = 0.01) -> dict[str, tuple[float, float]]:
    """domain -> (share after, target) for each domain of ``plan`` whose share of the combined
    set (in the plan's unit: rows, or expected tokens) misses its target by more than
    ``slack``; empty without a target."""
    out: dict[str, tuple[float, float]] = {}
    for r in plan.domains:
        if r.target is None:
            continue
        after = r.tokens_after if plan.mix_by == "tokens" else r.after
        if after is not None and abs(after - r.target) > slack:
            out[r.domain] = (after, r.target)
    return out


def plan_mix(
    existing: Mapping[str, int],
    supplies: list[Supply],
    budget: int | None,
    mix: Mapping[str, float],
    *,
    lengths: Mapping[str, float] | None = None,
    existing_tokens: Mapping[str, float] | None = None,
    by_tokens: bool = False,
) -> Plan:
    """Plan per-source, per-domain quotas landing as close to ``mix`` as the sources allow.

    See the module docstring for the method. ``budget`` None takes every usable prompt (or just
    the fixed takes when every source has one). ``lengths`` (domain -> expected tokens of one
    new prompt's answer, above 0 for every domain of the supply) add the expected tokens to the
    plan's rows; with ``by_tokens`` the mix is planned in them. ``existing_tokens`` are the
    existing set's tokens per domain (default: its rows times ``lengths``).
    """
    if by_tokens and lengths is None:
        raise ValueError("plan_mix: by_tokens needs lengths")
    ex_tokens: dict[str, float] = {}
    if lengths is not None:
        ex_tokens = (
            {d: float(v) for d, v in existing_tokens.items()}
            if existing_tokens is not None
            else {d: n * lengths.get(d, 0.0) for d, n in existing.items()}
        )
    taken: dict[str, dict[str, int]] = {s.name: {} for s in supplies}
    room = {s.name: dict(s.available) for s in supplies}  # what is still available
    fixed_total = 0
    for s in supplies:
        if s.take is None:
            continue
        got = _proportional(s.available, min(s.take, sum(s.available.values())), s.available)
        for d, n in got.items():
            taken[s.name][d] = taken[s.name].get(d, 0) + n
            room[s.name][d] -= n
        fixed_total += sum(got.values())
    flexible = [s for s in supplies if s.take is None]
    cap_left = {
        s.name: (s.max_take if s.max_take is not None else sum(s.available.values()))
        for s in flexible
    }
    supply_total = sum(min(sum(room[s.name].values()), cap_left[s.name]) for s in flexible)
    remaining = supply_total if budget is None else max(budget - fixed_total, 0)
    want = remaining
    target = shares(mix) if mix else {}

    for _ in range(8):  # rounds: caps can leave a domain short; hand the rest to others
        if remaining <= 0 or not flexible:
            break
        avail: dict[str, int] = {}
        for s in flexible:
            for d, n in room[s.name].items():
                avail[d] = avail.get(d, 0) + min(n, cap_left[s.name])
        if sum(avail.values()) == 0:
            break
        domains = sorted(set(avail) | set(target))
        caps = {d: avail.get(d, 0) for d in domains}
        if target and by_tokens and lengths is not None:
            tok = dict(ex_tokens)
            for per in taken.values():
                for d, n in per.items():
                    tok[d] = tok.get(d, 0.0) + n * lengths[d]
            per_domain = token_fill(target, tok, lengths, remaining, caps)
        elif target:
            base = dict(existing)
            for per in taken.values():
                for d, n in per.items():
                    base[d] = base.get(d, 0) + n
            grand = sum(base.values()) + remaining
            ideal = {d: target.get(d, 0.0) * grand - base.get(d, 0) for d in domains}
            per_domain = water_fill(ideal, remaining, caps)
        else:
            per_domain = _proportional(caps, remaining, caps)
        got_round = 0
        for d in domains:
            need = per_domain.get(d, 0)
            if need <= 0:
                continue
            weights = {s.name: room[s.name].get(d, 0) for s in flexible}
            limits = {s.name: min(room[s.name].get(d, 0), cap_left[s.name]) for s in flexible}
            weights = {k: v for k, v in weights.items() if limits[k] > 0}
            split = _proportional(weights, need, {k: limits[k] for k in weights})
            for name, n in split.items():
                if n:
                    taken[name][d] = taken[name].get(d, 0) + n
                    room[name][d] -= n
                    cap_left[name] -= n
                    got_round += n
        remaining -= got_round
        if got_round == 0:
            break

    new_counts: dict[str, int] = {}
    for per in taken.values():
        for d, n in per.items():
            new_counts[d] = new_counts.get(d, 0) + n
    all_avail: dict[str, int] = {}
    for s in supplies:
        for d, n in s.available.items():
            all_avail[d] = all_avail.get(d, 0) + n
    domains = sorted(set(existing) | set(new_counts) | set(target) | set(all_avail))
    combined = {d: existing.get(d, 0) + new_counts.get(d, 0) for d in domains}
    before, after = shares({d: existing.get(d, 0) for d in domains}), shares(combined)
    rows = [
        DomainRow(
            domain=d,
            existing=existing.get(d, 0),
            new=new_counts.get(d, 0),
            available=all_avail.get(d, 0),
            target=target.get(d) if target else None,
            before=before[d],
            after=after[d],
        )
        for d in domains
    ]
    if lengths is not None:
        rows = _with_tokens(rows, lengths, ex_tokens)
    per_source = {name: {d: n for d, n in sorted(per.items()) if n} for name, per in taken.items()}
    total_new = sum(new_counts.values())
    return Plan(
        per_source=per_source,
        domains=rows,
        budget=budget,
        total_new=total_new,
        shortfall=max(fixed_total + want - total_new, 0) if budget is not None else 0,
        mix_by="tokens" if by_tokens else "rows",
        fixed=fixed_total,
    )


def _with_tokens(
    rows: list[DomainRow], lengths: Mapping[str, float], existing_tokens: Mapping[str, float]
) -> list[DomainRow]:
    """``rows`` with the expected tokens: per row of new answers, existing, new, and shares."""
    ex = {r.domain: float(existing_tokens.get(r.domain, 0.0)) for r in rows}
    new = {r.domain: r.new * lengths.get(r.domain, 0.0) for r in rows}
    before = sum(ex.values())
    after = before + sum(new.values())
    return [
        msgspec.structs.replace(
            r,
            tokens_per_row=round(lengths[r.domain], 1) if r.domain in lengths else None,
            existing_tokens=round(ex[r.domain], 1),
            new_tokens=round(new[r.domain], 1),
            tokens_before=ex[r.domain] / before if before else 0.0,
            tokens_after=(ex[r.domain] + new[r.domain]) / after if after else 0.0,
        )
        for r in rows
    ]
