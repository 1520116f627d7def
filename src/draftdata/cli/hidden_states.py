"""`draftdata hidden-states TOKENIZED --model TARGET --out DIR --format ...`: the target's hidden
states for offline drafter training.

Parses the options into a ``HiddenConfig``, calls ``draftdata.hidden.stage.hidden_states`` and
prints the summary (the bill, progress and verification lines come from the stage on stderr).
"""

from __future__ import annotations

from typing import Any

import typer

from draftdata.cli import ray_options as ray_opts
from draftdata.cli.quiet import QUIET, quietable
from draftdata.errors import ConfigError


def _engine_options(
    engine: str, fleet: str | None, concurrency: str, api_key_env: str | None
) -> dict[str, Any]:
    """What ``--engine vllm`` reads for itself (``HiddenConfig.options``)."""
    from draftdata import paths

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


def register(app: typer.Typer) -> None:
    """Add the `hidden-states` command to `app`."""

    @app.command("hidden-states")
    @quietable
    def _cmd(
        tokenized: str = typer.Argument(
            ...,
            metavar="TOKENIZED",
            help="Tokenized samples: tokenize's output or a merged tokenized dataset (folder, "
            "file or s3://).",
        ),
        model: str = typer.Option(
            ..., "--model", metavar="TARGET", help="The target's local Hugging Face folder."
        ),
        out: str = typer.Option(
            ...,
            "--out",
            metavar="DIR",
            help="The hidden-state set: a folder or s3://BUCKET/PREFIX (empty, or this set's "
            "to resume it).",
        ),
        format: str = typer.Option(
            ...,
            "--format",
            help="The trainer whose offline reader takes the files: speculators or specforge.",
        ),
        layers: str = typer.Option(
            "eagle3",
            "--layers",
            help="eagle3 ([2, N//2, N-3], the trainers' default) or aux layer ids I,J,K "
            "(Hugging Face hidden_states indices); the last layer is always added.",
        ),
        engine: str = typer.Option(
            "transformers", "--engine", help="What runs the target: transformers or vllm."
        ),
        gpus: str = typer.Option(
            "auto",
            "--gpus",
            help="Devices, one worker each: auto (every GPU, else the CPU), cpu, cpu:N, or "
            "GPU ids 0-7 / 0,2.",
        ),
        dtype: str = typer.Option(
            "bf16",
            "--dtype",
            help="Stored dtype: bf16, fp16, fp32, or fp8 (e4m3 + a scale per token; "
            "speculators only).",
        ),
        compute_dtype: str = typer.Option(
            "auto",
            "--compute-dtype",
            help="The forward pass's dtype: auto (the model's own on a GPU, float32 on the "
            "CPU), bfloat16, float16, float32.",
        ),
        compress: str = typer.Option(
            "none", "--compress", help="none, or gzip (.ckpt.gz; specforge only)."
        ),
        batch_tokens: int = typer.Option(
            16384,
            "--batch-tokens",
            min=1,
            help="Tokens per forward pass, padding included (samples are batched by length).",
        ),
        max_length: int | None = typer.Option(
            None,
            "--max-length",
            metavar="N",
            help="Cut longer samples to N tokens (default: the model's context).",
        ),
        verify: int = typer.Option(
            8,
            "--verify",
            min=0,
            metavar="N",
            help=(
                "Samples recomputed one at a time and compared with what was written, at the "
                "end; the first two batched ones also as soon as they are committed (0: off)."
            ),
        ),
        max_bytes: str | None = typer.Option(
            None,
            "--max-bytes",
            metavar="SIZE",
            help="Refuse a job whose files would take more (7TB, 500GB, 1.5TiB).",
        ),
        pilot: float | None = typer.Option(
            None,
            "--pilot",
            metavar="F|N",
            help="Compute a fraction F (< 1) or N samples, print the measured rate and the "
            "ETA, and stop (the same command without --pilot continues).",
        ),
        staging_bytes: str = typer.Option(
            "1GiB",
            "--staging-bytes",
            metavar="SIZE",
            help="Encoded files held in memory while the store takes them, at most.",
        ),
        protect: list[str] = typer.Option(
            [],
            "--protect",
            metavar="PREFIX",
            help="A prefix the output may not equal, contain or lie inside (repeatable).",
        ),
        lease_ttl: float = typer.Option(
            30.0,
            "--lease-ttl",
            metavar="S",
            help="Seconds without a heartbeat after which a writer is presumed dead.",
        ),
        lease_wait: float = typer.Option(
            0.0,
            "--lease-wait",
            metavar="S",
            help="Wait up to S seconds for another live writer of the set to finish.",
        ),
        fleet: str | None = typer.Option(
            None,
            "--fleet",
            metavar="FLEET.yaml",
            help="--engine vllm: the fleet `fleet up --engine vllm --hidden-states DIR` wrote "
            "(its servers extract the hidden states; --batch-tokens is then what it holds in "
            "flight).",
        ),
        concurrency: str = typer.Option(
            "auto",
            "--concurrency",
            help="--engine vllm: requests in flight per server, auto or a number.",
        ),
        api_key_env: str | None = typer.Option(
            None,
            "--api-key-env",
            metavar="VAR",
            help="--engine vllm: the environment variable holding the servers' API key.",
        ),
        partition: str | None = typer.Option(
            None,
            "--partition",
            metavar="I",
            help="Only the samples whose id hash falls in partition I of --partitions P (I/P "
            "says both), under that partition's own lease; with --ray, the partitions I,J,... "
            "to run.",
        ),
        ray: ray_opts.RayFlag = False,
        ray_address: ray_opts.RayAddress = None,
        partitions: ray_opts.Partitions = None,
        fleet_per_node: ray_opts.FleetPerNode = None,
        tasks_per_node: ray_opts.TasksPerNode = 1,
        ray_env: ray_opts.RayEnv = None,
        quiet: bool = QUIET,
    ) -> None:
        """The target's hidden states for offline drafter training, one file per sample.

        Files in the format of the trainer's offline reader (speculators: hs_<row>.safetensors
        beside its dataset; SpecForge: data_<row>.ckpt), aligned token for token with each
        sample; hidden_index.parquet says which file holds which sample id. The bill (bytes)
        is printed before any forward pass. Kill it at any time: the same command resumes,
        rewriting nothing.
        """
        from draftdata import paths
        from draftdata.hidden.bill import parse_size
        from draftdata.hidden.config import HiddenConfig

        single, count, only = ray_opts.resolve_partitions(partition, partitions, None, ray=ray)
        if fleet_per_node is not None and not (ray and engine == "vllm"):
            raise ConfigError("--fleet-per-node is for --ray --engine vllm")

        config = HiddenConfig(
            tokenized=tokenized,
            model=model,
            out=out,
            format=format,  # type: ignore[arg-type]  # validated below
            layers=layers,
            engine=engine,
            gpus=gpus,
            dtype=dtype,  # type: ignore[arg-type]
            compute_dtype=compute_dtype,
            compress=compress,  # type: ignore[arg-type]
            batch_tokens=batch_tokens,
            max_length=max_length,
            verify=verify,
            max_bytes=parse_size(max_bytes) if max_bytes is not None else None,
            pilot=pilot,
            staging_bytes=parse_size(staging_bytes, "--staging-bytes"),
            protect=list(protect),
            lease_ttl=lease_ttl,
            lease_wait=lease_wait,
            progress=not quiet,
            options=_engine_options(engine, fleet, concurrency, api_key_env),
            partition=single,
        ).validate()
        paths.input_path(tokenized, "", "give tokenize's output or a merged tokenized dataset")
        paths.input_folder(model, "--model", "give the target's local Hugging Face folder")
        paths.output_folder(out, "--out")
        if ray:
            code = ray_opts.hidden_on_ray(
                config,
                address=ray_address,
                partitions=count,
                only=only,
                fleet_per_node=fleet_per_node,
                tasks_per_node=tasks_per_node,
                forward_env=ray_env,
            )
            raise typer.Exit(code)
        from draftdata.hidden.stage import hidden_states
        from draftdata.hidden.summary import print_summary

        print_summary(hidden_states(config))
