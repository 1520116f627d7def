"""The merge stage: existing + added datasets -> one deduplicated, mixed, shuffled, split set.

``merge(config)`` runs in two passes over the inputs so memory stays bounded:

1. scan: per row only (id hash, content hash, domain code, size estimate, loss tokens) in
   numpy arrays; then dedup, the per-domain counts for the mix (in loss tokens by default:
   ``tokenplan.py``; or rows), which rows (and repeats) go where, and a seeded order key per
   output row (``plan.py``). The plan goes to ``on_plan`` here, before anything is written;
   ``--plan-only`` stops after it, and so does a plan keeping less than ``--min-keep``;
2. route: read the inputs again and append each chosen row to a hashed bucket in a temp
   folder; then sort bucket by bucket and write shards (``shuffle.py``).

Output (create-only, local or ``s3://``; the location must be empty, or hold a killed merge of
the same inputs and settings, which this one finishes: ``resume.py``)::

    out/merge_config.json                 before the first shard: settings and input files
    out/train/part-00000.parquet ...      sample/1 (tokenized) or conversation/1 (chat) rows
    out/eval/part-00000.parquet ...
    out/<format>/{train,eval}set-*.jsonl  the trainers' JSONL (--format other than parquet;
                                          merge/jsonl.py)
    out/README.md                         dataset card: ``load_dataset(out)`` -> train, eval
    out/merge_report.json                 written last: the run is complete when it exists

The same inputs, config and seed give byte-identical files (no clocks or paths of the output in
them). This module does I/O and bookkeeping; the decisions live in ``plan.py`` and
``tokenplan.py``. ``--mix`` domains no input holds are refused before pass 1 when the
classifier never gives them (only the rows' labels are read, ``check_named_domains``), else
right after it.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from draftdata.domains import DOMAINS
from draftdata.errors import ConfigError, disk_errors
from draftdata.formats import MERGE_REPORT, SAMPLE_SCHEMA
from draftdata.merge.config import MergeConfig, check_config
from draftdata.merge.inputs import (
    Family,
    InputInfo,
    Keys,
    Workers,
    iter_chat_rows,
    iter_sample_tables,
    open_inputs,
    scan,
)
from draftdata.merge.jsonl import CHAT_FORMATS, SAMPLE_FORMATS, jsonl_key
from draftdata.merge.jsonl import left_out as jsonl_left_out
from draftdata.merge.jsonl import lines as jsonl_lines
from draftdata.merge.models import all_models, check_models, input_models
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
from draftdata.merge.resume import check_output, claim_output, config_bytes
from draftdata.merge.shuffle import COPY, KEY, ROW, Buckets, ShardWriter, bucket_schema
from draftdata.merge.tokenplan import MAX_NODES, TokenPlan
from draftdata.metrics import StageStats
from draftdata.mix import OTHER, normalised
from draftdata.stats.conversations import CONVERSATION_SCHEMA, conversation_row
from draftdata.stats.readers import iter_domain_labels, refuse_unreadable
from draftdata.store.base import Store
from draftdata.store.merge_report import (
    REPORT_VERSION,
    EvalPlan,
    InputReport,
    MergePlan,
    MergeReport,
    MergeSettings,
    PlanDomain,
    SplitRows,
    Splits,
    TokenCounts,
    WayOut,
    dump_report,
)
from draftdata.store.opener import open_store
from draftdata.store.protect import check_not_protected
from draftdata.tokenizer_folder import check_tokenizer_folder
from draftdata.tokens import counter

CARD_KEY = "README.md"
SPLITS = ("train", "eval")
DROP_REASONS = ("bad_row", "duplicate_id", "duplicate_content", "not_in_mix", "over_target")
_FLUSH_ROWS = 1024  # rows buffered per bucket before an IPC write (chat rows)
_BATCH_BYTES = 32 << 20  # pass-2 read batches and all chat buffers together stay near this
_POOL_MIN_BYTES = 32 << 20  # chat inputs smaller than this are classified in-process

# --tolerance values tried for the ways out of a plan that keeps too little
_LOOSER = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
_HINT_NODES = 3000  # search budget of each alternative plan (a hint, not the plan itself)

Progress = Callable[[str, int], None]
OnPlan = Callable[[MergePlan], None]


@dataclass(frozen=True)
class MergeSummary:
    """What ``merge`` did: where the output is, its rows and files, and the full report."""

    out: str
    report: MergeReport
    train_rows: int
    eval_rows: int
    files: list[str]
    elapsed_s: float
    stats: StageStats = field(repr=False)

    @property
    def reachable(self) -> bool:
        """Whether the inputs could serve every domain of the target mix."""
        return self.report.reachable

    @property
    def message(self) -> str | None:
        """The warning to show (mix not reachable), or None."""
        return self.report.message or None


@dataclass
class _Plan:
    keys_domain: npt.NDArray[np.int32]
    size: npt.NDArray[np.int64]
    domain_names: list[str]
    selection: Selection
    buckets: npt.NDArray[np.int64]
    nbuckets: dict[int, int]
    rows_per_shard: dict[int, int]
    copy_suffix: str = "~r"  # a copy's id: the row's id, this, its copy number (inputs.Keys)


def _workers(config: MergeConfig, family: Family, infos: list[InputInfo]) -> int:
    # processes for pass 1's classifier: only chat rows need them, and only big inputs pay
    # for starting them
    if family != "chat" or config.workers == 1:
        return 1
    if config.workers > 1:
        return config.workers
    size = sum(i.dataset.store.size(k) for i in infos for k in i.dataset.keys)
    return min(os.cpu_count() or 1, 8) if size > _POOL_MIN_BYTES else 1


def _counts(names: list[str], codes: npt.NDArray[np.int32]) -> dict[str, int]:
    if not len(codes):
        return {}
    found = np.bincount(codes, minlength=len(names))
    return {names[i]: int(found[i]) for i in np.argsort(names) if found[i]}


def _fmt_share(x: float) -> str:
    return f"{100 * x:.1f}%"


def _message(target: dict[str, float], alloc: Allocation, total_unique: int) -> str | None:
    if not target:
        return None
    achieved = ", ".join(
        f"{g} {_fmt_share(alloc.achieved.get(g, 0.0))} (target {_fmt_share(t)})"
        for g, t in target.items()
    )
    if alloc.missing:
        what = ", ".join(f"{g} (target {_fmt_share(target[g])})" for g in alloc.missing)
        return (
            f"cannot reach the mix: the inputs have no rows of {what}; closest achieved mix, "
            f"the other domains keeping their relative targets: {achieved}"
        )
    if alloc.total == 0 and total_unique:
        return "cannot reach the mix: no rows of the mix's domains"
    return None


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


def check_named_domains(target: dict[str, float], infos: list[InputInfo]) -> None:
    """Before pass 1: refuse a ``--mix`` domain that is neither one the classifier gives nor
    ``other`` nor a label some input row carries (reading only the labels, and only when the mix
    names such a domain). ConfigError naming the domains there are."""
    odd = sorted(set(target) - set(DOMAINS) - {OTHER})
    if not odd:
        return
    labels: Counter[str] = Counter()
    for info in infos:
        labels.update(x for x in iter_domain_labels(info.dataset) if x)
    unknown = [d for d in odd if not labels.get(d)]
    if unknown:
        found = ", ".join(f"{d} ({n:,} rows)" for d, n in sorted(labels.items())) or "none"
        raise ConfigError(
            f"--mix: no input holds domain {', '.join(unknown)}; the domains are "
            f"{', '.join(DOMAINS)} (rows without a label are classified into these) and the "
            f"inputs' own labels: {found}; fix the name, or pool unnamed domains with other=SHARE"
        )


def _check_held(target: dict[str, float], infos: list[InputInfo]) -> None:
    """After pass 1, before anything is planned or written: refuse ``--mix`` domains no input
    holds (and ``other`` when the mix names every domain there is)."""
    held: Counter[str] = Counter()
    for info in infos:
        held.update(info.by_domain)
    unknown = [
        d
        for d in target
        if (d == OTHER and not set(held) - set(target)) or (d != OTHER and not held.get(d))
    ]
    if unknown:
        found = ", ".join(f"{d} {n:,}" for d, n in sorted(held.items())) or "no rows"
        raise ConfigError(
            f"--mix: no input holds {', '.join(sorted(unknown))} (rows by domain: {found}); "
            "drop it from --mix or add data of it"
            + ("; other= pools only domains --mix does not name" if OTHER in unknown else "")
        )


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
        stops=bool(alloc.target) and kept_share < config.min_keep and not config.allow_drop,
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


def _stop_message(plan: MergePlan) -> str:
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
class _Planned:
    """What the plan phase decided (the routing plan, the allocation, the plan shown) and the
    counts the report gives."""

    plan: _Plan
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


def _plan_output(
    config: MergeConfig, scanned: _Scanned, stats: StageStats, on_plan: OnPlan | None
) -> _Planned:
    """Dedup, the mix's groups, the plan (its eval split first), the selection of rows and
    copies and the shuffle's geometry; the plan goes to ``on_plan``."""
    infos, rows = scanned.infos, _Rows.of(scanned.keys)
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
        family=scanned.family,
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
    return _Planned(
        plan=_geometry(config, rows, sel, scanned.keys.copy_suffix),
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
            method=_method(config, scanned.family),
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


def _geometry(config: MergeConfig, rows: _Rows, sel: Selection, copy_suffix: str) -> _Plan:
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
    return _Plan(rows.domain, rows.size, rows.names, sel, bucket, nbuckets, per_shard, copy_suffix)


def _route_samples(info: InputInfo, plan: _Plan, buckets: Buckets) -> None:
    sel = plan.selection
    names = np.asarray(plan.domain_names, dtype=object)
    g = info.first_row
    # batches of about _BATCH_BYTES, whatever the sample length
    sizes = plan.size[info.first_row : info.first_row + info.scanned]
    avg = int(sizes.mean()) if len(sizes) else 1
    batch_rows = max(256, min(65536, _BATCH_BYTES // max(avg, 1)))
    for table in iter_sample_tables(info, batch_rows):
        n = table.num_rows
        lo, hi = np.searchsorted(sel.row, [g, g + n])
        g += n
        if lo == hi:
            continue
        rows, copy = sel.row[lo:hi], sel.copy[lo:hi]
        sub = table.take(pa.array(rows - (g - n)))
        domains = pa.array(names[plan.keys_domain[rows]].tolist(), pa.string())
        ids = sub.column("id")
        if (copy > 0).any():
            base = ids.to_pylist()
            ids = pa.array(
                [
                    f"{b}{plan.copy_suffix}{k}" if k else b
                    for b, k in zip(base, copy.tolist(), strict=True)
                ],
                pa.string(),
            )
        sub = sub.set_column(sub.schema.get_field_index("id"), "id", ids)
        sub = sub.set_column(sub.schema.get_field_index("domain"), "domain", domains)
        sub = sub.append_column(KEY, pa.array(sel.key[lo:hi], pa.uint64()))
        sub = sub.append_column(ROW, pa.array(rows, pa.int64()))
        sub = sub.append_column(COPY, pa.array(copy, pa.int32()))
        sub = sub.replace_schema_metadata(None)
        split, bucket = sel.split[lo:hi], plan.buckets[lo:hi]
        route = split.astype(np.int64) * (1 << 40) + bucket
        order = np.argsort(route, kind="stable")
        route = route[order]
        cuts = np.flatnonzero(np.diff(route)) + 1
        for part in np.split(np.arange(len(order)), cuts):
            r = int(route[part[0]])
            buckets.write(r >> 40, r & ((1 << 40) - 1), sub.take(pa.array(order[part])))


def _route_chat(info: InputInfo, plan: _Plan, buckets: Buckets) -> None:
    sel = plan.selection
    schema = buckets.schema
    pending: dict[tuple[int, int], list[dict[str, Any]]] = {}
    p = int(np.searchsorted(sel.row, info.first_row))
    end = len(sel.row)
    rows, copies, splits, keys, bks = (
        sel.row.tolist(),
        sel.copy.tolist(),
        sel.split.tolist(),
        sel.key.tolist(),
        plan.buckets.tolist(),
    )
    g = info.first_row
    held = 0  # estimated bytes in all pending buffers

    def flush_all() -> None:
        for k, buf in sorted(pending.items()):
            if buf:
                buckets.write(k[0], k[1], pa.Table.from_pylist(buf, schema=schema))
        pending.clear()

    for conv in iter_chat_rows(info):
        while p < end and rows[p] == g:
            domain = plan.domain_names[int(plan.keys_domain[g])]
            row = conversation_row(conv, domain=domain)
            if copies[p]:
                row["id"] = f"{conv.id}{plan.copy_suffix}{copies[p]}"
            row[KEY], row[ROW], row[COPY] = keys[p], g, copies[p]
            k = (splits[p], bks[p])
            buf = pending.setdefault(k, [])
            buf.append(row)
            held += int(plan.size[g])
            if len(buf) >= _FLUSH_ROWS:
                buckets.write(k[0], k[1], pa.Table.from_pylist(buf, schema=schema))
                held -= sum(int(plan.size[r[ROW]]) for r in buf)
                pending[k] = []
            elif held >= _BATCH_BYTES:
                flush_all()
                held = 0
            p += 1
        g += 1
    flush_all()


def _jsonl_writer(
    store: Store, keys: list[str], fmt: str, left: Counter[str]
) -> Callable[[pa.Table, str, int], None]:
    def write(shard: pa.Table, split: str, index: int) -> None:
        out = []
        for r in shard.to_pylist():
            why = jsonl_left_out(fmt, r)
            if why is None:
                out.extend(jsonl_lines(fmt, r))
            else:
                left[why] += 1
        key = jsonl_key(fmt, split, index)
        store.put_new(key, b"".join(line + b"\n" for line in out))
        keys.append(key)

    return write


def dataset_card(report: MergeReport) -> str:
    """``README.md`` of the output: a Hugging Face dataset card whose ``configs`` make
    ``load_dataset(out)`` return ``train`` and ``eval`` splits, plus the mix in one table."""
    after = report.after
    domains = sorted(set(after.train) | set(after.eval))
    unit = "loss tokens" if report.mix_by == "loss_tokens" else "rows"
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path: train/*.parquet",
    ]
    if report.rows.eval:
        lines += ["  - split: eval", "    path: eval/*.parquet"]
    lines += [
        "---",
        "",
        "# draftdata merge output",
        "",
        f"{report.rows.train:,} train and {report.rows.eval:,} eval rows of "
        f"{report.data} (seed {report.seed}); details in `merge_report.json`.",
        "",
        f"| domain | train (rows) | eval (rows) | target (share of {unit}) |",
        "|---|---|---|---|",
    ]
    for d in domains:
        t = report.target.get(d)
        share = f"{100 * t:.1f}%" if t is not None else "-"
        lines.append(f"| {d} | {after.train.get(d, 0)} | {after.eval.get(d, 0)} | {share} |")
    return "\n".join(lines) + "\n"


def merge(
    config: MergeConfig, *, progress: Progress | None = None, on_plan: OnPlan | None = None
) -> MergeSummary:
    """Merge ``config``'s inputs into ``config.out`` (see the module docstring); the summary
    carries the report that is also written as ``merge_report.json``.

    The stage in its phases: check the output place, read the inputs (pass 1), plan, write
    (pass 2) and report. The plan (``report.plan``: per domain what the inputs have, what is
    kept and dropped, the shares) goes to ``on_plan`` before anything is written. With
    ``plan_only`` nothing is written and the summary holds the plan; when the plan keeps less
    than ``min_keep`` and ``allow_drop`` is off, ConfigError says so and what would keep more
    (nothing written).

    Raises ConfigError for bad settings or a ``--mix`` domain no input holds (before pass 1
    for names the classifier never gives, after it for the rest), InputError for unreadable or
    mixed inputs, AlreadyExistsError when the output location is not empty (unless it holds a
    killed merge of the same inputs and settings, which is finished), ProtectedPrefixError when
    it equals, contains or lies inside a ``protect`` prefix (before anything is read or
    written).
    """
    check_config(config)
    stats = StageStats("merge")
    store = None if config.plan_only else _open_output(config)
    scanned = _read_inputs(config, stats, progress)
    with stats.timed("plan"):
        planned = _plan_output(config, scanned, stats, on_plan)
    if config.plan_only:
        return _summary(config.out, _report(config, scanned, planned, {}, Counter()), [], stats)
    if planned.doc.stops:
        raise ConfigError(_stop_message(planned.doc))
    assert store is not None
    shards, left = _write(config, store, scanned, planned.plan, stats, progress)
    report = _report(config, scanned, planned, shards, left)
    store.put_new(CARD_KEY, dataset_card(report).encode())
    store.put_new(MERGE_REPORT.name, dump_report(report))
    files = [
        *shards["train"],
        *shards["eval"],
        *(key for k, v in shards.items() if k not in SPLITS for key in v),
        CARD_KEY,
        MERGE_REPORT.name,
    ]
    return _summary(store.url, report, files, stats)


def _summary(out: str, report: MergeReport, files: list[str], stats: StageStats) -> MergeSummary:
    return MergeSummary(
        out=out,
        report=report,
        train_rows=sum(report.after.train.values()),
        eval_rows=sum(report.after.eval.values()),
        files=files,
        elapsed_s=stats.elapsed,
        stats=stats,
    )


def _open_output(config: MergeConfig) -> Store:
    """The output place, checked before anything is read: not protected, and empty or a
    killed merge of the same inputs (``resume.py``)."""
    check_not_protected(config.out, config.protect, what="merge output", describe=True)
    store = open_store(config.out, protect=config.protect)  # every write re-checked
    check_output(store)
    return store


@dataclass
class _Scanned:
    """Pass 1's result: the inputs (in order), their family, the models that answered each,
    every row's keys, and the first few unreadable rows."""

    infos: list[InputInfo]
    family: Family
    models: list[list[str] | None]
    keys: Keys
    bad_examples: list[str]


def _read_inputs(config: MergeConfig, stats: StageStats, progress: Progress | None) -> _Scanned:
    """Open the inputs and refuse what cannot be merged (a bad tokenizer, several target
    models, a format of the other family, a mix domain nobody holds), then pass 1: every
    row's keys."""
    if config.tokenizer is not None:
        check_tokenizer_folder(config.tokenizer)
        counter(config.tokenizer)  # a bad tokenizer fails now, in one line
    infos, family = open_inputs(config.inputs)
    models = input_models(infos)
    check_models(infos, models, config.allow_models)
    if config.format in CHAT_FORMATS and family == "samples":
        raise ConfigError(
            f"--format {config.format}: the inputs are tokenized samples (token ids, no text); "
            "use --format parquet or speculators, or merge the chat data before tokenizing"
        )
    if config.format in SAMPLE_FORMATS and family != "samples":
        raise ConfigError(
            f"--format {config.format}: the inputs are chat rows (no token ids); tokenize "
            "them first, or use --format specforge"
        )
    target = normalised(config.mix)
    check_named_domains(target, infos)
    scanned = _Scanned(infos, family, models, Keys(), [])
    with stats.timed("scan"):
        _scan(config, scanned, progress)
    _check_held(target, infos)
    return scanned


def _scan(config: MergeConfig, scanned: _Scanned, progress: Progress | None) -> None:
    """Pass 1 over every input; an input with nothing readable (a config, a log) is refused
    before going on."""
    infos, family, bad_examples = scanned.infos, scanned.family, scanned.bad_examples

    def on_bad(where: str, reason: str) -> None:
        if len(bad_examples) < 5:
            bad_examples.append(f"{where}: {reason}")

    tokenizer = config.tokenizer if family == "chat" else None
    with Workers(_workers(config, family, infos), tokenizer) as workers:
        for info in infos:
            scan(info, family, scanned.keys, on_bad, progress, workers)
            where = tuple(info.dataset.where(k) for k in info.dataset.keys)
            example = next((e for e in bad_examples if e.startswith(where)), "") if where else ""
            refuse_unreadable(info.path, info.rows, info.bad, example)


def _write(
    config: MergeConfig,
    store: Store,
    scanned: _Scanned,
    plan: _Plan,
    stats: StageStats,
    progress: Progress | None,
) -> tuple[dict[str, list[str]], Counter[str]]:
    """Pass 2: route the chosen rows into the shuffle's buckets, claim the output, write the
    shards (and a trainer's JSONL). Returns the keys written per split (and format) and the
    rows the JSONL left out, by reason."""
    infos, family = scanned.infos, scanned.family
    schema = SAMPLE_SCHEMA if family == "samples" else CONVERSATION_SCHEMA
    shards: dict[str, list[str]] = {}
    left: Counter[str] = Counter()  # rows the trainer's JSONL leaves out, by reason
    # the shuffle's buckets hold about the whole output: a full --tmp-dir is one line naming it
    # (a full --out is the store's own one line)
    scratch = config.tmp_dir or tempfile.gettempdir()
    with contextlib.ExitStack() as scope:
        scope.enter_context(
            disk_errors(
                f"{scratch} (the shuffle's temporary buckets)",
                "give --tmp-dir a folder with room for about the whole output",
            )
        )
        if config.tmp_dir is not None:
            Path(config.tmp_dir).mkdir(parents=True, exist_ok=True)  # --tmp-dir may be new
        tmp = scope.enter_context(
            tempfile.TemporaryDirectory(prefix="draftdata-merge-", dir=config.tmp_dir)
        )
        buckets = Buckets(Path(tmp), bucket_schema(schema), plan.nbuckets)
        with stats.timed("route"):
            try:
                for info in infos:
                    if family == "samples":
                        _route_samples(info, plan, buckets)
                    else:
                        _route_chat(info, plan, buckets)
                    if progress:
                        progress("route", info.first_row + info.scanned)
            finally:
                buckets.close()
        # claimed before the first shard, after everything that can fail on the inputs or the
        # mix (a corrected command must not meet its own failed claim); resumes a killed one
        claim_output(store, config_bytes(config, infos))
        with stats.timed("write"):
            jsonl: list[str] = []
            extra = None
            if config.format != "parquet":
                extra = _jsonl_writer(store, jsonl, config.format, left)
            for s, name in enumerate(SPLITS):
                writer = ShardWriter(
                    store, name, schema, plan.rows_per_shard[s], extra, write_empty=s == 0
                )
                for b in range(plan.nbuckets[s]):
                    table = buckets.read_sorted(s, b)
                    if table is not None:
                        writer.add(table)
                writer.close()
                shards[name] = writer.keys
                stats.add(f"rows.{name}", writer.rows)
                stats.add("bytes", writer.bytes)
        if jsonl:
            shards[config.format] = jsonl
    return shards, left


def _report(
    config: MergeConfig,
    scanned: _Scanned,
    planned: _Planned,
    shards: dict[str, list[str]],
    left: Counter[str],
) -> MergeReport:
    """The ``merge_report.json`` record (``store/merge_report.py``)."""
    target = normalised(config.mix)
    alloc = planned.alloc
    return MergeReport(
        format=MERGE_REPORT.format,
        version=REPORT_VERSION,
        target=target,
        before=planned.before,
        after=planned.after,
        inputs=[
            InputReport(
                path=i.path,
                role=i.role,
                kind=i.dataset.kind,
                rows=i.rows,
                by_domain=dict(sorted(Counter(i.by_domain).items())),
                bad_rows=i.bad,
                duplicates=i.dropped,
                models=found,
            )
            for i, found in zip(scanned.infos, scanned.models, strict=True)
        ],
        models=all_models(scanned.models),
        dropped=planned.dropped,
        seed=config.seed,
        data="tokenized" if scanned.family == "samples" else "conversations",
        rows=SplitRows(
            train=sum(planned.after.train.values()), eval=sum(planned.after.eval.values())
        ),
        available=planned.available,
        achieved=alloc.achieved,
        aimed=alloc.target,
        reachable=alloc.reachable,
        missing=alloc.missing,
        limited_by=alloc.limited_by,
        message=_message(target, alloc, planned.total_unique),
        mix_by=planned.doc.unit if target else config.mix_by,
        plan=planned.doc,
        tokens=planned.tokens,
        pooled_into_other=planned.pooled,
        upsampled=planned.upsampled,
        copy_ids=f"ID{scanned.keys.copy_suffix}K",
        settings=MergeSettings(
            tolerance=config.tolerance,
            eval_fraction=config.eval_fraction,
            upsample=config.upsample,
            max_repeat=config.max_repeat,
            dedup_ids=config.dedup_ids,
            format=config.format,
            mix_by=config.mix_by,
            min_keep=config.min_keep,
            allow_drop=config.allow_drop,
            tokenizer=config.tokenizer,
            allow_models=config.allow_models,
        ),
        bad_row_examples=scanned.bad_examples,
        files=shards,
        jsonl_left_out={config.format: dict(sorted(left.items()))} if left else None,
    )
