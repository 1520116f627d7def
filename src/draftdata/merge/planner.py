"""merge's plan phase: pass 1's keys -> dedup, the mix's groups, the plan, the rows chosen.

``plan_output`` takes every row's keys (id and content hashes, domain, size, loss tokens) and
decides, in order: the duplicates (``plan.dedup``), the groups of the mix (its domains, ``other``
pooling the rest), the unit it is planned in (loss tokens, or rows), the eval split (taken first,
from a plan on every row), the train plan (``plan.solve_counts`` / ``tokenplan``), the ways out
of a plan that keeps too little, the rows and copies chosen in their seeded order, and the
external shuffle's geometry (``RoutePlan``). The plan shown (``MergePlan``) goes to ``on_plan``
before anything is written. The decisions themselves live in ``plan.py`` and ``tokenplan.py``;
this module holds the rows they decide over and reads nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from draftdata.merge.config import MergeConfig
from draftdata.merge.inputs import (
    Family,
    InputInfo,
    Keys,
)
from draftdata.merge.plan import (
    Allocation,
    Selection,
    bucket_of,
    dedup,
    eval_rows,
    select,
    selection_order,
    solve_counts,
    solve_tokens,
    with_eval,
)
from draftdata.merge.tokenplan import MAX_NODES, TokenPlan
from draftdata.shared.mix import OTHER, normalised
from draftdata.store.merge_report import (
    EvalPlan,
    MergePlan,
    PlanDomain,
    Splits,
    TokenCounts,
    WayOut,
)
from draftdata.support.metrics import StageStats

# --tolerance values tried for the ways out of a plan that keeps too little
_LOOSER = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
_HINT_NODES = 3000  # search budget of each alternative plan (a hint, not the plan itself)

OnPlan = Callable[[MergePlan], None]


@dataclass
class RoutePlan:
    keys_domain: npt.NDArray[np.int32]
    size: npt.NDArray[np.int64]
    domain_names: list[str]
    selection: Selection
    buckets: npt.NDArray[np.int64]
    nbuckets: dict[int, int]
    rows_per_shard: dict[int, int]
    copy_suffix: str = "~r"  # a copy's id: the row's id, this, its copy number (inputs.Keys)


def _counts(names: list[str], codes: npt.NDArray[np.int32]) -> dict[str, int]:
    if not len(codes):
        return {}
    found = np.bincount(codes, minlength=len(names))
    return {names[i]: int(found[i]) for i in np.argsort(names) if found[i]}


def _sums(
    names: list[str], codes: npt.NDArray[np.int32], weights: npt.NDArray[np.int64]
) -> dict[str, int]:
    # like _counts, summing ``weights`` (e.g. loss tokens) instead of counting rows
    if not len(codes):
        return {}
    found = np.zeros(len(names), dtype=np.int64)
    np.add.at(found, codes, weights)
    counted = np.bincount(codes, minlength=len(names))
    return {names[i]: int(found[i]) for i in np.argsort(names) if counted[i]}


def _kept_share(keep: dict[str, int], have: dict[str, int]) -> float:
    """The share of what the inputs have that the plan keeps (distinct), 1 of nothing."""
    total = sum(have.values())
    return sum(keep.values()) / total if total else 1.0


def _plan_doc(
    config: MergeConfig,
    split: _Split,
    planner: _Planner,
    *,
    note: str | None,
    ways_out: list[WayOut] | None,
    eval_plan: EvalPlan,
    family: Family,
) -> MergePlan:
    """The plan as shown before anything is written and kept in the report: per group what
    the inputs have, what the plan keeps (distinct), its copies, what it drops, its share of
    the output and its target, and its share if everything were kept (all in the plan's
    unit)."""
    alloc, (supply, _) = split.alloc, split.pool
    have = planner.have(split.pool)
    keep, kept = planner.kept_of(alloc, split.pool)
    total_have = sum(have.values())
    aimed = alloc.target if config.mix else {}  # without a mix nothing is aimed at
    domains = {
        g: PlanDomain(
            have=have.get(g, 0),
            keep=keep.get(g, 0),
            copies=kept.get(g, 0) - keep.get(g, 0),
            drop=have.get(g, 0) - keep.get(g, 0),
            share=round(alloc.achieved.get(g, 0.0), 6),
            target=aimed.get(g),
            all_kept_share=round(have.get(g, 0) / total_have, 6) if total_have else 0.0,
            rows=supply.get(g, 0),
            rows_out=alloc.counts.get(g, 0),
        )
        for g in sorted(set(have) | set(aimed))
    }
    kept_share = _kept_share(keep, have)
    tokens = split.tokens
    return MergePlan(
        unit=planner.unit,
        domains=domains,
        have=total_have,
        keep=sum(keep.values()),
        out=sum(kept.values()),
        kept_share=round(kept_share, 6),
        min_keep=config.min_keep,
        tolerance=config.tolerance,
        upsample=config.upsample,
        # the share as shown and as the ways out are judged (rounded), so a plan that stops
        # always has its ways out
        stops=bool(alloc.target)
        and round(kept_share, 6) < config.min_keep
        and not config.allow_drop,
        note=note,
        optimal=tokens.optimal if tokens is not None else None,
        bound=tokens.bound if tokens is not None else None,
        ways_out=ways_out,
        eval=eval_plan,
        estimated=family == "chat",  # tokens of text, not of tokenized samples
        method=_method(config, family),
    )


def _method(config: MergeConfig, family: Family) -> str:
    """How loss tokens were counted: exact (tokenized samples), tokenizer or estimate."""
    return "exact" if family == "samples" else ("tokenizer" if config.tokenizer else "estimate")


def _ways_out(
    config: MergeConfig, solve: Callable[[float, bool, int], float], kept_share: float
) -> list[WayOut]:
    """What else keeps at least ``min_keep``, each with the share it keeps, and only what does
    (a way out the next command would refuse again is none): ``--upsample`` (with a higher
    ``--max-repeat`` where the default is not enough), the smallest looser ``--tolerance``, the
    two together when neither alone is enough, and ``--allow-drop``. When nothing but
    ``--allow-drop`` passes, an entry with ``kept_share`` None says how far the search went."""
    out: list[WayOut] = []

    def first(options: list[tuple[str, float, bool, int]]) -> bool:
        # the first of (option, tolerance, upsample, max_repeat) that keeps enough
        for option, tol, up, repeat in options:
            share = solve(tol, up, repeat)
            if share >= config.min_keep:
                out.append(WayOut(option=option, kept_share=round(share, 6)))
                return True
        return False

    repeats = [r for r in (8, 16, 32, 64) if r > config.max_repeat]
    looser = [t for t in _LOOSER if t > config.tolerance]
    if config.upsample:
        first([(f"--max-repeat {r}", config.tolerance, True, r) for r in repeats])
    else:
        first(
            [("--upsample", config.tolerance, True, config.max_repeat)]
            + [(f"--upsample --max-repeat {r}", config.tolerance, True, r) for r in repeats]
        )
    found = first([(f"--tolerance {t:g}", t, config.upsample, config.max_repeat) for t in looser])
    if not found and not config.upsample and not out:
        found = first(
            [(f"--upsample --tolerance {t:g}", t, True, config.max_repeat) for t in looser]
        )
    if not out and not found:
        out.append(WayOut(option=f"--tolerance {_LOOSER[-1]:g}", kept_share=None))
    out.append(WayOut(option="--allow-drop", kept_share=round(kept_share, 6)))
    return out


def stop_message(plan: MergePlan) -> str:
    unit = "loss tokens" if plan.unit == "loss_tokens" else "rows"
    ways = []
    for w in plan.ways_out or []:
        if w.option == "--allow-drop":
            ways.append("--allow-drop to write this plan")
        elif w.kept_share is None:
            ways.append(f"no --upsample or --tolerance up to {w.option.split()[-1]} keeps enough")
        else:
            ways.append(f"{w.option} keeps {100 * w.kept_share:.0f}%")
    return (
        f"merge: the plan keeps {100 * plan.kept_share:.1f}% of the {unit} the mix could use "
        f"({plan.keep:,} of {plan.have:,}; --min-keep {plan.min_keep:g}); nothing "
        f"written; ways out: {'; '.join(ways)}"
    )


@dataclass
class _Rows:
    """Pass 1's keys of every row, one array each, in input order (row ``i`` of the inputs)."""

    id_hash: npt.NDArray[np.uint64]
    content: npt.NDArray[np.uint64]
    domain: npt.NDArray[np.int32]  # domain code: an index into ``names``
    size: npt.NDArray[np.int64]  # estimated bytes
    valid: npt.NDArray[np.bool_]
    loss: npt.NDArray[np.int64]  # loss tokens
    names: list[str]  # code -> domain name

    @classmethod
    def of(cls, keys: Keys) -> _Rows:
        """The keys' chunks joined; ``keys`` lets go of them."""
        some = bool(keys.id_hash)
        rows = cls(
            id_hash=np.concatenate(keys.id_hash) if some else np.zeros(0, np.uint64),
            content=np.concatenate(keys.content_hash) if some else np.zeros(0, np.uint64),
            domain=np.concatenate(keys.domain) if some else np.zeros(0, np.int32),
            size=np.concatenate(keys.size) if some else np.zeros(0, np.int64),
            valid=np.concatenate(keys.valid) if some else np.zeros(0, bool),
            loss=np.concatenate(keys.loss) if keys.loss else np.zeros(0, np.int64),
            names=list(keys.domains),
        )
        keys.id_hash, keys.content_hash, keys.domain, keys.size, keys.valid = [], [], [], [], []
        keys.loss = []
        return rows


