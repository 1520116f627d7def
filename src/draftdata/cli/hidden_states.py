"""`draftdata hidden-states TOKENIZED --model TARGET --out DIR --format ...`: the target's hidden
states for offline drafter training.

Parses the options (``HiddenOptions``: each field one option, ``Setting`` marking the
``HiddenConfig`` key it sets) into a ``HiddenConfig``, calls
``draftdata.hidden.stage.hidden_states`` and prints the summary (the bill, progress and
verification lines come from the stage on stderr).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli import ray_options as ray_opts
from draftdata.cli.options import SETTING, Protect, command, settings
from draftdata.cli.quiet import Quiet
from draftdata.errors import ConfigError


def _engine_options(
    engine: str, fleet: str | None, concurrency: str, api_key_env: str | None
) -> dict[str, Any]:
    """What ``--engine vllm`` reads for itself (``HiddenConfig.options``)."""
    from draftdata.shared import paths

    if fleet is not None:  # a wrong path is named first, whatever the engine
        paths.input_file(fleet, "--fleet")
    if engine != "vllm":
        given = [n for n, v in (("--fleet", fleet), ("--api-key-env", api_key_env)) if v]
        if given:
            raise ConfigError(f"{given[0]} is only used with --engine vllm")
        return {}
    if fleet is None:
        raise ConfigError(
            "--engine vllm needs --fleet FLEET.yaml (from `draftdata fleet up --engine vllm "
            "--hidden-states DIR`)"
        )
    out: dict[str, Any] = {"fleet": fleet, "concurrency": concurrency}
    if api_key_env:
        out["api_key_env"] = api_key_env
    return out


class HiddenOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The argument and options of ``draftdata hidden-states``, in ``--help``'s order; a
    ``Setting`` field sets that ``HiddenConfig`` key (the sizes are parsed, the vllm engine's
    options gathered, ``_engine_options``)."""

    tokenized: Annotated[
        str,
        typer.Argument(
            metavar="TOKENIZED",
            help="Tokenized samples: tokenize's output or a merged tokenized dataset (folder, "
            "file or s3://).",
        ),
        SETTING,
    ]
    model: Annotated[
        str,
        typer.Option("--model", metavar="TARGET", help="The target's local Hugging Face folder."),
        SETTING,
    ]
    out: Annotated[
        str,
        typer.Option(
            "--out",
            metavar="DIR",
            help="The hidden-state set: a folder or s3://BUCKET/PREFIX (empty, or this set's "
            "to resume it).",
        ),
        SETTING,
    ]
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="The trainer whose offline reader takes the files: speculators or specforge.",
        ),
        SETTING,
    ]
    layers: Annotated[
        str,
        typer.Option(
            "--layers",
            help="eagle3 ([2, N//2, N-3], the trainers' default) or aux layer ids I,J,K "
            "(Hugging Face hidden_states indices); the last layer is always added.",
        ),
        SETTING,
    ] = "eagle3"
    engine: Annotated[
        str, typer.Option("--engine", help="What runs the target: transformers or vllm."), SETTING
    ] = "transformers"
    gpus: Annotated[
        str,
        typer.Option(
            "--gpus",
            help="Devices, one worker each: auto (every GPU, else the CPU), cpu, cpu:N, or "
            "GPU ids 0-7 / 0,2.",
        ),
        SETTING,
    ] = "auto"
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="Stored dtype: bf16, fp16, fp32, or fp8 (e4m3 + a scale per token; "
            "speculators only).",
        ),
        SETTING,
    ] = "bf16"
    compute_dtype: Annotated[
        str,
        typer.Option(
            "--compute-dtype",
            help="The forward pass's dtype: auto (the model's own on a GPU, float32 on the "
            "CPU), bfloat16, float16, float32.",
        ),
        SETTING,
    ] = "auto"
    compress: Annotated[
        str, typer.Option("--compress", help="none, or gzip (.ckpt.gz; specforge only)."), SETTING
    ] = "none"
    batch_tokens: Annotated[
        int,
        typer.Option(
            "--batch-tokens",
            min=1,
            help="Tokens per forward pass, padding included (samples are batched by length).",
        ),
        SETTING,
    ] = 16384
    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length",
            metavar="N",
            help="Cut longer samples to N tokens (default: the model's context).",
        ),
        SETTING,
    ] = None
    verify: Annotated[
        int,
        typer.Option(
            "--verify",
            min=0,
            metavar="N",
            help=(
                "Samples recomputed one at a time and compared with what was written, at the "
                "end; the first two batched ones also as soon as they are committed (0: off)."
            ),
        ),
        SETTING,
    ] = 8
    max_bytes: Annotated[
        str | None,
        typer.Option(
            "--max-bytes",
            metavar="SIZE",
            help="Refuse a job whose files would take more (7TB, 500GB, 1.5TiB).",
        ),
    ] = None
    pilot: Annotated[
        float | None,
        typer.Option(
            "--pilot",
            metavar="F|N",
            help="Compute a fraction F (< 1) or N samples, print the measured rate and the "
            "ETA, and stop (the same command without --pilot continues).",
        ),
        SETTING,
    ] = None
    staging_bytes: Annotated[
        str,
        typer.Option(
            "--staging-bytes",
            metavar="SIZE",
            help="Encoded files held in memory while the store takes them, at most.",
        ),
    ] = "1GiB"
    protect: Protect = []
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            metavar="S",
            help="Seconds without a heartbeat after which a writer is presumed dead.",
        ),
        SETTING,
    ] = 30.0
    lease_wait: Annotated[
        float,
        typer.Option(
            "--lease-wait",
            metavar="S",
            help="Wait up to S seconds for another live writer of the set to finish.",
        ),
        SETTING,
    ] = 0.0
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet",
            metavar="FLEET.yaml",
            help="--engine vllm: the fleet `fleet up --engine vllm --hidden-states DIR` wrote "
            "(its servers extract the hidden states; --batch-tokens is then what it holds in "
            "flight).",
        ),
    ] = None
    concurrency: Annotated[
        str,
        typer.Option(
            "--concurrency", help="--engine vllm: requests in flight per server, auto or a number."
        ),
    ] = "auto"
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env",
            metavar="VAR",
            help="--engine vllm: the environment variable holding the servers' API key.",
        ),
    ] = None
    partition: Annotated[
        str | None,
        typer.Option(
            "--partition",
            metavar="I",
            help="Only the samples whose id hash falls in partition I of --partitions P (I/P "
            "says both), under that partition's own lease; with --ray, the partitions I,J,... "
            "to run.",
        ),
    ] = None
    ray: ray_opts.RayFlag = False
    ray_address: ray_opts.RayAddress = None
    partitions: ray_opts.Partitions = None
    fleet_per_node: ray_opts.FleetPerNode = None
    tasks_per_node: ray_opts.TasksPerNode = 1
    ray_env: ray_opts.RayEnv = None
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `hidden-states` command to `app`."""
    command(app, "hidden-states", HiddenOptions)(_hidden_states)


def _hidden_states(opts: HiddenOptions) -> None:
    """The target's hidden states for offline drafter training, one file per sample.

    Files in the format of the trainer's offline reader (speculators: hs_<row>.safetensors
    beside its dataset; SpecForge: data_<row>.ckpt), aligned token for token with each
    sample; hidden_index.parquet says which file holds which sample id. The bill (bytes)
    is printed before any forward pass. Kill it at any time: the same command resumes,
    rewriting nothing.
    """
    from draftdata.shared import paths

    single, count, only = ray_opts.resolve_partitions(
        opts.partition, opts.partitions, None, ray=opts.ray
    )
    if opts.fleet_per_node is not None and not (opts.ray and opts.engine == "vllm"):
        raise ConfigError("--fleet-per-node is for --ray --engine vllm")
    config = _build_config(opts, partition=single)
    paths.input_path(opts.tokenized, "", "give tokenize's output or a merged tokenized dataset")
    paths.input_folder(opts.model, "--model", "give the target's local Hugging Face folder")
    paths.output_folder(opts.out, "--out")
    if opts.ray:
        raise typer.Exit(
            ray_opts.hidden_on_ray(
                config,
                address=opts.ray_address,
                partitions=count,
                only=only,
                fleet_per_node=opts.fleet_per_node,
                tasks_per_node=opts.tasks_per_node,
                forward_env=opts.ray_env,
            )
        )
    from draftdata.hidden.stage import hidden_states
    from draftdata.hidden.summary import print_summary

    print_summary(hidden_states(config))


def _build_config(opts: HiddenOptions, *, partition: str | None) -> Any:
    """The ``HiddenConfig`` of the options, validated."""
    from draftdata.hidden.bill import parse_size
    from draftdata.hidden.config import HiddenConfig

    return HiddenConfig(
        **settings(opts),
        max_bytes=parse_size(opts.max_bytes) if opts.max_bytes is not None else None,
        staging_bytes=parse_size(opts.staging_bytes, "--staging-bytes"),
        progress=not opts.quiet,
        options=_engine_options(opts.engine, opts.fleet, opts.concurrency, opts.api_key_env),
        partition=partition,
    ).validate()
