"""`draftdata export RUN --format FORMAT --out PATH|s3://BUCKET/KEY` (formats: trainer_rows.py).

The options are ``ExportOptions`` (each field one option, ``Setting`` marking the keyword of
``export.stage.export_run`` it sets); the body checks the paths, calls the stage and prints one
line.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli.options import SETTING, Setting, command, settings
from draftdata.cli.quiet import Quiet


class ExportOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The arguments and options of ``draftdata export``, in ``--help``'s order; a ``Setting``
    field is that keyword of ``export_run``."""

    run: Annotated[
        str, typer.Argument(help="The run: a local directory or s3://BUCKET/PREFIX."), SETTING
    ]
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="specforge (SpecForge `conversations` JSONL, one row per generated turn; train "
            "with train_only_last_turn; the default: each turn trained as the target wrote it), "
            "sharegpt (the "
            "same rows, whole conversations: multi-turn rows train a form of the earlier turns "
            "the target never wrote under Qwen3-style templates), specforge-text "
            "(pre-formatted `text`, per turn), speculators (input_ids + loss_mask rows, per "
            "turn), modelopt (TensorRT Model Optimizer, per turn, with the chat template it must "
            "read them with written beside --out), eagle (ShareGPT human/gpt; what EAGLE's "
            "scripts cannot read is left out and counted), openai (messages JSONL), or parquet "
            "(Hugging Face datasets loadable).",
        ),
        SETTING,
    ] = "specforge"
    out: Annotated[
        str,
        typer.Option(
            "--out",
            "-o",
            help="Output file or s3://BUCKET/KEY (must not exist; never overwritten).",
        ),
        SETTING,
    ]
    reasoning: Annotated[
        bool,
        typer.Option(
            "--reasoning/--no-reasoning", help="Keep the assistant turns' reasoning_content."
        ),
        Setting("include_reasoning"),
    ] = True
    protect: Annotated[
        list[str],
        typer.Option("--protect", help="A prefix the export may not write into (repeatable)."),
        SETTING,
    ] = []
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="The target's Hugging Face tokenizer folder (specforge-text, speculators and "
            "modelopt).",
        ),
        SETTING,
    ] = None
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            help="A chat template file (Jinja or tokenizer_config.json) overriding the "
            "tokenizer's (specforge-text, speculators and modelopt).",
        ),
        SETTING,
    ] = None
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `export` command to `app`."""
    command(app, "export", ExportOptions)(_export)


def _export(opts: ExportOptions) -> None:
    """Export a run's completions for training (streams shard by shard)."""
    from draftdata.export.stage import export_run

    _check_paths(opts)
    stats = export_run(**settings(opts))
    line, warning = _summary(stats, opts.fmt, opts.out)
    typer.echo(line)
    if warning is not None:
        typer.echo(warning, err=True)


def _check_paths(opts: ExportOptions) -> None:
    """The run, the output, the tokenizer and the template, checked before any work."""
    from draftdata.shared import paths

    paths.input_folder(opts.run, "export", "give a run (generate's --out)")
    paths.output_file(opts.out, "--out", replace=False)
    if opts.tokenizer is not None:
        from draftdata.shared.tokenizer_folder import check_tokenizer_folder

        check_tokenizer_folder(opts.tokenizer)
    if opts.chat_template is not None:
        paths.input_file(opts.chat_template, "--chat-template")


def _summary(stats: Any, fmt: str, out: str) -> tuple[str, str | None]:
    """The one line of what was exported, and the warning when much was left out."""
    from draftdata.export.stage import template_name

    rows = stats.get("export.rows")
    per_turn = f" as {rows} rows" if rows != stats.get("export.records") else ""
    left_out, warning = _losses(stats, fmt)
    line = (
        f"exported {stats.get('export.records')} completions{per_turn} from "
        f"{stats.get('export.shards')} shards to {out} ({fmt}); "
        f"{stats.get('export.duplicates_dropped')} duplicates dropped; {left_out}"
    )
    if fmt == "modelopt":
        side = template_name(str(out).rsplit("/", 1)[-1])
        line += f"; chat template for answer_only_loss: {side} beside it"
    no_system = stats.get("export.rows_without_system_message")
    if fmt == "specforge" and no_system:
        line += (
            f"; {no_system} rows have no system message (SpecForge's qwen3-thinking "
            "template adds its own; specforge-text keeps the target's context)"
        )
    return line, warning


def _losses(stats: Any, fmt: str) -> tuple[str, str | None]:
    """What the summary line says the export left out or cut, and a warning above 5%.

    Per-turn formats count turns, the others completions. Left out: turns cut by the token limit
    (``specforge``, ``modelopt``: a conversation row would train an end of turn the target
    never wrote), what tokenize drops (the token formats), what a format cannot hold exactly
    (``export.left_out.*``). Cut: the token formats keep a cut turn, cut where the target
    stopped; the whole-conversation formats keep it as their conversation's last turn, where a
    trainer does train that end of turn.
    """
    from draftdata.shared.trainer_rows import PER_TURN_FORMATS, TOKENIZER_FORMATS
    from draftdata.support.metrics import loss_warning, reasons, share

    per_turn = fmt in PER_TURN_FORMATS
    why = {"cut by the token limit": stats.get("export.cut_turns_skipped")}
    if per_turn:
        # each turn once, by the one reason it has no row (tokenize's own reasons, which may
        # also count a cut turn, are in the stats as export.tokenize.dropped.*)
        left = stats.group("export.left_out")
        why["dropped by tokenize"] = left.pop("no_tokenize_sample", 0)
        why |= left
    else:
        why |= stats.group("export.left_out")
    lost = sum(why.values())
    unit = "turns" if per_turn else "completions"
    total = stats.get("export.turns") if per_turn else stats.get("export.records")
    line = f"left out {lost:,} of {total:,} {unit} ({share(lost, total)}"
    line += f": {reasons(why)})" if lost else ")"
    cut = 0
    if fmt in TOKENIZER_FORMATS and fmt != "modelopt":
        cut = stats.get("export.cut_turns")
        line += f"; {cut:,} rows end where the token limit cut the turn"
        advice = "raise generate's --max-tokens for cut turns; drop reasons: docs/tokenize.md"
    elif not per_turn:
        cut = stats.get("export.cut_completions")
        line += (
            f"; {cut:,} of {total:,} rows ({share(cut, total)}) end in a turn cut by the "
            "token limit"
        )
        advice = (
            "a trainer trains the end of turn the target never wrote after a cut turn; "
            "--format specforge leaves such turns out"
        )
    else:
        advice = "raise generate's --max-tokens for cut turns; the reasons: docs/export.md"
    detail = ", ".join(p for p in (reasons(why), f"cut {cut:,}" if cut else "") if p)
    return line, loss_warning(lost + cut, total, f"{unit} left out or cut", detail, advice)
