"""The loss-token planner of ``merge --mix-by tokens``: how many rows of each domain to keep so
that the output's *loss tokens* (what a drafter trains on) land on the target mix, keeping as
much data as the mix allows.

The problem. Each mix group ``g`` has its unique rows in the seeded selection order (the same
rank order ``plan.select`` takes rows in), with loss tokens ``w_1, w_2, ...``; keeping ``c`` rows
keeps the first ``c`` of them, ``V_g(c) = w_1 + ... + w_c`` tokens. With ``--upsample`` the order
goes round again up to ``max_repeat`` times (copy ``k`` of every row before copy ``k + 1`` of
any), so ``c`` may exceed the group's ``n_g`` rows. A plan is one count per group; it is
*feasible* when every group's share of the total ``S = sum_g V_g(c_g)`` lies in its band
``[max(t_g - tol, 0), min(t_g + tol, 1)]`` (``within``). Among feasible plans the planner takes
the one that keeps the most distinct data, ``U = sum_g V_g(min(c_g, n_g))``, and among those the
smallest total (the fewest repeats); without upsampling ``U = S``.

Why prefixes of the seeded order: a group keeps a seeded random sample of its rows, never rows
picked for their length (picking short or long rows to fit a budget would skew each domain's
length distribution, and the drafter learns from that too). Rows are whole, so the band is met
in whole rows: with few rows and a narrow band the best plan can keep little; that is reported,
and merge stops when it keeps less than ``--min-keep``.

The method (``plan_tokens``): the continuous relaxation gives an upper bound ``S*`` (the largest
total the supplies allow with every share in its band, ``largest_total``); a greedy plan
rounds the continuous budgets down to whole rows, lowering the total until the shares fit
(``_greedy``); then a depth-first branch and bound over the groups' counts (``_Search``) finds the
best plan: each group's count is bounded by the band and the totals the groups fixed so far allow,
the last group's best count is found by bisection, and a branch is cut when even the relaxation
cannot beat the best plan found. On small inputs the search runs to the end and the plan is
optimal (``optimal``; the tests check it against brute force); on large ones it stops after
``MAX_NODES`` branches with the best plan found, never worse than the greedy one, and ``bound``
says how far from the relaxation's bound it is (typically under one row per group).

Pure arithmetic on numpy arrays: no files, no randomness (the order comes in as given).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

MAX_NODES = 100_000  # branches the search visits before it keeps the best plan found
_EPS = 1e-12  # relative slack of the band, for float rounding only


def within(v: float, total: float, lo: float, hi: float) -> bool:
    """Whether ``v`` of ``total`` is a share in ``[lo, hi]`` (any share of an empty total is)."""
    if total <= 0:
        return True
    slack = _EPS * total
    return lo * total - slack <= v <= hi * total + slack


def band(target: float, tolerance: float) -> tuple[float, float]:
    """The share band ``[lo, hi]`` of a target share."""
    return max(target - tolerance, 0.0), min(target + tolerance, 1.0)


def prefix_values(weights: I64, repeat: int = 1) -> I64:
    """``V(c)`` for ``c = 0 .. repeat * len(weights)``: tokens of the first ``c`` rows of the
    order, going round ``repeat`` times."""
    w = np.asarray(weights, dtype=np.int64)
    return np.concatenate(([0], np.cumsum(np.tile(w, repeat)))).astype(np.int64)


@dataclass(frozen=True)
class TokenPlan:
    """Rows per group and what they keep, in loss tokens."""

    counts: dict[str, int]  # rows in the output, copies included
    kept: dict[str, int]  # loss tokens in the output, copies included
    unique_kept: dict[str, int]  # loss tokens of the distinct rows kept
    supply: dict[str, int]  # loss tokens of all the group's unique rows
    optimal: bool  # the search ran to the end: no feasible plan keeps more
    bound: int  # the relaxation's bound on the kept distinct tokens

    @property
    def total(self) -> int:
        """Loss tokens in the output."""
        return sum(self.kept.values())

    def shares(self) -> dict[str, float]:
        """Each group's share of the output's loss tokens."""
        total = self.total
        return {g: (v / total if total else 0.0) for g, v in self.kept.items()}


def largest_total(caps: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> float:
    """The largest real ``S`` with ``lo_g S <= cap_g`` for all g and ``sum min(cap_g, hi_g S)
    >= S``: the continuous relaxation's bound on the total (found by bisection where the
    bound itself does not fit; a share band of width 0 fits only up to float rounding)."""
    bound = min((c / a for c, a in zip(caps, lo, strict=True) if a > 0), default=math.inf)
    top = min(bound, float(sum(caps)))
    if top <= 0:
        return 0.0

    def fits(s: float) -> bool:
        return sum(min(c, b * s) for c, b in zip(caps, hi, strict=True)) >= s * (1 - 1e-12)

    if fits(top):
        return top
    low, high = 0.0, top
    for _ in range(100):
        mid = (low + high) / 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def _fill(
    total: float, aim: Sequence[float], lo: Sequence[float], up: Sequence[float]
) -> list[float]:
    """Reals ``x_g`` in ``[lo_g, up_g]`` summing to ``total`` (when they can), closest to
    ``aim`` in squared distance: ``x_g = clip(aim_g + lam, lo_g, up_g)``."""

    def at(lam: float) -> list[float]:
        return [min(max(a + lam, lo_g), u) for a, lo_g, u in zip(aim, lo, up, strict=True)]

    low, high = -total - 1.0, total + 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if sum(at(mid)) < total:
            low = mid
        else:
            high = mid
    return at(high)


def _at_most(v: I64, x: float) -> int:
    """The largest count ``c`` with ``v[c] <= x`` (-1 if none): an integer key, so numpy
    bisects the int64 array as it is instead of converting it to floats first."""
    if x >= float(v[-1]):
        return len(v) - 1
    if x < 0:
        return -1
    return int(np.searchsorted(v, np.int64(math.floor(x)), side="right")) - 1


def _at_least(v: I64, x: float) -> int:
    """The smallest count ``c`` with ``v[c] >= x`` (``len(v)`` if none)."""
    if x <= 0:
        return 0
    if x > float(v[-1]):
        return len(v)
    return int(np.searchsorted(v, np.int64(math.ceil(x)), side="left"))


class _Problem:
    """The groups' value sequences and bands, and the plan's objective."""

    def __init__(
        self, values: Sequence[I64], n: Sequence[int], lo: Sequence[float], hi: Sequence[float]
    ) -> None:
        self.values = list(values)
        self.n = list(n)
        self.lo = list(lo)
        self.hi = list(hi)
        self.supply = [int(v[k]) for v, k in zip(values, n, strict=True)]

    def feasible(self, counts: Sequence[int]) -> bool:
        kept = [int(v[c]) for v, c in zip(self.values, counts, strict=True)]
        total = sum(kept)
        return all(within(k, total, a, b) for k, a, b in zip(kept, self.lo, self.hi, strict=True))

    def key(self, counts: Sequence[int]) -> tuple[int, int]:
        """(distinct tokens kept, minus the total): larger is better."""
        unique = sum(int(v[min(c, k)]) for v, c, k in zip(self.values, counts, self.n, strict=True))
        total = sum(int(v[c]) for v, c in zip(self.values, counts, strict=True))
        return unique, -total


def _allocate(p: _Problem, s: float, target: Sequence[float], upsample: bool) -> list[float]:
    """Real budgets ``x_g`` summing to ``s`` with every share in its band and within the
    supplies (when possible). Without upsampling they aim at the targets (the middle of the
    bands, which rounding to whole rows then has room to miss); with it, at keeping every
    group's rows with as few copies as the bands allow."""
    caps = [float(v[-1]) for v in p.values]
    up = [min(c, b * s) for c, b in zip(caps, p.hi, strict=True)]
    low = [min(a * s, u) for a, u in zip(p.lo, up, strict=True)]
    if not upsample:
        return _fill(s, [t * s for t in target], low, up)
    x = [min(max(float(a), lo_g), u) for a, lo_g, u in zip(p.supply, low, up, strict=True)]
    extra = s - sum(x)
    # more room: copies where the band allows; less: copies first, then distinct rows
    order = range(len(x))
    if extra > 0:
        for g in order:
            add = min(extra, up[g] - x[g])
            x[g] += add
            extra -= add
    else:
        for drop_copies in (True, False):
            for g in order:
                floor = max(low[g], float(p.supply[g])) if drop_copies else low[g]
                take = min(-extra, max(x[g] - floor, 0.0))
                x[g] -= take
                extra += take
    return x