# a pool of rows to plan over: (unique rows per group, each group's loss tokens in selection
# order)
Pool = tuple[dict[str, int], dict[str, npt.NDArray[np.int64]]]


@dataclass(frozen=True)
class _Split:
    """A plan with its eval split: the eval rows, the unique rows per group (code) they are
    stratified over, the train rows, their pool, the train plan and its token plan."""

    held: npt.NDArray[np.intp]
    kept: dict[int, int]
    train: npt.NDArray[np.intp]
    pool: Pool
    alloc: Allocation
    tokens: TokenPlan | None


class _Planner:
    """The mix's plans over the unique rows of its groups (``candidates``): the one merge
    writes and the ones its ways out would write. The decisions are ``plan.py``'s and
    ``tokenplan.py``'s; this holds the rows they decide over."""

    def __init__(
        self,
        config: MergeConfig,
        unit: str,
        groups: list[str],
        group: npt.NDArray[np.int32],
        rows: _Rows,
        candidates: npt.NDArray[np.intp],
    ) -> None:
        self.config = config
        self.unit = unit  # loss_tokens or rows
        self.target = normalised(config.mix)
        self.groups = groups
        self.group_ix = {g: i for i, g in enumerate(groups)}
        self.group = group  # row -> group code, -1 when the mix does not take it
        self.content = rows.content
        self.loss = rows.loss
        self.candidates = candidates
        self.everything = self.pool(candidates)

    def pool(self, rows: npt.NDArray[np.intp]) -> Pool:
        """The pool of ``rows``."""
        group, seed = self.group, self.config.seed
        codes = np.bincount(group[rows], minlength=len(self.groups))
        order = selection_order(rows.astype(np.int64), group[rows], self.content[rows], seed)
        bounds = np.searchsorted(
            group[rows][order], np.arange(len(self.groups) + 1, dtype=np.int32)
        )
        return {g: int(codes[i]) for i, g in enumerate(self.groups)}, {
            g: self.loss[rows[order[bounds[i] : bounds[i + 1]]]].astype(np.int64)
            for i, g in enumerate(self.groups)
        }

    def solve(
        self, at: Pool, tolerance: float, upsample: bool, repeat: int, nodes: int
    ) -> tuple[Allocation, TokenPlan | None]:
        """The plan of the pool ``at`` in the planner's unit."""
        supply, weights = at
        if self.unit == "rows":
            alloc = solve_counts(
                supply, self.target, tolerance=tolerance, upsample=upsample, max_repeat=repeat
            )
            return alloc, None
        return solve_tokens(
            weights,
            self.target,
            tolerance=tolerance,
            upsample=upsample,
            max_repeat=repeat,
            max_nodes=nodes,
        )

    def have(self, at: Pool) -> dict[str, int]:
        """What the pool has per group, in the planner's unit."""
        supply, weights = at
        return supply if self.unit == "rows" else {g: int(w.sum()) for g, w in weights.items()}

    def kept_of(self, alloc: Allocation, at: Pool) -> tuple[dict[str, int], dict[str, int]]:
        """What a plan keeps per group in the planner's unit: (distinct, with copies)."""
        supply, weights = at
        if self.unit == "rows":
            distinct = {g: min(n, supply.get(g, 0)) for g, n in alloc.counts.items()}
            return distinct, dict(alloc.counts)
        out: dict[str, int] = {}
        distinct = {}
        for g, n in alloc.counts.items():
            w = weights[g]
            reps, rest = divmod(n, len(w)) if len(w) else (0, 0)
            out[g] = int(w.sum()) * reps + int(w[:rest].sum())
            distinct[g] = int(w[: min(n, len(w))].sum())
        return distinct, out

    def planned(self, tolerance: float, upsample: bool, repeat: int, nodes: int) -> _Split:
        """The eval split is taken first, from a plan on every row, before any copy; the train
        split is planned on the rest (plan.py)."""
        rows, everything = self.candidates, self.everything
        if self.config.eval_fraction <= 0 or not len(rows):
            alloc, tokens = self.solve(everything, tolerance, upsample, repeat, nodes)
            return _Split(rows[:0], {}, rows, everything, alloc, tokens)
        first, _ = self.solve(everything, tolerance, upsample, repeat, MAX_NODES)
        kept = {self.group_ix[g]: min(n, everything[0].get(g, 0)) for g, n in first.counts.items()}
        mask = eval_rows(
            rows.astype(np.int64),
            self.group[rows],
            self.content[rows],
            kept,
            seed=self.config.seed,
            fraction=self.config.eval_fraction,
        )
        train = rows[~mask]
        at = self.pool(train)
        alloc, tokens = self.solve(at, tolerance, upsample, repeat, nodes)
        return _Split(rows[mask], kept, train, at, alloc, tokens)

    def share_of(self, tolerance: float, upsample: bool, repeat: int) -> float:
        """What the next command with these settings keeps: its own eval split (from a full
        plan, as it will take it), then its train plan (searched less far: a lower bound of
        what it finds)."""
        other = self.planned(tolerance, upsample, repeat, _HINT_NODES)
        return _kept_share(self.kept_of(other.alloc, other.pool)[0], self.have(other.pool))

    def eval_plan(self, split: _Split) -> EvalPlan:
        """The eval split, set aside before the plan: rows per group, of the unique rows kept
        by a plan on every row (what it is stratified over)."""
        return EvalPlan(
            rows=_counts(self.groups, self.group[split.held]),
            kept={self.groups[c]: n for c, n in sorted(split.kept.items()) if n},
            of_rows=sum(split.kept.values()),
        )

    def selection(self, split: _Split) -> Selection:
        """The rows (and copies) of the plan, in their seeded order, the eval rows with them."""
        rows, seed = split.train, self.config.seed
        sel = select(
            rows.astype(np.int64),
            self.group[rows],
            self.content[rows],
            {self.group_ix[g]: n for g, n in split.alloc.counts.items()},
            seed=seed,
            eval_fraction=0.0,
            cyclic=self.unit == "loss_tokens",
        )
        held = split.held
        return with_eval(sel, held.astype(np.int64), self.content[held], seed=seed)


