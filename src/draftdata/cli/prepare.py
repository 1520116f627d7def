"""`draftdata prepare CONFIG`: build a clean, deduplicated, mix-planned prompt set.

Parses options (``PrepareOptions``: each field one option, ``Setting`` marking the
``PrepareConfig`` key it overrides) into a ``PrepareConfig`` (the YAML file plus flag
overrides), calls
``draftdata.prepare.stage.prepare`` and prints progress (rows/s) and summary tables. Relative
source paths in the config are resolved against the config file's folder; ``--out`` (and the
config's ``out``) against the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli.options import SETTING, command, settings
from draftdata.cli.quiet import Quiet


class PrepareOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The argument and options of ``draftdata prepare``, in ``--help``'s order; a ``Setting``
    field overrides that ``PrepareConfig`` key of the YAML (``--mix`` replaces its mix)."""

    config: Annotated[
        Path | None,
        typer.Argument(
            help="Prepare config YAML (see examples/quickstart.yaml, examples/expansion.yaml)."
        ),
    ] = None
    out: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", help="Output folder (default: the config's `out`, else ./prompts)."
        ),
        SETTING,
    ] = None
    plan_only: Annotated[
        bool,
        typer.Option(
            "--plan-only",
            help="Read, validate and dedup the sources, print the plan, write nothing.",
        ),
    ] = False
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Sampling seed (default: the config's, else 0)."),
        SETTING,
    ] = None
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget", help="New prompts to take (default: the config's; none = all usable)."
        ),
        SETTING,
    ] = None
    mix_by: Annotated[
        str | None,
        typer.Option(
            "--mix-by",
            help="What the mix's shares count: rows, tokens (the expected loss tokens of the "
            "answers, from --lengths or the existing set's answers) or auto (tokens when "
            "--lengths is given, else rows; default: the config's mix_by, else auto).",
        ),
        SETTING,
    ] = None
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            help="A pilot's forecast.json (or its run folder: the newest forecast), local or "
            "s3://: the expected output tokens per domain that a mix in tokens plans with.",
        ),
        SETTING,
    ] = None
    mix: Annotated[
        str | None,
        typer.Option(
            "--mix",
            help="Target shares of existing + new, replacing the config's mix: "
            "DOMAIN=SHARE,... or a JSON file holding a mix (a suggested_mix.json of draftdata "
            "acceptance; local or s3://).",
        ),
    ] = None
    holdout: Annotated[
        int | None,
        typer.Option(
            "--holdout",
            help="Hold out N prompts per domain as an evaluation split in OUT/eval/ (e.g. for "
            "draftdata acceptance), never among the prompts to generate (default: the "
            "config's holdout, else 0).",
        ),
        SETTING,
    ] = None
    force: Annotated[
        bool, typer.Option("--force", help="Replace earlier prepare outputs in the output folder.")
    ] = False
    quiet: Quiet = False
    write_samples: Annotated[
        Path | None,
        typer.Option(
            "--write-samples",
            help="Write the bundled sample sources (six schemas, messy rows included) into this "
            "folder and exit; examples/quickstart.yaml reads them from examples/samples.",
        ),
    ] = None


def register(app: typer.Typer) -> None:
    """Add the `prepare` command to `app`."""
    command(app, "prepare", PrepareOptions)(_prepare)


