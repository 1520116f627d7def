"""`draftdata stats DATASET`: the domain mix and shape of any dataset, as tables or JSON."""

from __future__ import annotations

import typer

from draftdata.cli.quiet import QUIET, quietable


def register(app: typer.Typer) -> None:
    """Add the `stats` command to `app`."""

    @app.command("stats")
    @quietable
    def _cmd(
        dataset: list[str] = typer.Argument(
            ...,
            help="A run, prepare's output folder (or a prompts JSONL), tokenized parquet, a "
            "merge output, or conversations jsonl/json/parquet (SpecForge, ShareGPT, OpenAI "
            "messages); local path or s3://BUCKET/PREFIX. Several may be given.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
        quiet: bool = QUIET,
    ) -> None:
        """Counts and shares per domain and source, length percentiles, reasoning share,
        finish reasons and failures (for runs). Format is auto-detected."""
        import json
        import sys

        from draftdata.errors import disk_errors
        from draftdata.stats import compute_stats
        from draftdata.stats.render import print_stats

        results = [compute_stats(url) for url in dataset]
        with disk_errors("the standard output", "redirect it to another place"):
            if as_json:
                typer.echo(json.dumps(results[0] if len(results) == 1 else results, indent=2))
                return
            for stats in results:
                print_stats(stats)
            sys.stdout.flush()
