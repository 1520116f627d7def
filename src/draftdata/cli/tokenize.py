"""`draftdata tokenize RUN_URL --tokenizer PATH ...`: a run's completions -> training samples.

Parses the options (``TokenizeOptions``: each field one option, ``Setting`` marking the
``TokenizeConfig`` key it sets) into a ``TokenizeConfig``, calls
``draftdata.tokenize.stage.tokenize`` (or the Ray Data job with ``--ray``) and prints the
summary table (``tokenize/summary.py``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import typer

from draftdata.cli.options import SETTING, Protect, command, settings
from draftdata.cli.quiet import Quiet
from draftdata.cli.ray_options import RayAddress, RayEnv, RayFlag, RayTasks


class TokenizeOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The arguments and options of ``draftdata tokenize``, in ``--help``'s order; a ``Setting``
    field sets that ``TokenizeConfig`` key (``--server-thinking on|off`` is parsed first)."""

    run: Annotated[
        str,
        typer.Argument(metavar="RUN_URL", help="The generate run: a folder or s3://BUCKET/PREFIX."),
        SETTING,
    ]
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            metavar="PATH",
            help="The target's Hugging Face tokenizer folder (tokenizer.json + config).",
        ),
        SETTING,
    ]
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            metavar="FILE",
            help="A Jinja chat template (or tokenizer_config.json) to use instead of the "
            "tokenizer's own.",
        ),
        SETTING,
    ] = None
    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length", metavar="N", help="Longest sample in tokens (default: no limit)."
        ),
        SETTING,
    ] = None
    long: Annotated[
        str, typer.Option("--long", help="Samples over --max-length: truncate or drop."), SETTING
    ] = "truncate"
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            metavar="URL",
            help="Where the sample shards and summary.json go (default: RUN_URL/tokenized).",
        ),
        SETTING,
    ] = None
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="Processes (1: one process, the tokenizer's own threads on every core).",
        ),
        SETTING,
    ] = 1
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Render and encode completions that carry server token ids, to check them "
            "(--no-verify: the token-id path encodes nothing).",
        ),
        SETTING,
    ] = True
    server_thinking: Annotated[
        str | None,
        typer.Option(
            "--server-thinking",
            metavar="on|off",
            help="The servers' default thinking mode, for answers of a run generated with "
            "--reasoning server whose mode the run cannot tell (older runs, no prompt token "
            "counts); default: such answers are dropped and counted.",
        ),
    ] = None
    batch_rows: Annotated[
        int,
        typer.Option("--batch-rows", min=1, help="Completions per batch (and per output shard)."),
        SETTING,
    ] = 256
    protect: Protect = []
    ray: RayFlag = False
    ray_address: RayAddress = None
    ray_tasks: RayTasks = None
    ray_env: RayEnv = None
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `tokenize` command to `app`."""
    command(app, "tokenize", TokenizeOptions)(_tokenize)


def _tokenize(opts: TokenizeOptions) -> None:
    """Tokenize a run's completions in the target's chat template: input_ids + loss_mask.

    Loss is 1 exactly on what the target wrote (reasoning, answer, tool calls, end-of-turn).

    Server token ids, when present, are the sample. Templates that rewrite history (Qwen3)
    give one sample per turn (id#turn).
    """
    from draftdata.errors import ConfigError
    from draftdata.tokenize.config import TokenizeConfig

    if opts.server_thinking not in (None, "on", "off"):
        raise ConfigError(f"--server-thinking {opts.server_thinking!r}: use on or off")
    thinking = None if opts.server_thinking is None else opts.server_thinking == "on"
    config = TokenizeConfig(**settings(opts), server_thinking=thinking).validate()
    if opts.ray:
        from draftdata.cli.ray_options import tokenize_on_ray

        raise typer.Exit(
            tokenize_on_ray(
                config,
                address=opts.ray_address,
                concurrency=opts.ray_tasks,
                forward_env=opts.ray_env,
            )
        )
    # the Ray driver plans on this machine too, after it has found Ray (ray_tokenize.run)
    _check_paths(opts)
    from draftdata.tokenize.stage import tokenize
    from draftdata.tokenize.summary import print_summary

    print_summary(tokenize(config))


def _check_paths(opts: TokenizeOptions) -> None:
    """The run, the tokenizer, the template and the output place, checked before any work."""
    from draftdata.shared import paths
    from draftdata.shared.tokenizer_folder import check_tokenizer_folder

    paths.input_path(opts.run, "tokenize", "give a run (generate's --out) or a conversations file")
    check_tokenizer_folder(opts.tokenizer)
    if opts.chat_template is not None:
        paths.input_file(opts.chat_template, "--chat-template")
    if opts.out is not None:
        paths.output_folder(opts.out, "--out")