def _groups(
    target: dict[str, float], names: list[str], domain: npt.NDArray[np.int32]
) -> tuple[list[str], npt.NDArray[np.int32], list[str]]:
    """The mix's groups (its domains, or every domain without a mix), each row's group code
    (-1 when the mix does not take it), and the domains pooled into ``other``."""
    groups = sorted(target) if target else sorted(set(names))
    group_ix = {g: i for i, g in enumerate(groups)}
    to_group = np.full(max(len(names), 1), -1, dtype=np.int32)  # domain code -> group code
    pooled: list[str] = []
    for code, name in enumerate(names):
        if name in group_ix:
            to_group[code] = group_ix[name]
        elif OTHER in group_ix:
            to_group[code] = group_ix[OTHER]
            pooled.append(name)
    group = to_group[domain] if len(domain) else np.zeros(0, np.int32)
    return groups, group, sorted(pooled)


@dataclass(frozen=True)
class Planned:
    """What the plan phase decided (the routing plan, the allocation, the plan shown) and the
    counts the report gives."""

    plan: RoutePlan
    alloc: Allocation
    doc: MergePlan
    before: dict[str, int]
    available: dict[str, int]
    after: Splits
    dropped: dict[str, int]
    upsampled: dict[str, int]
    pooled: list[str]
    total_unique: int
    tokens: TokenCounts


