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
        typer.echo(
            f"exported {stats.get('export.records')} completions{per_turn} from "
            f"{stats.get('export.shards')} shards to {out} ({fmt}); "
            f"{stats.get('export.duplicates_dropped')} duplicates dropped"
        )
