"""`draftdata export RUN --format FORMAT --out PATH|s3://BUCKET/KEY` (formats: trainer_rows.py)."""

from __future__ import annotations

from typing import Any

import typer

from draftdata.cli.quiet import QUIET, quietable


def register(app: typer.Typer) -> None:
    """Add the `export` command to `app`."""

    @app.command("export")
    @quietable
    def _cmd(
        run: str = typer.Argument(..., help="The run: a local directory or s3://BUCKET/PREFIX."),
        fmt: str = typer.Option(
            "specforge",
            "--format",
            "-f",
            help="specforge (SpecForge `conversations` JSONL, one row per generated turn; train "
            "with train_only_last_turn; the default: no trainer mis-trains it), sharegpt (the "
            "same rows, whole conversations: multi-turn rows train a form of the earlier turns "
            "the target never wrote under Qwen3-style templates), specforge-text "
            "(pre-formatted `text`, per turn), speculators (input_ids + loss_mask rows, per "
            "turn), modelopt (TensorRT Model Optimizer), eagle (ShareGPT from/value), openai "
            "(messages JSONL), or parquet (Hugging Face datasets loadable).",
        ),
        out: str = typer.Option(
            ...,
            "--out",
            "-o",
            help="Output file or s3://BUCKET/KEY (must not exist; never overwritten).",
        ),
        reasoning: bool = typer.Option(
            True,
            "--reasoning/--no-reasoning",
            help="Keep the assistant turns' reasoning_content.",
        ),
        protect: list[str] = typer.Option(
            [],
            "--protect",
            help="A prefix the export may not write into (repeatable).",
        ),
        tokenizer: str | None = typer.Option(
            None,
            "--tokenizer",
            help="The target's Hugging Face tokenizer folder (specforge-text and speculators).",
        ),
        chat_template: str | None = typer.Option(
            None,
            "--chat-template",
            help="A chat template file (Jinja or tokenizer_config.json) overriding the "
            "tokenizer's (specforge-text and speculators).",
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Export a run's completions for training (streams shard by shard)."""
        from draftdata import paths
        from draftdata.export.stage import export_run

        paths.input_folder(run, "export", "give a run (generate's --out)")
        paths.output_file(out, "--out", replace=False)
        if tokenizer is not None:
            from draftdata.tokenizer_folder import check_tokenizer_folder

            check_tokenizer_folder(tokenizer)
        if chat_template is not None:
            paths.input_file(chat_template, "--chat-template")
        stats = export_run(
            run,
            fmt,
            out,
            include_reasoning=reasoning,
            protect=protect,
            tokenizer=tokenizer,
            chat_template=chat_template,
        )
        rows = stats.get("export.rows")
        per_turn = f" as {rows} rows" if rows != stats.get("export.records") else ""
        line, warning = _losses(stats, fmt)
        typer.echo(
            f"exported {stats.get('export.records')} completions{per_turn} from "
            f"{stats.get('export.shards')} shards to {out} ({fmt}); "
            f"{stats.get('export.duplicates_dropped')} duplicates dropped; {line}"
        )
        if warning is not None:
            typer.echo(warning, err=True)


def _losses(stats: Any, fmt: str) -> tuple[str, str | None]:
    """What the summary line says the export left out or cut, and a warning above 5%.

    ``specforge`` leaves turns cut by the token limit out (a conversation row would train an
    end of turn the target never wrote); the token formats keep them, cut where the target
    stopped, and leave out what tokenize drops; the whole-conversation formats keep them as
    the last turn of their conversation, where a trainer does train that end of turn.
    """
    from draftdata.metrics import loss_warning, reasons, share
    from draftdata.trainer_rows import PER_TURN_FORMATS

    rows, cut = stats.get("export.rows"), stats.get("export.cut_turns")
    if fmt == "specforge":
        skipped = stats.get("export.cut_turns_skipped")
        turns = rows + skipped
        line = f"left out {skipped:,} of {turns:,} turns ({share(skipped, turns)}) cut by the "
        line += "token limit"
        advice = "raise generate's --max-tokens for the next run"
        return line, loss_warning(
            skipped, turns, "turns left out", "cut by the token limit", advice
        )
    if fmt in PER_TURN_FORMATS:
        dropped = stats.group("export.tokenize.dropped")
        lost = sum(dropped.values())
        turns = rows + lost
        line = f"left out {lost:,} of {turns:,} turns ({share(lost, turns)}"
        line += f": {reasons(dropped)})" if lost else ")"
        line += f"; {cut:,} rows end where the token limit cut the turn"
        detail = ", ".join(
            p for p in (reasons(dropped), f"cut by the token limit {cut:,}" if cut else "") if p
        )
        advice = "see the reasons in docs/tokenize.md; raise generate's --max-tokens for cut turns"
        return line, loss_warning(lost + cut, turns, "turns left out or cut", detail, advice)
    completions = stats.get("export.records")
    rows_cut = stats.get("export.cut_completions")
    line = (
        f"{rows_cut:,} of {completions:,} rows ({share(rows_cut, completions)}) end in a turn "
        "cut by the token limit"
    )
    advice = (
        "a trainer trains the end of turn the target never wrote there; --format specforge "
        "leaves such turns out"
    )
    warning = loss_warning(
        rows_cut, completions, "rows end in a cut turn", "cut by the token limit", advice
    )
    return line, warning
