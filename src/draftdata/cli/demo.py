"""`draftdata demo`: the whole pipeline on embedded defaults (no GPU, no network).

The options are ``DemoOptions`` (a ``Setting`` field is that keyword of ``run_demo``); calls
``draftdata.demo.pipeline.run_demo`` and prints its summary table and output paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from draftdata.cli.options import SETTING, command, settings
from draftdata.cli.quiet import Quiet


class DemoOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The options of ``draftdata demo``, in ``--help``'s order; a ``Setting`` field is that
    keyword of ``run_demo``."""

    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Output folder (created; a folder from an earlier demo is replaced, any other "
            "non-empty folder is refused).",
        ),
    ] = Path("demo-out")
    servers: Annotated[
        int, typer.Option("--servers", help="Simulated inference servers."), SETTING
    ] = 2
    budget: Annotated[int, typer.Option("--budget", help="New prompts prepare takes."), SETTING] = (
        120
    )
    seed: Annotated[int, typer.Option("--seed", help="Seed of every stage."), SETTING] = 0
    time_scale: Annotated[
        float,
        typer.Option(
            "--time-scale",
            help="Simulator speed: 1.0 is a real ~27B model's decode timing, 0 answers at once.",
        ),
        SETTING,
    ] = 0.05
    mean_output_tokens: Annotated[
        int,
        typer.Option("--mean-output-tokens", help="Mean length of the simulated answers."),
        SETTING,
    ] = 400
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="Where the demo tokenizer is trained once and reused (default: OUT/.cache).",
        ),
        SETTING,
    ] = None
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `demo` command to `app`."""
    command(app, "demo", DemoOptions)(_demo)


def _demo(opts: DemoOptions) -> None:
    """Run prepare → generate → tokenize → merge → stats → report on bundled samples and a
    local simulated fleet; print the figures and where the outputs and report are."""
    from draftdata.demo.pipeline import run_demo, summary_table
    from draftdata.shared import paths
    from draftdata.support import tables

    paths.output_folder(opts.out, "--out")
    if opts.cache_dir is not None:
        paths.output_folder(opts.cache_dir, "--cache-dir")
    console = tables.console()
    result = run_demo(opts.out, **settings(opts), log=lambda line: typer.echo(line, err=True))
    console.print(summary_table(result))
    for name, path in result.paths.items():
        if name != "report":
            typer.echo(f"{name + ':':11} {path}")
    typer.echo(f"report: {result.paths['report']}")
    typer.echo(f"outputs: {result.out}")
