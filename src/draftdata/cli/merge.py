"""`draftdata merge`: existing + added datasets -> one deduplicated training set on a target mix.

Parses options into a ``MergeConfig``, calls ``draftdata.merge.stage.merge`` and prints the
summary tables (``merge/report.py``).
"""

from __future__ import annotations

import time

import typer

from draftdata.cli.quiet import QUIET, quietable


class _Progress:
    """``merge: WHAT: N rows (R rows/s)`` lines on stderr (WHAT: an input being scanned, or
    ``route``), at most every 2 seconds, and always the last count of each: when the next
    input or phase starts, and at ``close``. So a small input shows its whole row count, not
    the first batch's."""

    def __init__(self) -> None:
        self.last_print = 0.0
        self.what: str | None = None
        self.rows = 0
        self.started = self.last_call = time.perf_counter()  # WHAT began when the last ended
        self.shown = True  # whether ``rows`` of ``what`` is on screen

    def __call__(self, what: str, rows: int) -> None:
        now = time.perf_counter()
        if what != self.what:
            self.close()
            self.what, self.started = what, self.last_call
        self.rows, self.shown, self.last_call = rows, False, now
        if now - self.last_print >= 2.0:
            self._show(now)

    def _show(self, now: float) -> None:
        rate = self.rows / max(now - self.started, 1e-9)
        typer.echo(f"merge: {self.what}: {self.rows:,} rows ({rate:,.0f} rows/s)", err=True)
        self.last_print, self.shown = now, True

    def close(self) -> None:
        """Show the last count if it is not on screen yet."""
        if self.what is not None and not self.shown:
            self._show(time.perf_counter())


def register(app: typer.Typer) -> None:
    """Add the `merge` command to `app`."""

    @app.command("merge")
    @quietable
    def _cmd(
        existing: list[str] = typer.Option(
            [],
            "--existing",
            help="The existing training set (repeatable): tokenized parquet, a run, prompts "
            "JSONL or SpecForge/ShareGPT conversations; local or s3://. Wins duplicates.",
        ),
        add: list[str] = typer.Option(
            [], "--add", help="A dataset to add (repeatable; same kinds as --existing)."
        ),
        mix: str = typer.Option(
            "",
            "--mix",
            help="Target shares, e.g. code=0.35,math=0.2,general=0.3,tool=0.1,agent=0.05 "
            "(normalised to sum 1). Domains not named are dropped unless other=SHARE pools "
            "them. Empty: keep the combined mix.",
        ),
        out: str = typer.Option(
            "merged", "--out", "-o", help="Output folder or s3://BUCKET/PREFIX (must be empty)."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of sampling, split and shuffle."),
        eval_fraction: float = typer.Option(
            0.01, "--eval-fraction", help="Share of rows in the eval split (0 for none)."
        ),
        fmt: str = typer.Option(
            "parquet",
            "--format",
            help="parquet, or parquet plus a trainer's JSONL under FORMAT/: sharegpt, "
            "specforge (one row per assistant turn), openai, modelopt, eagle (chat inputs), "
            "speculators (tokenized inputs).",
        ),
        upsample: bool = typer.Option(
            False,
            "--upsample",
            help="Repeat rows of short domains to reach the mix instead of only "
            "down-sampling the others.",
        ),
        max_repeat: int = typer.Option(
            4,
            "--max-repeat",
            help="With --upsample: a row appears at most this many times (itself included).",
        ),
        tolerance: float = typer.Option(
            0.005,
            "--tolerance",
            help="How far (a fraction: 0.005 = half a point) a domain's share may sit from its "
            "target so that more rows are kept. 0 = the exact mix.",
        ),
        dedup_ids: bool = typer.Option(
            True,
            "--dedup-ids/--no-dedup-ids",
            help="Treat rows with the same id as duplicates (turn off when the inputs' ids are "
            "unrelated, e.g. both numbered 0, 1, 2, ...; ids may then repeat in the output). "
            "Content dedup always runs.",
        ),
        workers: int = typer.Option(
            0,
            "--workers",
            help="Processes that classify chat rows without a domain (0: one per core, up to "
            "8, for inputs over 32 MiB; 1: none).",
        ),
        shard_rows: int = typer.Option(100_000, "--shard-rows", help="Most rows per shard."),
        tmp_dir: str | None = typer.Option(
            None, "--tmp-dir", help="Local folder for the shuffle's buckets (default: system)."
        ),
        protect: list[str] = typer.Option(
            [],
            "--protect",
            metavar="PREFIX",
            help="A prefix the output may not equal, contain or lie inside (repeatable).",
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Combine datasets, dedup them (ids and content), sample to a target domain mix,
        shuffle with a seed, split train/eval and write HF-loadable parquet shards.

        Example: draftdata merge --existing old/ --add tokenized/ --mix code=0.5,math=0.5 --out ds/
        """
        from draftdata import tables
        from draftdata.merge.config import MergeConfig, mix_warning, parse_mix
        from draftdata.merge.report import print_summary
        from draftdata.merge.stage import merge

        config = MergeConfig(
            existing=list(existing),
            add=list(add),
            mix=parse_mix(mix),
            out=out,
            seed=seed,
            eval_fraction=eval_fraction,
            format=fmt,
            upsample=upsample,
            max_repeat=max_repeat,
            tolerance=tolerance,
            dedup_ids=dedup_ids,
            workers=workers,
            shard_rows=shard_rows,
            tmp_dir=tmp_dir,
            protect=list(protect),
        )
        if (warning := mix_warning(config.mix)) is not None:
            typer.echo(warning, err=True)
        progress = None if quiet else _Progress()
        try:
            summary = merge(config, progress=progress)
        finally:
            if progress is not None:
                progress.close()
        console = tables.console()
        print_summary(summary.report, console)
        rows = summary.train_rows + summary.eval_rows
        console.print(
            f"{summary.train_rows:,} train + {summary.eval_rows:,} eval rows in "
            f"{len(summary.files)} file(s) under {summary.out}/ "
            f"({summary.elapsed_s:.1f}s, {rows / max(summary.elapsed_s, 1e-9):,.0f} rows/s); "
            "report: merge_report.json"
        )
