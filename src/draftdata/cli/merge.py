"""`draftdata merge`: existing + added datasets -> one deduplicated training set on a target mix.

Parses options (``MergeOptions``: each field one option, ``Setting`` marking the ``MergeConfig``
key it sets) into a ``MergeConfig``, calls ``draftdata.merge.stage.merge`` and prints the
summary tables (``merge/report.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer

from draftdata.cli.options import SETTING, Protect, Setting, command, settings
from draftdata.cli.quiet import Quiet

if TYPE_CHECKING:
    from draftdata.store.merge_report import MergePlan, MergeReport


class MergeOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The options of ``draftdata merge``, in ``--help``'s order; a ``Setting`` field sets that
    ``MergeConfig`` key (``--mix`` is parsed first, ``mixarg.mix_option``)."""

    existing: Annotated[
        list[str],
        typer.Option(
            "--existing",
            help="The existing training set (repeatable): tokenized parquet, a run, prompts "
            "JSONL or SpecForge/ShareGPT conversations; local or s3://. Wins duplicates.",
        ),
        SETTING,
    ] = []
    add: Annotated[
        list[str],
        typer.Option("--add", help="A dataset to add (repeatable; same kinds as --existing)."),
        SETTING,
    ] = []
    mix: Annotated[
        str,
        typer.Option(
            "--mix",
            help="Target shares, e.g. code=0.35,math=0.2,general=0.3,tool=0.1,agent=0.05 "
            "(normalised to sum 1), or a JSON file holding a mix (a suggested_mix.json of "
            "draftdata acceptance; local or s3://). Domains not named are dropped unless "
            "other=SHARE pools them. Empty: keep the combined mix.",
        ),
    ] = ""
    out: Annotated[
        str,
        typer.Option("--out", "-o", help="Output folder or s3://BUCKET/PREFIX (must be empty)."),
        SETTING,
    ] = "merged"
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of sampling, split and shuffle."), SETTING
    ] = 0
    eval_fraction: Annotated[
        float,
        typer.Option("--eval-fraction", help="Share of rows in the eval split (0 for none)."),
        SETTING,
    ] = 0.01
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="parquet, or parquet plus a trainer's JSONL under FORMAT/: sharegpt, "
            "specforge (one row per assistant turn), openai, modelopt, eagle (chat inputs), "
            "speculators (tokenized inputs).",
        ),
        Setting("format"),
    ] = "parquet"
    upsample: Annotated[
        bool,
        typer.Option(
            "--upsample",
            help="Repeat rows of short domains to reach the mix instead of only "
            "down-sampling the others.",
        ),
        SETTING,
    ] = False
    max_repeat: Annotated[
        int,
        typer.Option(
            "--max-repeat",
            help="With --upsample: a row appears at most this many times (itself included).",
        ),
        SETTING,
    ] = 4
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            help="How far (a fraction: 0.005 = half a point) a domain's share may sit from its "
            "target so that more data is kept. 0 = the exact mix.",
        ),
        SETTING,
    ] = 0.005
    mix_by: Annotated[
        str,
        typer.Option(
            "--mix-by",
            help="What the --mix shares count: tokens (the loss tokens a drafter trains on: "
            "the assistant's text) or rows.",
        ),
        SETTING,
    ] = "tokens"
    min_keep: Annotated[
        float,
        typer.Option(
            "--min-keep",
            help="Stop (exit 1, nothing written) when the plan keeps less than this fraction "
            "of what the mix could use, printing the plan and the ways out.",
        ),
        SETTING,
    ] = 0.5
    allow_drop: Annotated[
        bool,
        typer.Option(
            "--allow-drop", help="Write the plan even when it keeps less than --min-keep."
        ),
        SETTING,
    ] = False
    allow_models: Annotated[
        bool,
        typer.Option(
            "--allow-models",
            help="Merge inputs answered by different target models (refused otherwise: a "
            "drafter trained on two targets' answers predicts neither).",
        ),
        SETTING,
    ] = False
    plan_only: Annotated[
        bool,
        typer.Option(
            "--plan-only",
            help="Print the plan (per domain: have, keep, drop, share); write nothing.",
        ),
        SETTING,
    ] = False
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            metavar="DIR",
            help="The target's tokenizer folder: count chat rows' loss tokens with it (default: "
            "estimated from the text; tokenized inputs are exact).",
        ),
        SETTING,
    ] = None
    dedup_ids: Annotated[
        bool,
        typer.Option(
            "--dedup-ids/--no-dedup-ids",
            help="Treat rows with the same id as duplicates (turn off when the inputs' ids are "
            "unrelated, e.g. both numbered 0, 1, 2, ...; ids may then repeat in the output). "
            "Content dedup always runs.",
        ),
        SETTING,
    ] = True
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Processes that classify chat rows without a domain (0: one per core, up to "
            "8, for inputs over 32 MiB; 1: none).",
        ),
        SETTING,
    ] = 0
    shard_rows: Annotated[
        int, typer.Option("--shard-rows", help="Most rows per shard."), SETTING
    ] = 100_000
    tmp_dir: Annotated[
        str | None,
        typer.Option("--tmp-dir", help="Local folder for the shuffle's buckets (default: system)."),
        SETTING,
    ] = None
    protect: Protect = []
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `merge` command to `app`."""
    command(app, "merge", MergeOptions)(_merge)


def _merge(opts: MergeOptions) -> None:
    """Combine datasets, dedup them (ids and content), sample to a target domain mix (in
    loss tokens by default, keeping as much data as the mix allows), shuffle with a seed,
    split train/eval and write HF-loadable parquet shards. The plan is printed first.

    Example: draftdata merge --existing old/ --add tokenized/ --mix code=0.5,math=0.5 --out ds/
    """
    from draftdata.cli.mixarg import mix_option
    from draftdata.merge.config import MergeConfig
    from draftdata.shared.mix import sum_warning
    from draftdata.support import tables

    _check_paths(opts)
    config = MergeConfig(**settings(opts), mix=mix_option(opts.mix) or {})
    if (warning := sum_warning(config.mix)) is not None:
        typer.echo(warning, err=True)
    console = tables.console()
    summary = _run(config, console, quiet=opts.quiet)
    if config.plan_only:
        console.print("--plan-only: nothing written")
        return
    _print_summary(summary, console)


def _check_paths(opts: MergeOptions) -> None:
    """The inputs and output places, checked before any work (``draftdata.shared.paths``)."""
    from draftdata.shared import paths

    for flag, urls in (("--existing", opts.existing), ("--add", opts.add)):
        for url in urls:
            paths.input_path(url, flag)
    paths.output_folder(opts.out, "--out")
    if opts.tmp_dir is not None:
        paths.output_folder(opts.tmp_dir, "--tmp-dir")


def _run(config: Any, console: Any, *, quiet: bool) -> Any:
    """The stage, with the scan's progress line closed before the plan is printed."""
    from draftdata.merge.report import print_plan
    from draftdata.merge.stage import merge
    from draftdata.support.progress import RowProgress

    progress = None if quiet else RowProgress("merge")

    def show_plan(plan: MergePlan) -> None:
        if progress is not None:
            progress.close()  # the scan's last counts come before the plan
        print_plan(plan, console)

    try:
        return merge(config, progress=progress, on_plan=show_plan)
    finally:
        if progress is not None:
            progress.close()


