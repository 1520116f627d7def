"""`draftdata tokenize RUN_URL --tokenizer PATH ...`: a run's completions -> training samples.

Parses the options into a ``TokenizeConfig``, calls ``draftdata.tokenize.stage.tokenize`` (or the
Ray Data job with ``--ray``) and prints the summary table (``tokenize/summary.py``).
"""

from __future__ import annotations

import typer

from draftdata.cli.quiet import QUIET, quietable
from draftdata.cli.ray_options import RayAddress, RayEnv, RayFlag, RayTasks


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
        server_thinking: str | None = typer.Option(
            None,
            "--server-thinking",
            metavar="on|off",
            help="The servers' default thinking mode, for answers of a run generated with "
            "--reasoning server whose mode the run cannot tell (older runs, no prompt token "
            "counts); default: such answers are dropped and counted.",
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
        from draftdata import paths
        from draftdata.errors import ConfigError
        from draftdata.tokenize.config import TokenizeConfig
        from draftdata.tokenizer_folder import check_tokenizer_folder

        if server_thinking not in (None, "on", "off"):
            raise ConfigError(f"--server-thinking {server_thinking!r}: use on or off")

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
            server_thinking=None if server_thinking is None else server_thinking == "on",
            protect=list(protect),
        ).validate()
        if ray:
            from draftdata.cli.ray_options import tokenize_on_ray

            raise typer.Exit(
                tokenize_on_ray(
                    config, address=ray_address, concurrency=ray_tasks, forward_env=ray_env
                )
            )
        # the Ray driver plans on this machine too, after it has found Ray (ray_tokenize.run)
        paths.input_path(run, "tokenize", "give a run (generate's --out) or a conversations file")
        check_tokenizer_folder(tokenizer)
        if chat_template is not None:
            paths.input_file(chat_template, "--chat-template")
        if out is not None:
            paths.output_folder(out, "--out")
        from draftdata.tokenize.stage import tokenize
        from draftdata.tokenize.summary import print_summary

        summary = tokenize(config)
        print_summary(summary)
