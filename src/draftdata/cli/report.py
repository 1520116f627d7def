"""`draftdata report RUN_OR_DATASET --out report.html`: one self-contained HTML page."""

from __future__ import annotations

import typer

from draftdata.cli.quiet import QUIET, quietable


def register(app: typer.Typer) -> None:
    """Add the `report` command to `app`."""

    @app.command("report")
    @quietable
    def _cmd(
        target: str = typer.Argument(
            ...,
            help="A run, a merge output, a dataset, or a folder holding several (a demo output); "
            "local path or s3://BUCKET/PREFIX.",
        ),
        more: list[str] = typer.Argument(
            None,
            metavar="OTHER",
            help="More datasets to compare with, as with --compare "
            "(so `--compare A B` compares both).",
            show_default=False,
        ),
        out: str = typer.Option(
            "report.html", "--out", "-o", help="The HTML file to write (local)."
        ),
        compare: list[str] = typer.Option(
            [],
            "--compare",
            help="Another dataset to compare the domain mix with (repeatable); without a "
            "merge_report.json these stand for the 'before' side.",
        ),
        title: str = typer.Option("", "--title", help="Page title (default: from the input)."),
        quiet: bool = QUIET,
    ) -> None:
        """Domain mix before/after merge, output length and tokens per domain, finish reasons,
        failures by class, throughput per endpoint and the headline numbers, as one HTML file
        with embedded plots (no external URLs)."""
        from draftdata import paths
        from draftdata.report import build_report

        for i, url in enumerate([target, *(more or [])]):
            paths.input_path(url, "report" if i == 0 else "OTHER")
        for url in compare:
            paths.input_path(url, "--compare")
        paths.output_file(out, "--out")
        path = build_report(target, *compare, *(more or []), out=out, title=title or None)
        typer.echo(f"report: wrote {path} ({path.stat().st_size // 1024} KiB)")