def _prepare(opts: PrepareOptions) -> None:
    """Turn source datasets into one clean, balanced prompt set (JSONL shards + report).

    Example: draftdata prepare examples/quickstart.yaml --out prepare-out
    """
    from draftdata.prepare.config import check_mix_domains, mix_warnings
    from draftdata.prepare.stage import prepare
    from draftdata.shared import paths
    from draftdata.support import tables
    from draftdata.support.progress import RowProgress

    console = tables.console()
    if opts.write_samples is not None:
        _write_samples(opts.write_samples, console)
        return
    cfg = _build_config(opts)
    if not opts.plan_only:
        paths.output_folder(cfg.out, "--out" if opts.out is not None else f"{opts.config}: out")
    if cfg.existing is None or cfg.existing.path is None:
        check_mix_domains(cfg)  # a refusal is the one line, before any warning
    for warning in mix_warnings(cfg):
        typer.echo(warning, err=True)
    progress = None if opts.quiet else RowProgress("prepare")
    try:
        result = prepare(cfg, plan_only=opts.plan_only, force=opts.force, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    _print_summary(result, console, plan_only=opts.plan_only)


def _write_samples(folder: Path, console: Any) -> None:
    """``--write-samples``: the bundled sample sources into ``folder``."""
    from draftdata.prepare.samples import write_sample_sources
    from draftdata.shared import paths

    paths.output_folder(folder, "--write-samples")
    for s in write_sample_sources(folder):
        console.print(f"wrote {s.path}  (schema {s.schema})")


def _build_config(opts: PrepareOptions) -> Any:
    """The config file (checked to exist) with the options given over it; relative sources
    resolved against its folder, ``--lengths`` against the working directory."""
    from draftdata.cli.mixarg import mix_option
    from draftdata.errors import ConfigError
    from draftdata.prepare.config import PrepareConfig, check, resolve_paths
    from draftdata.shared import paths
    from draftdata.support.config import load_with_origins

    config = opts.config
    if config is None:
        raise ConfigError(
            "prepare: give a config file, e.g. draftdata prepare examples/quickstart.yaml"
        )
    paths.input_file(config, "prepare")
    if opts.mix_by is not None and opts.mix_by not in ("auto", "rows", "tokens"):
        raise ConfigError(f"--mix-by {opts.mix_by!r}: use rows, tokens or auto")
    flags = settings(opts)
    lengths = opts.lengths
    if lengths is not None and not paths.is_remote(lengths):
        paths.input_path(lengths, "--lengths", "give a pilot's forecast.json or its run")
        flags["lengths"] = str(Path(lengths).expanduser().resolve())  # the working directory's
    cfg, origins = load_with_origins(config, PrepareConfig, **flags)
    check(cfg, origins.name)  # a flag's value named by its flag, the file's by its key
    cfg = resolve_paths(cfg, config.resolve().parent)
    if (given := mix_option(opts.mix)) is not None:  # replaces the config's mix, key for key
        cfg = msgspec.structs.replace(cfg, mix=given)
    return cfg


def _print_summary(result: Any, console: Any, *, plan_only: bool) -> None:
    """The sources and mix tables, the notes, the one line of what was written and left out."""
    from draftdata.prepare.report import SOURCE_HEADER, plan_header, plan_rows, source_rows
    from draftdata.support.tables import table

    rep = result.report
    console.print(table("sources", SOURCE_HEADER, source_rows(rep)))
    title = "mix plan (existing + new)" if plan_only else "domain mix (existing + new)"
    if result.plan.mix_by == "tokens":
        title += ", in expected tokens"
    console.print(table(title, plan_header(result.plan), plan_rows(result.plan)))
    lengths_info = rep.get("lengths")
    if lengths_info:
        console.print(f"expected tokens per new prompt's answer from {lengths_info['source']}")
        for note in lengths_info["notes"]:
            console.print(f"[yellow]note: {note}[/]")
    if rep.get("mix_note"):
        typer.echo(f"warning: {rep['mix_note']}", err=True)
    if result.plan.shortfall:
        console.print(
            f"[yellow]the sources fall {result.plan.shortfall:,} prompts short of the budget[/]"
        )
    secs = result.stats.elapsed
    rate = rep["totals"]["read"] / max(secs, 1e-9)
    left_out, loss_note = _losses(rep, result.rejects)
    if plan_only:
        console.print(
            f"plan only: nothing written ({rep['totals']['read']:,} rows read in {secs:.1f}s"
            f"; {left_out})"
        )
    else:
        console.print(
            f"{rep['totals']['taken']:,} prompts in {len(result.shards)} shard(s) "
            f"under {result.out}/ "
            f"({rep['totals']['read']:,} rows in {secs:.1f}s, {rate:,.0f} rows/s); "
            f"{left_out}; rejects: {result.rejects}; report: {result.report_md}"
        )
        held = rep.get("holdout") or {}
        if held.get("prompts"):
            per = ", ".join(f"{d} {n:,}" for d, n in held["by_domain"].items())
            console.print(
                f"held out {held['prompts']:,} prompts as the evaluation split under "
                f"{result.out}/{held['path']} ({per})"
            )
    if loss_note is not None:
        typer.echo(loss_note, err=True)


def _losses(report: dict[str, Any], rejects: Path | None) -> tuple[str, str | None]:
    """What the summary line says became of the rows read besides the prompts taken, each row
    once (rejected, duplicates, held out as the evaluation split, not taken by the budget and
    mix), and a warning when the rejects pass 5%."""
    from collections import Counter

    from draftdata.support.metrics import accounted, loss_warning, reasons

    t = report["totals"]
    read, rejected = t["read"], t["rejected"]
    held = t.get("held_out", 0)
    parts = [
        ("rejected", rejected, ""),
        ("duplicates", t["duplicates"], ""),
        ("held out", held, "the evaluation split"),
        ("not taken", t["usable"] - held - t["taken"], "budget and mix"),
    ]
    shown = [p for p in parts if p[1] or p[0] != "held out"]  # no holdout: no such part
    line = accounted(read, "rows read", shown, t["taken"])
    why: Counter[str] = Counter()
    for s in report["sources"]:
        why.update(s["rejected"])
    where = f"{rejects} lists each with its reason" if rejects else "--plan-only writes none"
    detail = reasons(dict(why.most_common()))
    return line, loss_warning(rejected, read, "rows rejected", detail, where)
