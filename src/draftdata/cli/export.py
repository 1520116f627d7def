"""`draftdata export RUN --format sharegpt|openai|parquet --out PATH|s3://BUCKET/KEY`."""

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
            help="sharegpt (SpecForge `conversations` JSONL), openai (messages JSONL), "
            "or parquet (Hugging Face datasets loadable).",
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
        quiet: bool = QUIET,
    ) -> None:
        """Export a run's completions for training (streams shard by shard)."""
        from draftdata.store.export import export_run

        stats = export_run(run, fmt, out, include_reasoning=reasoning, protect=protect)
        typer.echo(
            f"exported {stats.get('export.records')} completions from "
            f"{stats.get('export.shards')} shards to {out} ({fmt}); "
            f"{stats.get('export.duplicates_dropped')} duplicates dropped"
        )
