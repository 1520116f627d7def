"""`draftdata report RUN_OR_DATASET --out report.html`: one self-contained HTML page.

The options are ``ReportOptions``; the body checks the paths and calls ``report.build_report``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import typer

from draftdata.cli.options import command
from draftdata.cli.quiet import Quiet


class ReportOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The arguments and options of ``draftdata report``, in ``--help``'s order."""

    target: Annotated[
        str,
        typer.Argument(
            help="A run, a merge output, a dataset, or a folder holding several (a demo output); "
            "local path or s3://BUCKET/PREFIX."
        ),
    ]
    more: Annotated[
        list[str],
        typer.Argument(
            metavar="OTHER",
            help="More datasets to compare with, as with --compare "
            "(so `--compare A B` compares both).",
            show_default=False,
        ),
    ] = None  # type: ignore[assignment]  # Typer's None: no OTHER
    out: Annotated[str, typer.Option("--out", "-o", help="The HTML file to write (local).")] = (
        "report.html"
    )
    compare: Annotated[
        list[str],
        typer.Option(
            "--compare",
            help="Another dataset to compare the domain mix with (repeatable); without a "
            "merge_report.json these stand for the 'before' side.",
        ),
    ] = []
    title: Annotated[str, typer.Option("--title", help="Page title (default: from the input).")] = (
        ""
    )
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `report` command to `app`."""
    command(app, "report", ReportOptions)(_report)


def _report(opts: ReportOptions) -> None:
    """Domain mix before/after merge, output length and tokens per domain, finish reasons,
    failures by class, throughput per endpoint and the headline numbers, as one HTML file
    with embedded plots (no external URLs)."""
    from draftdata.report import build_report
    from draftdata.shared import paths

    more = opts.more or []
    for i, url in enumerate([opts.target, *more]):
        paths.input_path(url, "report" if i == 0 else "OTHER")
    for url in opts.compare:
        paths.input_path(url, "--compare")
    paths.output_file(opts.out, "--out")
    path = build_report(opts.target, *opts.compare, *more, out=opts.out, title=opts.title or None)
    typer.echo(f"report: wrote {path} ({path.stat().st_size // 1024} KiB)")
