"""`draftdata generate`: answer every prompt on the fleet, exactly once, into a run store.

Parses options into one ``GenerateConfig`` (the ``--config`` YAML plus flag overrides), calls
``draftdata.generate.stage.generate`` (or, with ``--ray``, the distributed driver) and prints
the summary. Exit codes: 0 done, 1 a user error (one line), 130/143 interrupted (the run is
committed up to what finished; the same command resumes it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from draftdata.cli import ray_options as ray_opts
from draftdata.cli.quiet import QUIET, quietable

PANEL_RUN = "Requests"
PANEL_STORE = "Run store"
PANEL_ROBUST = "Retries, timeouts and the tail"


def _build_config(config: Path | None, flags: dict[str, Any]) -> Any:
    from draftdata.config import load_config
    from draftdata.generate.config import GenerateConfig, parse_concurrency

    sampling = {k: flags.pop(k) for k in ("temperature", "top_p", "top_k", "seed")}
    sampling = {k: v for k, v in sampling.items() if v is not None}
    flags["concurrency"] = parse_concurrency(flags["concurrency"])
    for key in ("endpoints", "protect"):
        if not flags[key]:
            flags[key] = None
    if flags.pop("no_hedge"):
        flags["hedge"] = False
    extra = flags.pop("extra_body")
    if extra is not None:
        import json

        from draftdata.errors import ConfigError

        try:
            flags["extra_body"] = json.loads(extra)
        except ValueError as exc:
            raise ConfigError(f"--extra-body: not valid JSON ({exc})") from None
        if not isinstance(flags["extra_body"], dict):
            raise ConfigError("--extra-body: give a JSON object, e.g. '{\"top_k\": 20}'")
    return load_config(config, GenerateConfig, sampling=sampling or None, **flags)


def register(app: typer.Typer) -> None:
    """Add the `generate` command to `app`."""

    @app.command("generate")
    @quietable
    def _cmd(
        prompts: str | None = typer.Option(
            None,
            "--prompts",
            "-p",
            help="Prompts JSONL file, or prepare's output folder; local or s3://.",
        ),
        endpoint: list[str] | None = typer.Option(
            None,
            "--endpoint",
            "-e",
            help="Server base URL, e.g. http://127.0.0.1:30000 (with or without /v1); repeat "
            "for several.",
        ),
        fleet: str | None = typer.Option(
            None, "--fleet", "-f", help="fleet.yaml written by `draftdata fleet up` / `fleet sim`."
        ),
        out: str | None = typer.Option(
            None,
            "--out",
            "-o",
            help="Run store: a local folder or s3://bucket/prefix/ (the same --out resumes).",
        ),
        config: Path | None = typer.Option(
            None, "--config", "-c", help="gen.yaml with any setting below (flags win)."
        ),
        model: str | None = typer.Option(
            None,
            "--model",
            help="Model name to request (default: the id at /v1/models).",
            rich_help_panel=PANEL_RUN,
        ),
        max_tokens: int | None = typer.Option(
            None,
            "--max-tokens",
            min=1,
            help="Output token limit, reasoning included (default: fill the endpoint's context, "
            "i.e. its context length minus the prompt's tokens, per request).",
            rich_help_panel=PANEL_RUN,
        ),
        temperature: float | None = typer.Option(
            None,
            "--temperature",
            help="Sampling temperature (default: the server's).",
            rich_help_panel=PANEL_RUN,
        ),
        top_p: float | None = typer.Option(
            None,
            "--top-p",
            help="Nucleus sampling (default: the server's).",
            rich_help_panel=PANEL_RUN,
        ),
        top_k: int | None = typer.Option(
            None,
            "--top-k",
            help="Top-k sampling (default: the server's).",
            rich_help_panel=PANEL_RUN,
        ),
        seed: int | None = typer.Option(
            None, "--seed", help="Request seed (default: none).", rich_help_panel=PANEL_RUN
        ),
        reasoning: str | None = typer.Option(
            None,
            "--reasoning",
            help="on|off: set enable_thinking; server: leave the template's default (default).",
            rich_help_panel=PANEL_RUN,
        ),
        n: int | None = typer.Option(
            None,
            "--n",
            min=1,
            help="Samples per prompt (server `n`, else K requests; default 1).",
            rich_help_panel=PANEL_RUN,
        ),
        concurrency: str | None = typer.Option(
            None,
            "--concurrency",
            help="auto (from the server's capacity, adapted to its queue; default) or N "
            "sequences per endpoint.",
            rich_help_panel=PANEL_RUN,
        ),
        limit: int | None = typer.Option(
            None,
            "--limit",
            min=0,
            help="Only the first N prompts of the file (default: all).",
            rich_help_panel=PANEL_RUN,
        ),
        partition: str | None = typer.Option(
            None,
            "--partition",
            metavar="I/P",
            help="Only prompts whose id hash falls in partition I of P.",
            rich_help_panel=PANEL_RUN,
        ),
        extra_body: str | None = typer.Option(
            None,
            "--extra-body",
            metavar="JSON",
            help="Extra request fields as a JSON object, e.g. '{\"min_p\": 0.05}'.",
            rich_help_panel=PANEL_RUN,
        ),
        api_key_env: str | None = typer.Option(
            None,
            "--api-key-env",
            metavar="VAR",
            help="Environment variable holding the API key (never logged).",
            rich_help_panel=PANEL_RUN,
        ),
        token_ids: str | None = typer.Option(
            None,
            "--token-ids",
            help="auto (ask; detected per server; default), on, off.",
            rich_help_panel=PANEL_RUN,
        ),
        protect: list[str] | None = typer.Option(
            None,
            "--protect",
            metavar="PREFIX",
            help="A prefix that must never be written (repeatable).",
            rich_help_panel=PANEL_STORE,
        ),
        retry_failed: bool = typer.Option(
            False,
            "--retry-failed",
            help="Retry prompts that failed fatally in earlier runs.",
            rich_help_panel=PANEL_STORE,
        ),
        allow_config_change: bool = typer.Option(
            False,
            "--allow-config-change",
            help="Continue a run with changed settings (recorded).",
            rich_help_panel=PANEL_STORE,
        ),
        allow_mixed_models: bool = typer.Option(
            False,
            "--allow-mixed-models",
            help="Go on when the endpoints report different models (each completion "
            "records its own).",
            rich_help_panel=PANEL_STORE,
        ),
        flush_records: int | None = typer.Option(
            None,
            "--flush-records",
            min=1,
            help="Commit a shard every N records (default 256).",
            rich_help_panel=PANEL_STORE,
        ),
        flush_seconds: float | None = typer.Option(
            None,
            "--flush-seconds",
            help="...or every S seconds (default 5).",
            rich_help_panel=PANEL_STORE,
        ),
        max_uncommitted: int | None = typer.Option(
            None,
            "--max-uncommitted",
            min=1,
            help="Pause dispatch while more records than this wait for the store (default 4096).",
            rich_help_panel=PANEL_STORE,
        ),
        lease_ttl: float | None = typer.Option(
            None,
            "--lease-ttl",
            help="Seconds of heartbeat silence after which a dead writer's run lease expires "
            "(default 30).",
            rich_help_panel=PANEL_STORE,
        ),
        lease_wait: float | None = typer.Option(
            None,
            "--lease-wait",
            help="Wait up to S seconds for another live writer of the run to finish "
            "(default 0: refuse at once).",
            rich_help_panel=PANEL_STORE,
        ),
        writer_id: str | None = typer.Option(
            None,
            "--writer-id",
            help="Shard name tag (default: host-pid-random).",
            rich_help_panel=PANEL_STORE,
        ),
        max_attempts: int | None = typer.Option(
            None,
            "--max-attempts",
            min=1,
            help="Attempts per request before exhausted_retries (default 6).",
            rich_help_panel=PANEL_ROBUST,
        ),
        read_timeout: float | None = typer.Option(
            None,
            "--read-timeout",
            help="Seconds to wait for an answer (default 3600).",
            rich_help_panel=PANEL_ROBUST,
        ),
        connect_timeout: float | None = typer.Option(
            None,
            "--connect-timeout",
            help="Seconds to connect (default 10).",
            rich_help_panel=PANEL_ROBUST,
        ),
        unavailable_timeout: float | None = typer.Option(
            None,
            "--unavailable-timeout",
            help="Stop (exit 1, resumable) when no endpoint can serve for this many seconds "
            "(default 300).",
            rich_help_panel=PANEL_ROBUST,
        ),
        order: str | None = typer.Option(
            None,
            "--order",
            help="length (longest expected answer first within the look-ahead; default) or "
            "file (prompt file order).",
            rich_help_panel=PANEL_ROBUST,
        ),
        lookahead: int | None = typer.Option(
            None,
            "--lookahead",
            min=0,
            help="Prompts read ahead of dispatch for --order length (default 4096).",
            rich_help_panel=PANEL_ROBUST,
        ),
        no_hedge: bool = typer.Option(
            False,
            "--no-hedge",
            help="Do not copy tail requests onto faster idle endpoints.",
            rich_help_panel=PANEL_ROBUST,
        ),
        grace_seconds: float | None = typer.Option(
            None,
            "--grace-seconds",
            help="On Ctrl-C, wait this long for running requests (default 60).",
            rich_help_panel=PANEL_ROBUST,
        ),
        progress: str | None = typer.Option(
            None,
            "--progress",
            help="auto (live on a terminal, else log lines; default), rich, plain, off.",
        ),
        log_interval: float | None = typer.Option(
            None, "--log-interval", help="Seconds between plain progress lines (default 30)."
        ),
        json_out: Path | None = typer.Option(
            None, "--summary-json", help="Also write the summary as JSON to this file."
        ),
        ray: ray_opts.RayFlag = False,
        ray_address: ray_opts.RayAddress = None,
        partitions: ray_opts.Partitions = None,
        only_partitions: ray_opts.OnlyPartitions = None,
        fleet_per_node: ray_opts.FleetPerNode = None,
        tasks_per_node: ray_opts.TasksPerNode = 1,
        ray_env: ray_opts.RayEnv = None,
        quiet: bool = QUIET,
    ) -> None:
        """Answer every prompt on the fleet and store each completion exactly once.

        Example: draftdata generate --prompts prompts/ --fleet fleet.yaml --out run/
        """
        flags = {
            "prompts": prompts,
            "endpoints": endpoint,
            "fleet": fleet,
            "out": out,
            "model": model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "seed": seed,
            "reasoning": reasoning,
            "n": n,
            "concurrency": concurrency,
            "limit": limit,
            "partition": partition,
            "api_key_env": api_key_env,
            "extra_body": extra_body,
            "token_ids": token_ids,
            "protect": protect,
            "retry_failed": retry_failed or None,
            "allow_config_change": allow_config_change or None,
            "allow_mixed_models": allow_mixed_models or None,
            "flush_records": flush_records,
            "flush_seconds": flush_seconds,
            "max_uncommitted": max_uncommitted,
            "unavailable_timeout": unavailable_timeout,
            "writer_id": writer_id,
            "lease_ttl": lease_ttl,
            "lease_wait": lease_wait,
            "max_attempts": max_attempts,
            "read_timeout": read_timeout,
            "connect_timeout": connect_timeout,
            "order": order,
            "lookahead": lookahead,
            "no_hedge": no_hedge,
            "grace_seconds": grace_seconds,
            "progress": progress,
            "log_interval": log_interval,
        }
        cfg = _build_config(config, flags)
        if ray:
            code = ray_opts.generate_on_ray(
                cfg,
                address=ray_address,
                partitions=partitions,
                only=only_partitions,
                fleet_per_node=fleet_per_node,
                tasks_per_node=tasks_per_node,
                forward_env=ray_env,
            )
            raise typer.Exit(code)
        from draftdata.generate.stage import generate

        try:
            summary = generate(cfg)
        except KeyboardInterrupt:  # outside the engine's own signal handling (start-up, close)
            typer.echo("generate: interrupted; run the same command again to continue", err=True)
            raise typer.Exit(130) from None
        for line in summary.lines():
            typer.echo(line)
        if json_out is not None:
            import json

            json_out.write_text(json.dumps(summary.to_dict(), indent=1), encoding="utf-8")
        if summary.interrupted:  # the stage has said how to resume
            raise typer.Exit(130)
