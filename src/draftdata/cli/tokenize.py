"""`draftdata tokenize RUN_URL --tokenizer PATH ...`: a run's completions -> training samples.

Parses the options into a ``TokenizeConfig``, calls ``draftdata.tokenize.stage.tokenize`` (or the
Ray Data job with ``--ray``) and prints the summary table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from draftdata.cli.quiet import QUIET, quietable
from draftdata.distributed.cli_options import RayAddress, RayEnv, RayFlag, RayTasks

if TYPE_CHECKING:
    from draftdata.tokenize.config import TokenizeSummary


def register(app: typer.Typer) -> None:
    """Add the `tokenize` command to `app`."""

    @app.command("tokenize")
    @quietable
    def _cmd(
        run: str = typer.Argument(
            ..., metavar="RUN_URL", help="The generate run: a folder or s3://BUCKET/PREFIX."
        ),
        tokenizer: str = typer.Option(
            ...,
            "--tokenizer",
            metavar="PATH",
            help="The target's Hugging Face tokenizer folder (tokenizer.json + config).",
        ),
        chat_template: str | None = typer.Option(
            None,
            "--chat-template",
            metavar="FILE",
            help="A Jinja chat template (or tokenizer_config.json) to use instead of the "
            "tokenizer's own.",
        ),
        max_length: int | None = typer.Option(
            None, "--max-length", metavar="N", help="Longest sample in tokens (default: no limit)."
        ),
        long: str = typer.Option(
            "truncate", "--long", help="Samples over --max-length: truncate or drop."
        ),
        out: str | None = typer.Option(
            None,
            "--out",
            metavar="URL",
            help="Where the sample shards and summary.json go (default: RUN_URL/tokenized).",
        ),
        workers: int = typer.Option(
            1,
            "--workers",
            min=1,
            help="Processes (1: one process, the tokenizer's own threads on every core).",
        ),
        verify: bool = typer.Option(
            True,
            "--verify/--no-verify",
            help="Render and encode completions that carry server token ids, to check them "
            "(--no-verify: the token-id path encodes nothing).",
        ),
        batch_rows: int = typer.Option(
            256, "--batch-rows", min=1, help="Completions per batch (and per output shard)."
        ),
        protect: list[str] = typer.Option(
            [],
            "--protect",
            metavar="PREFIX",
            help="A prefix the output may not equal, contain or lie inside (repeatable).",
        ),
        ray: RayFlag = False,
        ray_address: RayAddress = None,
        ray_tasks: RayTasks = None,
        ray_env: RayEnv = None,
        quiet: bool = QUIET,
    ) -> None:
        """Tokenize a run's completions in the target's chat template: input_ids + loss_mask.

        Loss is 1 exactly on what the target wrote (reasoning, answer, tool calls, end-of-turn).

        Server token ids, when present, are the sample. Templates that rewrite history (Qwen3)
        give one sample per turn (id#turn).
        """
        from draftdata.tokenize.config import TokenizeConfig

        config = TokenizeConfig(
            run=run,
            tokenizer=tokenizer,
            chat_template=chat_template,
            max_length=max_length,
            long=long,  # type: ignore[arg-type]  # validated below
            out=out,
            workers=workers,
            verify=verify,
            batch_rows=batch_rows,
            protect=list(protect),
        ).validate()
        if ray:
            from draftdata.distributed.cli_options import tokenize_on_ray

            raise typer.Exit(
                tokenize_on_ray(
                    config, address=ray_address, concurrency=ray_tasks, forward_env=ray_env
                )
            )
        from draftdata.tokenize.stage import tokenize

        summary = tokenize(config)
        print_summary(summary)


def summary_lines(summary: TokenizeSummary) -> list[str]:
    """The plain-text lines of the final summary (also used by the demo)."""
    c = summary.count
    lines = [
        f"tokenize: {c('samples')} samples from {c('completions')} completions "
        f"({c('path.token_ids')} with server token ids, {c('path.rendered')} rendered) "
        f"in {summary.wall_s:.1f} s -> {summary.out}",
        f"verified {c('verified')} (non-canonical tokenization of the same text "
        f"{c('verified.noncanonical')}, ended other than by the template's end of turn "
        f"{c('verified.other_end')}), mismatched {c('mismatched')} (dropped), unverifiable "
        f"{c('unverifiable')}; split into per-turn samples {c('split_turns')}; "
        f"truncated {c('truncated')}",
    ]
    checked = c("verified") + c("mismatched")
    if checked:
        share = 100.0 * c("verified") / checked
        lines.append(
            f"server token ids: {share:.1f}% token-exact ({c('verified')} of {checked} "
            "verified against the chat template)"
        )
    dropped = summary.dropped
    if dropped:
        lines.append("dropped: " + ", ".join(f"{k} {v}" for k, v in dropped.items()))
    lines.extend(f"mismatch: {m}" for m in summary.mismatches)
    return lines


def print_summary(summary: TokenizeSummary) -> None:
    """Print the per-domain table and the summary lines."""
    from rich.table import Table

    from draftdata import tables

    table = Table(title="tokenized samples by domain")
    for name in ("domain", "samples", "tokens", "loss tokens", "loss %"):
        table.add_column(name, justify="left" if name == "domain" else "right")
    for domain, d in summary.domains.items():
        share = 100.0 * d.loss_tokens / d.tokens if d.tokens else 0.0
        table.add_row(
            domain or "(none)",
            f"{d.samples:,}",
            f"{d.tokens:,}",
            f"{d.loss_tokens:,}",
            f"{share:.1f}",
        )
    console = tables.console()
    console.print(table)
    for line in summary_lines(summary):
        console.print(line, markup=False, highlight=False)
