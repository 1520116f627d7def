"""`draftdata demo`: the whole pipeline on embedded defaults (no GPU, no network).

Calls ``draftdata.demo.pipeline.run_demo`` and prints its summary table and output paths.
"""

from __future__ import annotations

from pathlib import Path

import typer

from draftdata.cli.quiet import QUIET, quietable


def register(app: typer.Typer) -> None:
    """Add the `demo` command to `app`."""

    @app.command("demo")
    @quietable
    def _cmd(
        out: Path = typer.Option(
            Path("demo-out"),
            "--out",
            "-o",
            help="Output folder (created; a folder from an earlier demo is replaced, any other "
            "non-empty folder is refused).",
        ),
        servers: int = typer.Option(2, "--servers", help="Simulated inference servers."),
        budget: int = typer.Option(120, "--budget", help="New prompts prepare takes."),
        seed: int = typer.Option(0, "--seed", help="Seed of every stage."),
        time_scale: float = typer.Option(
            0.05,
            "--time-scale",
            help="Simulator speed: 1.0 is a real ~27B model's decode timing, 0 answers at once.",
        ),
        mean_output_tokens: int = typer.Option(
            400, "--mean-output-tokens", help="Mean length of the simulated answers."
        ),
        cache_dir: Path | None = typer.Option(
            None,
            "--cache-dir",
            help="Where the demo tokenizer is trained once and reused (default: OUT/.cache).",
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Run prepare → generate → tokenize → merge → stats → report on bundled samples and a
        local simulated fleet; print the figures and where the outputs and report are."""
        from draftdata import paths, tables
        from draftdata.demo.pipeline import run_demo, summary_table

        paths.output_folder(out, "--out")
        if cache_dir is not None:
            paths.output_folder(cache_dir, "--cache-dir")
        console = tables.console()
        result = run_demo(
            out,
            servers=servers,
            budget=budget,
            seed=seed,
            time_scale=time_scale,
            mean_output_tokens=mean_output_tokens,
            cache_dir=cache_dir,
            log=lambda line: typer.echo(line, err=True),
        )
        console.print(summary_table(result))
        for name, path in result.paths.items():
            if name != "report":
                typer.echo(f"{name + ':':11} {path}")
        typer.echo(f"report: {result.paths['report']}")
        typer.echo(f"outputs: {result.out}")