def _greedy(p: _Problem, target: Sequence[float], start: float, upsample: bool) -> list[int] | None:
    """A feasible plan near the relaxation: real budgets at a total ``S`` rounded down to whole
    rows, ``S`` lowered until the shares fit (None if no such ``S`` is found)."""
    steps = [np.diff(v) for v in p.values if len(v) > 1]
    biggest = max((float(d.max()) for d in steps), default=1.0)
    tries = [start - k * biggest for k in range(24)] + [start * 0.97**k for k in range(1, 160)]
    for s in tries:
        if s <= 0:
            continue
        budget = _allocate(p, s, target, upsample)
        counts = [_at_most(v, x * (1 + 1e-12)) for v, x in zip(p.values, budget, strict=True)]
        if p.feasible(counts) and sum(int(v[c]) for v, c in zip(p.values, counts, strict=True)) > 0:
            return counts
    return None


class _Search:
    """Depth-first branch and bound over the groups' counts (see the module docstring)."""

    def __init__(self, p: _Problem, top: float, max_nodes: int, bound: int) -> None:
        self.p = p
        self.bound = bound  # no plan keeps more distinct tokens than this
        g = len(p.values)
        # the group with the most counts goes last: it is solved by bisection, not enumerated
        self.order = sorted(range(g), key=lambda i: (len(p.values[i]), i))
        self.top = top
        self.max_nodes = max_nodes
        self.nodes = 0
        self.complete = True
        self.best: list[int] = [0] * g
        self.best_key = p.key(self.best)
        self.counts = [0] * g

    def offer(self, counts: Sequence[int]) -> bool:
        if not self.p.feasible(counts):
            return False
        key = self.p.key(counts)
        if key > self.best_key:
            self.best_key, self.best = key, list(counts)
        return True

    def run(self) -> None:
        if not self.done():
            self._visit(0, 0, 0, 0.0, self.top)

    def done(self) -> bool:
        """Whether the best plan is provably optimal already: it keeps the bound, no copies."""
        unique, minus_total = self.best_key
        return unique >= self.bound and unique == -minus_total

    def _rest_unique(self, j: int, s_max: float) -> float:
        # the most distinct tokens the groups from position j on can still keep
        p = self.p
        return sum(min(float(p.supply[h]), p.hi[h] * s_max) for h in self.order[j:])

    def _visit(self, j: int, q: int, qu: int, s_min: float, s_max: float) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            self.complete = False
            return
        if self.done():
            return
        p = self.p
        if j == len(self.order) - 1:
            self._leaf(self.order[j], q, s_min, s_max)
            return
        g = self.order[j]
        v, n, lo, hi = p.values[g], p.n[g], p.lo[g], p.hi[g]
        best_u, best_s = self.best_key[0], -self.best_key[1]
        if qu + self._rest_unique(j, s_max) < best_u:
            return
        top = min(hi * s_max, s_max - q)
        c_max = _at_most(v, top * (1 + 1e-9) + 1e-9)
        c_min = _at_least(v, lo * s_min * (1 - 1e-9))
        for c in range(c_max, c_min - 1, -1):
            self.nodes += 1  # every count tried costs, recursed into or not
            if self.nodes > self.max_nodes:
                self.complete = False
                return
            val = int(v[c])
            lo_s = max(s_min, q + val, val / hi if hi > 0 else math.inf)
            hi_s = min(s_max, val / lo if lo > 0 else math.inf)
            unique = int(v[min(c, n)])
            # smaller counts keep less and allow a smaller total: nothing below beats the best
            if qu + unique + self._rest_unique(j + 1, hi_s) < best_u:
                break
            if lo_s > hi_s * (1 + 1e-9) + 1e-9:
                continue
            if qu + unique + self._rest_unique(j + 1, hi_s) == best_u and q + val >= best_s > 0:
                continue
            self.counts[g] = c
            self._visit(j + 1, q + val, qu + unique, lo_s, hi_s)
            best_u, best_s = self.best_key[0], -self.best_key[1]
        self.counts[g] = 0

    def _leaf(self, g: int, q: int, s_min: float, s_max: float) -> None:
        p = self.p
        v, n, lo, hi = p.values[g], p.n[g], p.lo[g], p.hi[g]
        # v_g with lo (q + v_g) <= v_g <= hi (q + v_g) and s_min <= q + v_g <= s_max
        low = max(lo * q / (1 - lo) if lo < 1 else (math.inf if q > 0 else 0.0), s_min - q, 0.0)
        high = min(hi * q / (1 - hi) if hi < 1 else math.inf, s_max - q)
        c_lo = _at_least(v, low * (1 - 1e-9) - 1e-9)
        c_hi = _at_most(v, high * (1 + 1e-9) + 1e-9)
        if c_lo > c_hi:
            return
        counts = list(self.counts)
        # the bounds were widened for float rounding: the first count may miss the band by a
        # hair, so a few are tried; counts of the same value (rows without loss tokens) are
        # the same plan as far as the band goes, so a value that failed is not tried again
        failed: int | None = None
        tries = 0
        for c in _preference(c_lo, c_hi, n):
            if int(v[c]) == failed:
                continue
            counts[g] = c
            if self.offer(counts):
                return
            failed, tries = int(v[c]), tries + 1
            if tries >= 8:
                return