def plan_output(
    config: MergeConfig,
    infos: list[InputInfo],
    keys: Keys,
    family: Family,
    stats: StageStats,
    on_plan: OnPlan | None,
) -> Planned:
    """Dedup, the mix's groups, the plan (its eval split first), the selection of rows and
    copies and the shuffle's geometry; the plan goes to ``on_plan``."""
    rows = _Rows.of(keys)
    keep, dup_id, dup_content = dedup(
        rows.id_hash, rows.content, rows.valid, by_id=config.dedup_ids
    )
    for info in infos:
        part = slice(info.first_row, info.first_row + info.scanned)
        info.dropped = {
            "duplicate_id": int(dup_id[part].sum()),
            "duplicate_content": int(dup_content[part].sum()),
        }
    target = normalised(config.mix)
    groups, group, pooled = _groups(target, rows.names, rows.domain)
    in_mix = keep & (group >= 0)
    candidates = np.flatnonzero(in_mix)  # the unique rows of the mix's groups
    unit = "loss_tokens" if config.mix_by == "tokens" and target else "rows"
    note = None
    if unit == "loss_tokens" and not rows.loss[candidates].any():
        unit, note = "rows", "the inputs hold no answers (no loss tokens): mixed by rows"
    planner = _Planner(config, unit, groups, group, rows, candidates)
    split = planner.planned(config.tolerance, config.upsample, config.max_repeat, MAX_NODES)
    ways_out = None
    keep_share = _kept_share(planner.kept_of(split.alloc, split.pool)[0], planner.have(split.pool))
    if target and round(keep_share, 6) < config.min_keep:
        ways_out = _ways_out(config, planner.share_of, round(keep_share, 6))
    doc = _plan_doc(
        config,
        split,
        planner,
        note=note,
        ways_out=ways_out,
        eval_plan=planner.eval_plan(split),
        family=family,
    )
    sel = planner.selection(split)
    unique_out = int((sel.copy == 0).sum())
    bad = int((~rows.valid).sum()) + sum(i.bad for i in infos if i.dataset.kind != "tokenized")
    dropped = {
        "bad_row": bad,
        "duplicate_id": int(dup_id.sum()),
        "duplicate_content": int(dup_content.sum()),
        "not_in_mix": int((keep & (group < 0)).sum()),
        "over_target": int(in_mix.sum()) - unique_out,
    }
    for reason, n in dropped.items():
        stats.add(f"dropped.{reason}", n)
    if on_plan is not None:
        on_plan(doc)
    return Planned(
        plan=_geometry(config, rows, sel, keys.copy_suffix),
        alloc=split.alloc,
        doc=doc,
        before=_counts(rows.names, rows.domain[rows.valid]),
        available=_counts(rows.names, rows.domain[keep]),
        after=Splits(train=_by_domain(rows, sel, 0), eval=_by_domain(rows, sel, 1)),
        dropped=dropped,
        upsampled=_counts(rows.names, rows.domain[sel.row[sel.copy > 0]]),
        pooled=pooled,
        total_unique=int(keep.sum()),
        tokens=TokenCounts(
            method=_method(config, family),
            before=_sums(rows.names, rows.domain[rows.valid], rows.loss[rows.valid]),
            available=_sums(rows.names, rows.domain[keep], rows.loss[keep]),
            after=Splits(train=_tokens(rows, sel, 0), eval=_tokens(rows, sel, 1)),
        ),
    )