def _print_summary(summary: Any, console: Any) -> None:
    """The tables, the one line of what was written and left out, and its warnings."""
    from draftdata.merge.report import print_summary
    from draftdata.support.metrics import reasons

    print_summary(summary.report, console)
    rows = summary.train_rows + summary.eval_rows
    left_out, warning = _losses(summary.report)
    console.print(
        f"{summary.train_rows:,} train + {summary.eval_rows:,} eval rows in "
        f"{len(summary.files)} file(s) under {summary.out}/ "
        f"({summary.elapsed_s:.1f}s, {rows / max(summary.elapsed_s, 1e-9):,.0f} rows/s); "
        f"{left_out}; report: merge_report.json"
    )
    for fmt, why in (summary.report.jsonl_left_out or {}).items():
        console.print(
            f"{fmt}/: {sum(why.values()):,} rows left out of the JSONL ({reasons(why)}): "
            "its trainer's scripts cannot read them (docs/trainers.md); the parquet keeps them"
        )
    if warning is not None:
        typer.echo(warning, err=True)


def _losses(report: MergeReport) -> tuple[str, str | None]:
    """What the summary line says merge left out of the rows read, by reason, and a warning
    when the rows it could not read pass 5% (duplicates and the mix's sampling are the plan,
    shown above, never warned about)."""
    from draftdata.support.metrics import loss_warning, reasons, share

    read = sum(i.rows + i.bad_rows for i in report.inputs)
    dropped = dict(report.dropped)
    total = sum(dropped.values())
    line = f"of {read:,} rows read: dropped {total:,} ({share(total, read)}"
    line += f": {reasons(dropped)})" if total else ")"
    bad = dropped.get("bad_row", 0)
    examples = report.bad_row_examples
    detail = f"e.g. {examples[0]}" if examples else ""
    advice = "merge_report.json lists the first ones; `draftdata stats INPUT` counts them"
    return line, loss_warning(bad, read, "rows could not be read", detail, advice)
