"""Pure planning for merge: dedup, per-domain counts for a target mix, selection, split, order.

Everything here works on compact numpy arrays of per-row keys (64-bit id and content hashes,
domain codes) collected by pass 1; nothing reads or writes files.

Counts (``solve_counts``). Given the unique rows per mix domain ``A_d``, target shares ``t_d``
and a tolerance ``tau``, merge keeps the largest total ``N`` for which counts ``n_d <= A_d``
exist with every share within ``tau`` of its target: ``(t_d - tau) N <= A_d`` for all ``d`` and
``sum_d min(A_d, (t_d + tau) N) >= N``. Both conditions are monotone in ``N`` (the second is a
concave function that starts positive), so ``N`` is found in closed form plus one bisection;
the counts are then the integers closest to ``t_d N`` within ``min(A_d, (t_d + tau) N)``
(``draftdata.shared.mix.water_fill``). With ``tau = 0`` this is the exact mix,
``N = min_d A_d / t_d``. Upsampling raises the caps to ``A_d * max_repeat`` and aims for the ``N``
at which no domain needs to drop a row. A domain of the mix with no rows at all makes the mix
unreachable: it is left out, the remaining targets keep their ratios, and the result says so.

Counts in loss tokens (``solve_tokens``, ``--mix-by tokens``, the default): the same shape of
answer, found by ``tokenplan.plan_tokens`` over each group's rows in selection order; see there.

Selection is by seeded hash ranks of the content hash (not of row positions), so the same rows
are chosen whatever order the input files list them in; dedup keeps the first copy in input
order (existing inputs first). The output order is a seeded 64-bit key per output row. Repeats
(``--upsample``) go to a group's train rows in rank order (rows mode), or, in tokens mode, round
the group's rank order exactly as the token plan counted them.

The eval split (``eval_rows``) is taken before any row is copied: a stratified sample of the
unique rows a plan keeps, each group giving eval rows in proportion to its kept rows; the train
split is then planned on the rest, so it, not train + eval, lands on the target mix; ``with_eval``
puts the eval rows into the train selection.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from draftdata.merge.tokenplan import MAX_NODES, TokenPlan, largest_total, plan_tokens
from draftdata.shared.mix import largest_remainder, water_fill

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: U64) -> U64:
    """The splitmix64 finaliser: a bijective, well-mixed 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64, copy=True)
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def salt(seed: int, stream: str) -> np.uint64:
    """A 64-bit salt for one random stream (``select``, ``eval``, ``order``) of one seed."""
    digest = hashlib.blake2b(f"{seed}:{stream}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def hash64(data: bytes | memoryview) -> int:
    """A 64-bit BLAKE2b hash of ``data`` (ids and contents)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


# ---------------------------------------------------------------------------------------------
# Dedup


def dedup(
    id_hash: U64, content_hash: U64, valid: npt.NDArray[np.bool_], *, by_id: bool = True
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """(keep, duplicate_id, duplicate_content) masks over rows in read order.

    The first row with an id keeps it (unless ``by_id`` is False); of the rows left, the first
    with a content hash keeps it. Rows not ``valid`` (bad rows) are in no mask.
    """
    n = len(id_hash)
    rows = np.flatnonzero(valid)
    keep_id = valid.copy()
    if by_id and len(rows):
        keep_id[:] = False
        _, first = np.unique(id_hash[rows], return_index=True)
        keep_id[rows[first]] = True
    dup_id = valid & ~keep_id
    left = np.flatnonzero(keep_id)
    keep = np.zeros(n, dtype=bool)
    if len(left):
        _, first = np.unique(content_hash[left], return_index=True)
        keep[left[first]] = True
    return keep, dup_id, keep_id & ~keep


# ---------------------------------------------------------------------------------------------
# Counts


@dataclass(frozen=True)
class Allocation:
    """Rows to output per mix group, and how the target was met."""

    counts: dict[str, int]  # group -> output rows (copies included)
    target: dict[str, float]  # the target actually aimed at (missing groups left out)
    missing: list[str]  # mix groups with no rows at all
    limited_by: list[str]  # groups whose supply (or repeat cap) bounded the total
    total: int = 0
    achieved: dict[str, float] = field(default_factory=dict)  # shares in ``unit``
    unit: str = "rows"  # what the shares count: rows, or loss_tokens

    @property
    def reachable(self) -> bool:
        """Whether every domain of the mix could be served."""
        return not self.missing


def _largest_n(caps: Mapping[str, float], target: Mapping[str, float], tau: float) -> float:
    # The largest real N with (t - tau) N <= cap for all groups and sum min(cap, (t+tau) N) >= N.
    groups = list(target)
    return largest_total(
        [caps[g] for g in groups],
        [target[g] - tau for g in groups],
        [target[g] + tau for g in groups],
    )


STEP_DOWN = 1024  # totals below the relaxation's tried for whole counts within the tolerance


def _counts_at(
    aim: Mapping[str, float], caps: Mapping[str, int], tolerance: float, n: int
) -> dict[str, int]:
    hi = {g: min(caps[g], math.floor((aim[g] + tolerance) * n + 1e-9)) for g in aim}
    return water_fill({g: aim[g] * n for g in aim}, n, hi)


def _whole_counts(
    aim: Mapping[str, float], caps: Mapping[str, int], tolerance: float, n: int
) -> dict[str, int]:
    """Whole counts for a total of at most ``n`` (the real relaxation's): the largest total,
    down to ``STEP_DOWN`` below ``n`` and not under half of it, whose every share is within
    ``tolerance`` (a group's ceiling ``(t + tau) N`` rounds down, so whole rows may miss the
    band at ``n``: 6 of 14 rows is 42.9% against 40% +- 2%, 5 of 13 is within it); when none
    is, ``n``'s counts, off by rounding only (a tolerance finer than one row in ``n``)."""
    first = counts = _counts_at(aim, caps, tolerance, n)
    floor = max(n - STEP_DOWN, n // 2, 0)
    while n > floor:
        total = sum(counts.values())
        if total <= 0:
            break
        if all(abs(counts[g] / total - aim[g]) <= tolerance + 1e-9 for g in aim):
            return counts
        n = min(n, total) - 1
        counts = _counts_at(aim, caps, tolerance, n)
    return first


def solve_counts(
    supply: Mapping[str, int],
    target: Mapping[str, float],
    *,
    tolerance: float,
    upsample: bool = False,
    max_repeat: int = 1,
) -> Allocation:
    """Output rows per group landing within ``tolerance`` of ``target`` (see module docstring).

    ``supply`` is unique rows per group, ``target`` shares summing to 1 over the mix groups
    (empty: keep every row). Without ``upsample`` no count exceeds its supply.
    """
    if not target:
        counts = {g: int(n) for g, n in sorted(supply.items()) if n > 0}
        total = sum(counts.values())
        shares = {g: n / total for g, n in counts.items()} if total else {}
        return Allocation(counts, shares, [], [], total, dict(shares))
    missing = sorted(g for g, t in target.items() if supply.get(g, 0) == 0 and t > tolerance)
    aim = {g: t for g, t in target.items() if g not in missing and t > 0}
    s = sum(aim.values())
    aim = {g: t / s for g, t in sorted(aim.items())} if s > 0 else {}
    if not aim:
        return Allocation({}, aim, missing, [], 0, {})
    repeat = max_repeat if upsample else 1
    caps = {g: supply.get(g, 0) * repeat for g in aim}
    n_real = _largest_n({g: float(c) for g, c in caps.items()}, aim, tolerance)
    if upsample:
        # aim for the N at which no group has to drop a row, unless the repeat cap says less
        keep_all = max(
            float(sum(supply.get(g, 0) for g in aim)),
            max(supply.get(g, 0) / (t + tolerance) for g, t in aim.items()),
        )
        n_real = min(n_real, keep_all)
    else:
        n_real = min(n_real, float(sum(caps.values())))
    counts = _whole_counts(aim, caps, tolerance, math.floor(n_real + 1e-9))
    total = sum(counts.values())
    limited = sorted(g for g in aim if counts[g] >= caps[g] and caps[g] > 0)
    achieved = {g: (c / total if total else 0.0) for g, c in counts.items()}
    return Allocation(dict(sorted(counts.items())), aim, missing, limited, total, achieved)


def solve_tokens(
    weights: Mapping[str, npt.NDArray[np.int64]],
    target: Mapping[str, float],
    *,
    tolerance: float,
    upsample: bool = False,
    max_repeat: int = 1,
    max_nodes: int = MAX_NODES,
) -> tuple[Allocation, TokenPlan | None]:
    """Output rows per group so that the output's loss tokens land within ``tolerance`` of
    ``target`` (``tokenplan.plan_tokens``). ``weights[g]``: loss tokens of the group's unique
    rows in selection order. A group of the mix with no loss tokens makes the mix unreachable,
    as in ``solve_counts``: left out, the other targets keep their ratios."""
    supply = {g: int(np.asarray(w).sum()) for g, w in weights.items()}
    missing = sorted(g for g, t in target.items() if supply.get(g, 0) == 0 and t > tolerance)
    aim = {g: t for g, t in target.items() if g not in missing and t > 0}
    s = sum(aim.values())
    aim = {g: t / s for g, t in sorted(aim.items())} if s > 0 else {}
    if not aim:
        return Allocation({}, aim, missing, [], 0, {}, "loss_tokens"), None
    empty = np.zeros(0, dtype=np.int64)
    plan = plan_tokens(
        {g: np.asarray(weights.get(g, empty), dtype=np.int64) for g in aim},
        aim,
        tolerance=tolerance,
        upsample=upsample,
        max_repeat=max_repeat,
        max_nodes=max_nodes,
    )
    repeat = max_repeat if upsample else 1
    size = {g: len(weights.get(g, empty)) for g in aim}
    limited = sorted(g for g in aim if size[g] and plan.counts[g] >= size[g] * repeat)
    counts = dict(sorted(plan.counts.items()))
    alloc = Allocation(
        counts, aim, missing, limited, sum(counts.values()), plan.shares(), "loss_tokens"
    )
    return alloc, plan


# ---------------------------------------------------------------------------------------------
# Selection, split and order


def selection_order(
    rows: I64, groups: npt.NDArray[np.int32], content_hash: U64, seed: int
) -> npt.NDArray[np.intp]:
    """The order ``select`` takes candidate rows in: by group, then seeded rank of the content
    hash, then row. The token planner reads each group's loss tokens in this order."""
    rank = mix64(content_hash ^ salt(seed, "select"))
    return np.lexsort((rows, rank, groups))


@dataclass(frozen=True)
class Selection:
    """The output rows, sorted by global input row: which row, which copy, which split, key."""

    row: I64  # global row index (read order over all inputs)
    copy: npt.NDArray[np.int32]  # 0 for the row itself, k for its k-th repeat
    split: npt.NDArray[np.int8]  # 0 train, 1 eval
    key: U64  # seeded order key: outputs are written in ascending (key, row, copy)


def split_counts(
    counts: Mapping[str, int],
    unique: Mapping[str, int],
    fraction: float,
    caps: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Eval rows per group: ``round(fraction * total)`` spread in proportion to ``counts``,
    each at most the group's unique selected rows less one (eval rows are never repeats), or
    ``caps`` when given."""
    total = sum(counts.values())
    want = round(fraction * total)
    if want <= 0:
        return dict.fromkeys(counts, 0)
    if caps is None:
        caps = {g: max(unique[g] - 1, 0) if counts[g] > 1 else 0 for g in counts}
    return largest_remainder({g: fraction * c for g, c in counts.items()}, want, caps)


def _spread(extra: int, n: int) -> I64:
    """Copies per row that spread ``extra`` copies over ``n`` rows, the first rows first."""
    reps = np.full(n, extra // n, dtype=np.int64)
    reps[: extra % n] += 1
    return reps


def select(
    rows: I64,
    groups: npt.NDArray[np.int32],
    content_hash: U64,
    counts: Mapping[int, int],
    *,
    seed: int,
    eval_fraction: float,
    cyclic: bool = False,
) -> Selection:
    """Choose the output rows among candidate ``rows`` (unique, in a mix group).

    ``counts`` maps group code -> output rows. Each group takes its ``min(count, supply)``
    lowest-ranked rows (rank = seeded hash of the content hash), sends the lowest eval-ranked of
    them to eval, and fills any excess count with repeats of its train rows, spread evenly.
    ``cyclic`` (tokens mode): the excess goes round the rank order instead (row 1's second copy,
    row 2's, ...; then third copies), the order the token plan counted, and eval rows come only
    from the rows left without a copy.
    """
    erank = mix64(content_hash ^ salt(seed, "eval"))
    order = selection_order(rows, groups, content_hash, seed)
    rows, groups, content_hash = rows[order], groups[order], content_hash[order]
    erank = erank[order]
    codes = sorted(counts)
    starts = np.searchsorted(groups, np.asarray(codes, dtype=np.int32), side="left")
    ends = np.searchsorted(groups, np.asarray(codes, dtype=np.int32), side="right")
    unique = {c: min(counts[c], int(e - s)) for c, s, e in zip(codes, starts, ends, strict=True)}
    caps = None
    if cyclic:  # rows without a copy, less one
        caps = {
            str(c): max(min(unique[c] - max(counts[c] - unique[c], 0), unique[c] - 1), 0)
            for c in codes
        }
    evals = split_counts(
        {str(c): counts[c] for c in codes},
        {str(c): unique[c] for c in codes},
        eval_fraction,
        caps,
    )
    out_rows: list[I64] = []
    out_copy: list[npt.NDArray[np.int32]] = []
    out_split: list[npt.NDArray[np.int8]] = []
    out_hash: list[U64] = []
    for c, s in zip(codes, starts, strict=True):
        m = unique[c]
        if m == 0:
            continue
        chosen = slice(int(s), int(s) + m)
        g_rows, g_hash = rows[chosen], content_hash[chosen]
        e = evals[str(c)]
        split = np.zeros(m, dtype=np.int8)
        extra = counts[c] - m
        if cyclic:
            reps = _spread(max(extra, 0), m)
            if e:  # the lowest eval-ranked of the rows without a copy
                free = np.flatnonzero(reps == 0)
                pick = np.lexsort((g_rows[free], erank[chosen][free]))[:e]
                split[free[pick]] = 1
        elif e:
            split[np.lexsort((g_rows, erank[chosen]))[:e]] = 1
        out_rows.append(g_rows)
        out_copy.append(np.zeros(m, dtype=np.int32))
        out_split.append(split)
        out_hash.append(g_hash)
        train = np.flatnonzero(split == 0)  # in rank order
        if cyclic and extra > 0:
            sources = np.arange(m)
        elif extra > 0 and len(train):
            sources, reps = train, _spread(extra, len(train))
        else:
            continue
        src = np.repeat(sources, reps)
        first = np.repeat(np.cumsum(reps) - reps, reps)
        k = (np.arange(len(src)) - first + 1).astype(np.int32)  # copy 1..reps of each row
        out_rows.append(g_rows[src])
        out_copy.append(k)
        out_split.append(np.zeros(len(src), dtype=np.int8))
        out_hash.append(g_hash[src])
    if not out_rows:
        empty = np.zeros(0, dtype=np.int64)
        return Selection(empty, np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0, np.uint64))
    all_rows = np.concatenate(out_rows)
    all_copy = np.concatenate(out_copy)
    all_split = np.concatenate(out_split)
    all_hash = np.concatenate(out_hash)
    with np.errstate(over="ignore"):
        key = mix64(all_hash ^ salt(seed, "order") ^ mix64(all_copy.astype(np.uint64) * _GOLDEN))
    by_row = np.lexsort((all_copy, all_rows))
    return Selection(all_rows[by_row], all_copy[by_row], all_split[by_row], key[by_row])


def eval_rows(
    rows: I64,
    groups: npt.NDArray[np.int32],
    content_hash: U64,
    kept: Mapping[int, int],
    *,
    seed: int,
    fraction: float,
) -> npt.NDArray[np.bool_]:
    """The eval split, taken before any copy (module docstring): a mask over the candidate
    ``rows``. ``kept`` maps group code -> the unique rows a plan on all candidates keeps (the
    first ones in ``selection_order``); eval takes ``round(fraction * sum(kept))`` of them,
    spread over the groups in proportion to ``kept`` (at most all but one of a group's), each
    group's lowest eval-ranked of its kept rows."""
    out = np.zeros(len(rows), dtype=bool)
    codes = sorted(c for c, n in kept.items() if n > 0)
    if fraction <= 0 or not codes:
        return out
    want = split_counts(
        {str(c): kept[c] for c in codes}, {str(c): kept[c] for c in codes}, fraction
    )
    order = selection_order(rows, groups, content_hash, seed)
    erank = mix64(content_hash ^ salt(seed, "eval"))
    sorted_groups = groups[order]
    for c in codes:
        e = want[str(c)]
        if not e:
            continue
        start = int(np.searchsorted(sorted_groups, np.int32(c), side="left"))
        first = order[start : start + kept[c]]  # the rows the plan keeps first
        pick = first[np.lexsort((rows[first], erank[first]))[:e]]
        out[pick] = True
    return out


def with_eval(sel: Selection, rows: I64, content_hash: U64, *, seed: int) -> Selection:
    """``sel`` (the train rows and their copies) plus the eval ``rows`` (no copies), each
    with its seeded order key, sorted by row as ``select`` returns them."""
    if not len(rows):
        return sel
    with np.errstate(over="ignore"):
        key = mix64(content_hash ^ salt(seed, "order") ^ mix64(np.zeros(len(rows), np.uint64)))
    all_rows = np.concatenate((sel.row, rows.astype(np.int64)))
    all_copy = np.concatenate((sel.copy, np.zeros(len(rows), np.int32)))
    all_split = np.concatenate((sel.split, np.ones(len(rows), np.int8)))
    all_key = np.concatenate((sel.key, key))
    by_row = np.lexsort((all_copy, all_rows))
    return Selection(all_rows[by_row], all_copy[by_row], all_split[by_row], all_key[by_row])


def bucket_of(key: U64, buckets: int) -> npt.NDArray[np.int64]:
    """The bucket of each order key: ``floor(key * buckets / 2**64)``, monotone in the key, so
    buckets read in order and sorted inside give the global key order."""
    top = (key >> np.uint64(32)).astype(np.uint64)
    with np.errstate(over="ignore"):
        return ((top * np.uint64(buckets)) >> np.uint64(32)).astype(np.int64)
