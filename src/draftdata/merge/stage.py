"""The merge stage: existing + added datasets -> one deduplicated, mixed, shuffled, split set.

``merge(config)`` runs in named phases, with two passes over the inputs so memory stays
bounded:

1. read inputs (``_read_inputs``): open and check them, then pass 1, per row only (id hash,
   content hash, domain code, size estimate, loss tokens) in numpy arrays (``inputs.py``);
2. plan (``planner.plan_output``): dedup, the per-domain counts for the mix (in loss tokens by
   default: ``tokenplan.py``; or rows), which rows (and repeats) go where, and a seeded order
   key per output row (``plan.py``). The plan (``MergePlan``) goes to ``on_plan`` here, before
   anything is written; ``--plan-only`` stops after it, and so does a plan keeping less than
   ``--min-keep``;
3. write (``_write``): read the inputs again and append each chosen row to a hashed bucket in
   a temp folder (``route.py``); then sort bucket by bucket and write shards (``shuffle.py``);
4. report (``_report``): the typed record ``MergeReport`` (``store/merge_report.py``), written
   last as ``merge_report.json``, with the dataset card.

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
them). This module runs the phases and does the I/O; the decisions live in ``plan.py`` and
``tokenplan.py``. ``--mix`` domains no input holds are refused before pass 1 when the
classifier never gives them (only the rows' labels are read, ``check_named_domains``), else
right after it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from draftdata.errors import ConfigError, disk_errors
from draftdata.merge.config import MergeConfig, check_config
from draftdata.merge.inputs import (
    Family,
    InputInfo,
    Keys,
    Workers,
    open_inputs,
    scan,
)
from draftdata.merge.jsonl import CHAT_FORMATS, SAMPLE_FORMATS
from draftdata.merge.models import all_models, check_models, input_models
from draftdata.merge.plan import (
    Allocation,
)
from draftdata.merge.planner import OnPlan, Planned, RoutePlan, plan_output, stop_message
from draftdata.merge.resume import check_output, claim_output, config_bytes
from draftdata.merge.route import jsonl_writer, route_chat, route_samples
from draftdata.merge.shuffle import Buckets, ShardWriter, bucket_schema
from draftdata.shared.domains import DOMAINS
from draftdata.shared.formats import MERGE_REPORT, SAMPLE_SCHEMA
from draftdata.shared.mix import OTHER, normalised
from draftdata.shared.tokenizer_folder import check_tokenizer_folder
from draftdata.shared.tokens import counter
from draftdata.stats.conversations import CONVERSATION_SCHEMA
from draftdata.stats.readers import iter_domain_labels, refuse_unreadable
from draftdata.store.base import Store
from draftdata.store.merge_report import (
    REPORT_VERSION,
    InputReport,
    MergeReport,
    MergeSettings,
    SplitRows,
    dump_report,
)
from draftdata.store.opener import open_store
from draftdata.store.protect import check_not_protected
from draftdata.support.metrics import StageStats
from draftdata.support.workerpool import interrupts

CARD_KEY = "README.md"
SPLITS = ("train", "eval")
_POOL_MIN_BYTES = 32 << 20  # chat inputs smaller than this are classified in-process


Progress = Callable[[str, int], None]


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


def _workers(config: MergeConfig, family: Family, infos: list[InputInfo]) -> int:
    # processes for pass 1's classifier: only chat rows need them, and only big inputs pay
    # for starting them
    if family != "chat" or config.workers == 1:
        return 1
    if config.workers > 1:
        return config.workers
    size = sum(i.dataset.store.size(k) for i in infos for k in i.dataset.keys)
    return min(os.cpu_count() or 1, 8) if size > _POOL_MIN_BYTES else 1


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
    # a signal ends it in one line (Interrupted), with worker processes or without (--workers 1)
    with interrupts():
        return _merge(config, progress, on_plan)


def _merge(config: MergeConfig, progress: Progress | None, on_plan: OnPlan | None) -> MergeSummary:
    """The phases of ``merge``."""
    check_config(config)
    stats = StageStats("merge")
    store = None if config.plan_only else _open_output(config)
    scanned = _read_inputs(config, stats, progress)
    with stats.timed("plan"):
        planned = plan_output(config, scanned.infos, scanned.keys, scanned.family, stats, on_plan)
    if config.plan_only:
        return _summary(config.out, _report(config, scanned, planned, {}, Counter()), [], stats)
    if planned.doc.stops:
        raise ConfigError(stop_message(planned.doc))
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
    plan: RoutePlan,
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
                        route_samples(info, plan, buckets)
                    else:
                        route_chat(info, plan, buckets)
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
                extra = jsonl_writer(store, jsonl, config.format, left)
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
    planned: Planned,
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