def _by_domain(rows: _Rows, sel: Selection, split: int) -> dict[str, int]:
    return _counts(rows.names, rows.domain[sel.row[sel.split == split]])


def _tokens(rows: _Rows, sel: Selection, split: int) -> dict[str, int]:
    chosen = sel.row[sel.split == split]
    return _sums(rows.names, rows.domain[chosen], rows.loss[chosen])


def _geometry(config: MergeConfig, rows: _Rows, sel: Selection, copy_suffix: str) -> RoutePlan:
    """The external shuffle's geometry: buckets of about bucket_bytes, shards of about
    shard_bytes, per split."""
    est = rows.size[sel.row]
    nbuckets: dict[int, int] = {}
    per_shard: dict[int, int] = {}
    bucket = np.zeros(len(sel.row), dtype=np.int64)
    for s in (0, 1):
        mask = sel.split == s
        n, nbytes = int(mask.sum()), int(est[mask].sum())
        nbuckets[s] = max(1, math.ceil(nbytes / config.bucket_bytes))
        avg = max(1, nbytes // max(n, 1))
        per_shard[s] = max(1, min(config.shard_rows, config.shard_bytes // avg))
        bucket[mask] = bucket_of(sel.key[mask], nbuckets[s])
    return RoutePlan(
        rows.domain, rows.size, rows.names, sel, bucket, nbuckets, per_shard, copy_suffix
    )