def _preference(c_lo: int, c_hi: int, n: int) -> Iterator[int]:
    """Counts of the last group from best to worst: the most distinct rows, then the fewest
    copies."""
    if c_hi >= n:
        yield from range(max(c_lo, n), c_hi + 1)
        yield from range(min(c_hi, n - 1), c_lo - 1, -1)
    else:
        yield from range(c_hi, c_lo - 1, -1)


def plan_tokens(
    weights: Mapping[str, I64],
    target: Mapping[str, float],
    *,
    tolerance: float,
    upsample: bool = False,
    max_repeat: int = 1,
    max_nodes: int = MAX_NODES,
) -> TokenPlan:
    """The plan (see the module docstring) for groups with loss tokens ``weights[g]`` per unique
    row in selection order and target shares ``target`` (over the same groups, summing to 1)."""
    groups = sorted(target)
    repeat = max_repeat if upsample else 1
    values = [prefix_values(weights[g], repeat) for g in groups]
    n = [len(weights[g]) for g in groups]
    bands = [band(target[g], tolerance) for g in groups]
    p = _Problem(values, n, [b[0] for b in bands], [b[1] for b in bands])
    caps = [float(v[-1]) for v in values]
    top = largest_total(caps, p.lo, p.hi)
    start = top
    if upsample:  # aim for keeping every row, with no more copies than the mix needs
        keep_all = max(
            float(sum(p.supply)),
            max((s / b for s, b in zip(p.supply, p.hi, strict=True) if b > 0), default=0.0),
        )
        start = min(top, keep_all)
    # distinct tokens: each group keeps at most its supply and its band's share of the bound
    most = sum(min(float(a), b * top) for a, b in zip(p.supply, p.hi, strict=True))
    bound = math.floor(min(float(sum(p.supply)), top, most) + 1e-9)
    search = _Search(p, top, max_nodes, bound)
    seed = _greedy(p, [target[g] for g in groups], start, upsample) if groups else None
    if seed is not None:
        search.offer(seed)
    if groups:
        search.run()
    counts = search.best
    return TokenPlan(
        counts={g: c for g, c in zip(groups, counts, strict=True)},
        kept={g: int(v[c]) for g, v, c in zip(groups, values, counts, strict=True)},
        unique_kept={
            g: int(v[min(c, k)]) for g, v, c, k in zip(groups, values, counts, n, strict=True)
        },
        supply=dict(zip(groups, p.supply, strict=True)),
        optimal=search.complete or search.done(),
        bound=bound,
    )
