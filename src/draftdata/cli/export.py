"""`draftdata export RUN --format FORMAT --out PATH|s3://BUCKET/KEY` (formats: trainer_rows.py)."""

from __future__ import annotations

import typer

from draftdata.cli.quiet import QUIET, quietable


def register(app: typer.Typer) -> None:
    """Add the `export` command to `app`."""

    @app.command("export")
    @quietable
    def _cmd(
        run: str = typer.Argument(..., help="The run: a local directory or s3://BUCKET/PREFIX."),
        fmt: str = typer.Option(
            "sharegpt",
            "--format",
            "-f",
            help="sharegpt (SpecForge `conversations` JSONL, whole conversations), specforge "
            "(one row per generated turn; train with train_only_last_turn), specforge-text "
            "(pre-formatted `text`, per turn), speculators (input_ids + loss_mask rows, per "
            "turn), modelopt (TensorRT Model Optimizer, per turn, with the chat template it must "
            "read them with written beside --out), eagle (ShareGPT human/gpt; what EAGLE's "
            "scripts cannot read is left out and counted), openai (messages JSONL), or parquet "
            "(Hugging Face datasets loadable).",
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
            help="The target's Hugging Face tokenizer folder (specforge-text, speculators and "
            "modelopt).",
        ),
        chat_template: str | None = typer.Option(
            None,
            "--chat-template",
            help="A chat template file (Jinja or tokenizer_config.json) overriding the "
            "tokenizer's (specforge-text, speculators and modelopt).",
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Export a run's completions for training (streams shard by shard)."""
        from draftdata.export.stage import export_run

        stats = export_run(
            run,
            fmt,
            out,
            include_reasoning=reasoning,
            protect=protect,
            tokenizer=tokenizer,
            chat_template=chat_template,
        )
        from draftdata.export.stage import template_name

        rows = stats.get("export.rows")
        per_turn = f" as {rows} rows" if rows != stats.get("export.records") else ""
        line = (
            f"exported {stats.get('export.records')} completions{per_turn} from "
            f"{stats.get('export.shards')} shards to {out} ({fmt}); "
            f"{stats.get('export.duplicates_dropped')} duplicates dropped"
        )
        cut = stats.get("export.cut_turns_skipped")
        if cut:
            line += f"; {cut} turns cut by the token limit left out"
        left = stats.group("export.left_out")
        if left:
            why = ", ".join(f"{k} {v}" for k, v in sorted(left.items()))
            line += f"; {sum(left.values())} left out ({why})"
        if fmt == "modelopt":
            side = template_name(str(out).rsplit("/", 1)[-1])
            line += f"; chat template for answer_only_loss: {side} beside it"
        no_system = stats.get("export.rows_without_system_message")
        if fmt == "specforge" and no_system:
            line += (
                f"; {no_system} rows have no system message (SpecForge's qwen3-thinking "
                "template adds its own; specforge-text keeps the target's context)"
            )
        typer.echo(line)
