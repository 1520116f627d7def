"""`draftdata generate`: answer every prompt on the fleet, exactly once, into a run store.

Parses options into one ``GenerateConfig`` (the ``--config`` YAML plus flag overrides; each
option is declared once, as a field of ``GenerateOptions``, and one that sets a config key says
which with ``Setting``), calls ``draftdata.generate.stage.generate`` (or, with ``--ray``, the
distributed driver; with ``--pilot``, the pilot) and prints the summary. Exit codes: 0 done,
1 a user error (one line), 128 + the signal when SIGINT (130) or SIGTERM (143) interrupted it
(the run is committed up to what finished; the same command resumes it; the line every command
ends with then, ``cli.STOPPED_LINE``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli import ray_options as ray_opts
from draftdata.cli.options import SETTING, Setting, command, settings
from draftdata.cli.quiet import Quiet

PANEL_RUN = "Requests"
PANEL_STORE = "Run store"
PANEL_ROBUST = "Retries, timeouts and the tail"
PANEL_PILOT = "Pilot and forecast"


class GenerateOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The options of ``draftdata generate``, in ``--help``'s order. A field marked ``SETTING``
    (or ``Setting("sampling.KEY")``) sets that ``GenerateConfig`` key, over ``--config``'s; a
    False flag or an empty list is "not given". The rest are the command's own."""

    prompts: Annotated[
        str | None,
        typer.Option(
            "--prompts",
            "-p",
            help="Prompts JSONL file, or prepare's output folder; local or s3://.",
        ),
        SETTING,
    ] = None
    endpoints: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint",
            "-e",
            help="Server base URL, e.g. http://127.0.0.1:30000 (with or without /v1); repeat "
            "for several.",
        ),
        SETTING,
    ] = None
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet", "-f", help="fleet.yaml written by `draftdata fleet up` / `fleet sim`."
        ),
        SETTING,
    ] = None
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="Run store: a local folder or s3://bucket/prefix/ (the same --out resumes).",
        ),
        SETTING,
    ] = None
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="gen.yaml with any setting below (flags win)."),
    ] = None
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Model name to request (default: the id at /v1/models).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            min=1,
            help="Output token limit, reasoning included (default: fill the endpoint's "
            "context, i.e. its context length minus the prompt's tokens, per request).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    strict_limit: Annotated[
        bool,
        typer.Option(
            "--strict-limit",
            help="Send --max-tokens as given: refuse a limit that cannot fit the context "
            "(default: lower each request's limit to the context minus its prompt).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = False
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature",
            help="Sampling temperature (default: the server's).",
            rich_help_panel=PANEL_RUN,
        ),
        Setting("sampling.temperature"),
    ] = None
    top_p: Annotated[
        float | None,
        typer.Option(
            "--top-p",
            help="Nucleus sampling (default: the server's).",
            rich_help_panel=PANEL_RUN,
        ),
        Setting("sampling.top_p"),
    ] = None
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k", help="Top-k sampling (default: the server's).", rich_help_panel=PANEL_RUN
        ),
        Setting("sampling.top_k"),
    ] = None
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Request seed (default: none).", rich_help_panel=PANEL_RUN),
        Setting("sampling.seed"),
    ] = None
    reasoning: Annotated[
        str | None,
        typer.Option(
            "--reasoning",
            help="on|off: set enable_thinking; server: leave the template's default (default).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    n: Annotated[
        int | None,
        typer.Option(
            "--n",
            min=1,
            help="Samples per prompt (server `n`, else K requests; default 1).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    concurrency: Annotated[
        str | None,
        typer.Option(
            "--concurrency",
            help="auto (from the server's capacity, adapted to its queue; default) or N "
            "sequences per endpoint.",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=0,
            help="Only the first N prompts of the file (default: all).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    partition: Annotated[
        str | None,
        typer.Option(
            "--partition",
            metavar="I",
            help="Only the prompts whose id hash falls in partition I of --partitions P "
            "(I/P says both at once); with --ray, the partitions I,J,... to run (e.g. the "
            "ones a summary listed as unfinished).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    extra_body: Annotated[
        str | None,
        typer.Option(
            "--extra-body",
            metavar="JSON",
            help="Extra request fields as a JSON object, e.g. '{\"min_p\": 0.05}'.",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env",
            metavar="VAR",
            help="Environment variable holding the API key (never logged or stored).",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    token_ids: Annotated[
        str | None,
        typer.Option(
            "--token-ids",
            help="auto (ask; detected per server; default), on, off.",
            rich_help_panel=PANEL_RUN,
        ),
        SETTING,
    ] = None
    protect: Annotated[
        list[str] | None,
        typer.Option(
            "--protect",
            metavar="PREFIX",
            help="A prefix that must never be written (repeatable).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed",
            help="Retry prompts that failed fatally in earlier runs.",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = False
    allow_config_change: Annotated[
        bool,
        typer.Option(
            "--allow-config-change",
            help="Continue a run with changed settings (recorded).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = False
    allow_mixed_models: Annotated[
        bool,
        typer.Option(
            "--allow-mixed-models",
            help="Go on when the endpoints report different models (each completion "
            "records its own).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = False
    flush_records: Annotated[
        int | None,
        typer.Option(
            "--flush-records",
            min=1,
            help="Commit a shard every N records (default 256).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    flush_seconds: Annotated[
        float | None,
        typer.Option(
            "--flush-seconds",
            help="...or every S seconds (default 5).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    max_uncommitted: Annotated[
        int | None,
        typer.Option(
            "--max-uncommitted",
            min=1,
            help="Pause dispatch while more records than this wait for the store (default 4096).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            "--lease-ttl",
            help="Seconds of heartbeat silence after which a dead writer's run lease expires "
            "(default 30).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    lease_wait: Annotated[
        float | None,
        typer.Option(
            "--lease-wait",
            help="Wait up to S seconds for another live writer of the run to finish "
            "(default 0: refuse at once).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    writer_id: Annotated[
        str | None,
        typer.Option(
            "--writer-id",
            help="Shard name tag (default: host-pid-random).",
            rich_help_panel=PANEL_STORE,
        ),
        SETTING,
    ] = None
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            min=1,
            help="Attempts per request before exhausted_retries (default 6).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    read_timeout: Annotated[
        float | None,
        typer.Option(
            "--read-timeout",
            help="Seconds to wait for a whole answer: a deadline per request, not per chunk "
            "(default 3600).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    connect_timeout: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout",
            help="Seconds to connect (default 10).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    unavailable_timeout: Annotated[
        float | None,
        typer.Option(
            "--unavailable-timeout",
            help="Stop (exit 1, resumable) when no endpoint can serve for this many seconds "
            "(default 300).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    order: Annotated[
        str | None,
        typer.Option(
            "--order",
            help="length (longest expected answer first within the look-ahead; default) or "
            "file (prompt file order).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    lookahead: Annotated[
        int | None,
        typer.Option(
            "--lookahead",
            min=0,
            help="Prompts read ahead of dispatch for --order length (default 4096).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    lookahead_mib: Annotated[
        int | None,
        typer.Option(
            "--lookahead-mib",
            min=1,
            help="At most this many MiB of prompt lines read ahead of dispatch, whatever "
            "their count (long prompts; default 64).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    no_hedge: Annotated[
        bool,
        typer.Option(
            "--no-hedge",
            help="Do not copy tail requests onto faster idle endpoints.",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = False
    grace_seconds: Annotated[
        float | None,
        typer.Option(
            "--grace-seconds",
            help="On Ctrl-C, wait this long for running requests (default 60).",
            rich_help_panel=PANEL_ROBUST,
        ),
        SETTING,
    ] = None
    progress: Annotated[
        str | None,
        typer.Option(
            "--progress",
            help="auto (live on a terminal, else log lines; default), rich, plain, off.",
        ),
        SETTING,
    ] = None
    log_interval: Annotated[
        float | None,
        typer.Option("--log-interval", help="Seconds between plain progress lines (default 30)."),
        SETTING,
    ] = None
    pilot: Annotated[
        str | None,
        typer.Option(
            "--pilot",
            metavar="F|N",
            help="Run a stratified sample first: a fraction of the prompts (e.g. 0.01) or a "
            "count (an integer >= 2), by source and domain, into the run itself; then "
            "write forecast.json (tokens, time, GPU-hours, the token mix) and print it. "
            "The same command without --pilot runs the rest.",
            rich_help_panel=PANEL_PILOT,
        ),
    ] = None
    pilot_seed: Annotated[
        int,
        typer.Option(
            "--pilot-seed",
            help="Seed of the pilot's draw (default 0; another seed draws other prompts).",
            rich_help_panel=PANEL_PILOT,
        ),
    ] = 0
    json_out: Annotated[
        Path | None,
        typer.Option("--summary-json", help="Also write the summary as JSON to this file."),
    ] = None
    ray: ray_opts.RayFlag = False
    ray_address: ray_opts.RayAddress = None
    partitions: ray_opts.Partitions = None
    only_partitions: ray_opts.OnlyPartitions = None
    fleet_per_node: ray_opts.FleetPerNode = None
    tasks_per_node: ray_opts.TasksPerNode = 1
    ray_env: ray_opts.RayEnv = None
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `generate` command to `app`."""
    command(app, "generate", GenerateOptions)(_generate)


def _generate(opts: GenerateOptions) -> None:
    """Answer every prompt on the fleet and store each completion exactly once.

    Example: draftdata generate --prompts prompts/ --fleet fleet.yaml --out run/
    """
    single, count, only = ray_opts.resolve_partitions(
        opts.partition, opts.partitions, opts.only_partitions, ray=opts.ray
    )
    spec = _pilot_spec(opts)
    cfg = _build_config(opts, partition=single)
    _check_paths(cfg, opts)
    if spec is not None:
        _pilot(cfg, spec, opts.pilot_seed, opts.json_out)
    elif opts.ray:
        raise typer.Exit(
            ray_opts.generate_on_ray(
                cfg,
                address=opts.ray_address,
                partitions=count,
                only=only,
                fleet_per_node=opts.fleet_per_node,
                tasks_per_node=opts.tasks_per_node,
                forward_env=opts.ray_env,
            )
        )
    else:
        _run(cfg, opts.json_out)


def _given(value: Any) -> bool:
    """A setting counts as given unless it is None, a False flag or an empty list (0 is a
    value: ``--limit 0``, ``--lookahead 0``)."""
    return value is not None and value is not False and value != []


# keys whose flag is not ``--`` + the key with dashes (config.Origins)
FLAG_NAMES = {"endpoints": "--endpoint", "hedge": "--no-hedge"}


def _build_config(opts: GenerateOptions, *, partition: str | None) -> Any:
    """The ``--config`` YAML (checked to exist) with the options given on the command line
    over it."""
    import json

    from draftdata.errors import ConfigError
    from draftdata.generate.config import GenerateConfig, parse_concurrency, validate
    from draftdata.shared import paths
    from draftdata.support.config import load_with_origins

    if opts.config is not None:
        paths.input_file(opts.config, "--config")
    flags = {k: v for k, v in settings(opts).items() if _given(v)}
    flags["sampling"] = {k: v for k, v in flags["sampling"].items() if _given(v)} or None
    flags["partition"] = partition
    flags["concurrency"] = parse_concurrency(opts.concurrency)
    if flags.pop("no_hedge", False):
        flags["hedge"] = False
    if opts.extra_body is not None:
        try:
            flags["extra_body"] = json.loads(opts.extra_body)
        except ValueError as exc:
            raise ConfigError(f"--extra-body: not valid JSON ({exc})") from None
        if not isinstance(flags["extra_body"], dict):
            raise ConfigError("--extra-body: give a JSON object, e.g. '{\"top_k\": 20}'")
    # every message names a flag's value by its flag and the file's by its key
    cfg, origins = load_with_origins(
        opts.config, GenerateConfig, flag_names=FLAG_NAMES, flag_groups={"sampling"}, **flags
    )
    if opts.fleet_per_node and not (cfg.endpoints or cfg.fleet):
        # each Ray node reads its own fleet file (the template): the servers are checked there
        checked = validate(msgspec.structs.replace(cfg, fleet=opts.fleet_per_node), origins.name)
        return msgspec.structs.replace(checked, fleet=None)
    return validate(cfg, origins.name)


def _pilot_spec(opts: GenerateOptions) -> Any:
    """``--pilot F|N`` parsed (None without it); a pilot runs on one machine."""
    if opts.pilot is None:
        return None
    from draftdata.errors import ConfigError
    from draftdata.generate.plan.pilot_sample import parse_pilot

    spec = parse_pilot(opts.pilot)
    if opts.ray:
        raise ConfigError("--pilot: a pilot runs on one machine; drop --ray")
    return spec


def _check_paths(cfg: Any, opts: GenerateOptions) -> None:
    """The input and output places, checked before any work (``draftdata.shared.paths``)."""
    from draftdata.shared import paths

    if cfg.prompts:
        paths.input_path(cfg.prompts, "--prompts", "give a prompts JSONL or prepare's --out")
    if cfg.fleet:
        hint = (
            "start a fleet with `draftdata fleet up` (it writes fleet.yaml) or give --endpoint URLs"
        )
        paths.input_file(cfg.fleet, "--fleet", hint)
    if cfg.out:
        paths.output_folder(cfg.out, "--out")
    if opts.json_out is not None:
        paths.output_file(opts.json_out, "--summary-json")


def _interrupted(summary: Any) -> BaseException:
    """An interrupted summary as the command's ending: Interrupted by the signal that stopped
    the engine (SIGINT when none did: it was interrupted in-process)."""
    import signal

    from draftdata.errors import Interrupted

    return Interrupted(signal.Signals[summary.signal] if summary.signal else signal.SIGINT)


def _run(cfg: Any, json_out: Path | None) -> None:
    """The run on this machine: the stage, its summary, 128 + the signal when interrupted."""
    import signal

    from draftdata.errors import Interrupted
    from draftdata.generate.stage import generate

    try:
        summary = generate(cfg)
    except KeyboardInterrupt:  # Python's own SIGINT handling (not the command line's)
        raise Interrupted(signal.SIGINT) from None
    for line in summary.lines():
        typer.echo(line)
    if json_out is not None:
        import json

        json_out.write_text(json.dumps(summary.to_dict(), indent=1), encoding="utf-8")
    if summary.interrupted:  # the stage has said how to resume; the CLI's line ends it
        raise _interrupted(summary)


def _pilot(cfg: Any, spec: Any, seed: int, json_out: Path | None) -> None:
    """``generate --pilot``: run the sample, print the summary and the forecast."""
    import signal

    from draftdata.errors import Interrupted
    from draftdata.generate.plan.pilot import run_pilot

    try:
        result = run_pilot(cfg, spec, seed=seed)
    except KeyboardInterrupt:  # Python's own SIGINT handling (not the command line's)
        raise Interrupted(signal.SIGINT) from None
    for line in result.summary.lines():
        typer.echo(line)
    for line in result.lines():
        typer.echo(line)
    if json_out is not None:
        import json

        data = result.summary.to_dict()
        data["forecast"] = result.forecast_json()
        json_out.write_text(json.dumps(data, indent=1), encoding="utf-8")
    if result.summary.interrupted:
        typer.echo(
            "generate: the pilot was interrupted; run the same command to finish it", err=True
        )
        raise _interrupted(result.summary)
