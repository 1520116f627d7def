"""`draftdata fleet up | status | down`: launch, watch and stop real (or simulated) servers.

Each command parses its options (``UpOptions``: a ``Setting`` field sets that ``LaunchConfig``
key; a fleet.yaml path) and calls one function of ``draftdata.fleet.manage``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli.options import SETTING, command, settings
from draftdata.cli.quiet import Quiet
from draftdata.errors import ConfigError

# what to do when the fleet file is missing (the same line for status and down)
NO_FLEET_HINT = (
    "no fleet is written there; start one with `draftdata fleet up` or `draftdata fleet sim "
    "--out fleet.yaml`, or give the fleet.yaml it wrote"
)


def _hidden_launch(model: str, layers: str) -> tuple[tuple[int, ...], int]:
    """``--hidden-layers`` resolved against the target's depth (its config.json): the aux
    layers plus the last (vLLM's id N), and the hidden size (what the simulator writes)."""
    from draftdata.hidden.backend import read_model_facts
    from draftdata.hidden.layers import parse_layers

    if not Path(model).is_dir():
        raise ConfigError(
            f"--hidden-states: --model {model!r} is not a local model folder; its config.json "
            "gives the layers to capture"
        )
    facts = read_model_facts(model)
    aux = parse_layers(layers, facts.num_layers)
    return (*aux, facts.num_layers), facts.hidden_size


class UpOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The options of ``draftdata fleet up``, in ``--help``'s order; a ``Setting`` field sets
    that ``LaunchConfig`` key (the others are parsed into theirs, ``_launch_config``)."""

    engine: Annotated[
        str,
        typer.Option("--engine", help="sglang, vllm, sim (draftdata's simulator) or command."),
        SETTING,
    ]
    model: Annotated[
        str,
        typer.Option("--model", help="Model path or hub id the servers load (sim: served name)."),
        SETTING,
    ]
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="GPUs, e.g. 0-7 or 0,2,5: one server per GPU. Default: every GPU nvidia-smi "
            "lists (sim: one server).",
        ),
    ] = None
    port_base: Annotated[
        int, typer.Option("--port-base", help="Server i listens on PORT_BASE+i."), SETTING
    ] = 30000
    host: Annotated[str, typer.Option("--host", help="Address the servers bind."), SETTING] = (
        "127.0.0.1"
    )
    dp: Annotated[
        int,
        typer.Option(
            "--dp",
            help="Data parallelism: ONE server over all --gpus with N replicas (sglang "
            "--dp-size, vllm --data-parallel-size) instead of one server per GPU.",
        ),
        SETTING,
    ] = 1
    extra_args: Annotated[
        str,
        typer.Option(
            "--extra-args",
            help="Flags appended to every server's command line; a flag the preset also sets "
            'replaces the preset\'s value, e.g. "--context-length 16384".',
        ),
    ] = ""
    no_preset: Annotated[
        bool,
        typer.Option(
            "--no-preset", help="Drop the engine's tuning flags (keep only model, host and port)."
        ),
    ] = False
    env: Annotated[
        list[str],
        typer.Option("--env", help="KEY=VALUE added to every server's environment (repeatable)."),
    ] = []
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="--engine command: a template with {gpu} {port} {model} {host} {index} "
            "{python}, e.g. 'my-server --port {port}'.",
        ),
        SETTING,
    ] = None
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="Interpreter that runs the engine (sglang/vllm/sim). Default: "
            "$DRAFTDATA_ENGINE_PYTHON, else the one running draftdata.",
        ),
        SETTING,
    ] = None
    out: Annotated[Path, typer.Option("--out", help="fleet.yaml to write.")] = Path("fleet.yaml")
    log_dir: Annotated[
        Path, typer.Option("--log-dir", help="One log file per server goes here.")
    ] = Path("fleet-logs")
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for every server to be ready.")
    ] = 900.0
    foreground: Annotated[
        bool,
        typer.Option("--foreground", help="Stay, report crashes, and stop the fleet on Ctrl-C."),
    ] = False
    restart_on_crash: Annotated[
        bool,
        typer.Option(
            "--restart-on-crash",
            help="Restart a crashed server (after --restart-delay, doubling to 5min); without "
            "--foreground "
            "a detached watcher does it.",
        ),
    ] = False
    restart_delay: Annotated[
        float,
        typer.Option(
            "--restart-delay",
            help="First restart delay in seconds; doubles per consecutive crash up to 300.",
        ),
    ] = 5.0
    allow_partial: Annotated[
        bool,
        typer.Option(
            "--allow-partial",
            help="Keep the servers that started when some failed (default: stop them all).",
        ),
    ] = False
    hidden_states: Annotated[
        Path | None,
        typer.Option(
            "--hidden-states",
            help="Launch for `hidden-states --engine vllm`: every server extracts hidden states "
            "(vLLM's extract_hidden_states method and hidden-states KV connector) and writes "
            "them under this folder, which the hidden-states command must see too.",
        ),
    ] = None
    hidden_layers: Annotated[
        str,
        typer.Option(
            "--hidden-layers",
            help="With --hidden-states: the layers captured, eagle3 or I,J,K (the ids of "
            "hidden-states --layers); the last layer is always captured too.",
        ),
    ] = "eagle3"
    hidden_connector: Annotated[
        str | None,
        typer.Option(
            "--hidden-connector",
            help="With --hidden-states: the KV connector class, or MODULE:CLASS for one the "
            "engine's python imports. Default: vLLM's ExampleHiddenStatesConnector.",
        ),
        SETTING,
    ] = None
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print each server's command line and added environment; start nothing.",
        ),
    ] = False
    quiet: Quiet = False


def _up(opts: UpOptions) -> None:
    """Start one inference server per GPU, wait until each serves, write fleet.yaml."""
    from draftdata.fleet.manage import fleet_up, plan_servers
    from draftdata.shared import paths

    paths.output_file(opts.out, "--out")
    paths.output_folder(opts.log_dir, "--log-dir")
    if opts.python is not None and "/" in opts.python:
        paths.input_file(opts.python, "--python")
    cfg = _launch_config(opts)
    if opts.dry_run:
        for plan in plan_servers(cfg):
            added = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env)
            typer.echo(f"server {plan.index} {plan.url}: {added} {shlex.join(plan.argv)}")
        return
    if cfg.hidden_states is not None:  # where the servers write; vLLM expects it there
        Path(cfg.hidden_states).mkdir(parents=True, exist_ok=True)
    fleet_up(
        cfg,
        opts.out,
        timeout_s=opts.timeout,
        foreground=opts.foreground,
        restart=opts.restart_on_crash,
        allow_partial=opts.allow_partial,
        restart_delay_s=opts.restart_delay,
        echo=typer.echo,
    )


def _launch_config(opts: UpOptions) -> Any:
    """The ``LaunchConfig`` of the options: extra args split, GPUs and environment parsed, the
    hidden-state layers resolved against the model."""
    from draftdata.fleet.launch import HIDDEN_ENGINES, LaunchConfig, parse_env, parse_gpus
    from draftdata.shared import paths

    try:
        extra = tuple(shlex.split(opts.extra_args))
    except ValueError as exc:
        raise ConfigError(f"--extra-args {opts.extra_args!r}: {exc}") from None
    hidden = opts.hidden_states
    layer_ids: tuple[int, ...] = ()
    width: int | None = None
    if hidden is not None:  # a wrong path first, whatever the engine
        paths.output_folder(hidden, "--hidden-states")
    if hidden is not None and opts.engine in HIDDEN_ENGINES:  # else LaunchConfig says no
        layer_ids, width = _hidden_launch(opts.model, opts.hidden_layers)
    elif opts.hidden_connector is not None and hidden is None:
        raise ConfigError("--hidden-connector is only used with --hidden-states DIR")
    return LaunchConfig(
        **settings(opts),
        gpus=parse_gpus(opts.gpus) if opts.gpus is not None else None,
        extra_args=extra,
        env=parse_env(opts.env),
        preset_args=not opts.no_preset,
        log_dir=str(opts.log_dir),
        hidden_states=str(hidden.resolve()) if hidden is not None else None,
        hidden_layers=layer_ids,
        hidden_size=width,
    )


class StatusOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The argument and options of ``draftdata fleet status``."""

    fleet: Annotated[Path, typer.Argument(help="fleet.yaml of the fleet.")] = Path("fleet.yaml")
    quiet: Quiet = False


def _status(opts: StatusOptions) -> None:
    """Show each server's process, health, running/waiting requests and uptime.

    Exit code 1 when any server is unhealthy.
    """
    from draftdata.fleet.manage import fleet_status, format_uptime
    from draftdata.shared import paths

    paths.input_file(opts.fleet, "fleet status", NO_FLEET_HINT)
    rows = fleet_status(opts.fleet)
    typer.echo(
        f"{'#':>2}  {'url':<28} {'process':<9} {'health':<7} {'run':>5} {'wait':>5} "
        f"{'cap':>5}  {'uptime':>7}  model"
    )
    for r in rows:
        typer.echo(
            f"{r.index:>2}  {r.url:<28} {r.process:<9} {'ok' if r.healthy else 'DOWN':<7} "
            f"{'-' if r.running is None else r.running:>5} "
            f"{'-' if r.waiting is None else r.waiting:>5} "
            f"{r.capacity or '-':>5}  {format_uptime(r.uptime_s):>7}  {r.model or '-'}"
        )
    bad = sum(not r.healthy for r in rows)
    typer.echo(f"{len(rows) - bad} of {len(rows)} servers healthy")
    if bad:
        raise typer.Exit(1)


class DownOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The argument and options of ``draftdata fleet down``."""

    fleet: Annotated[Path, typer.Argument(help="fleet.yaml written by fleet up.")] = Path(
        "fleet.yaml"
    )
    grace: Annotated[
        float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")
    ] = 30.0
    quiet: Quiet = False


def _down(opts: DownOptions) -> None:
    """Stop exactly the servers `fleet up` started (pid + start time checked)."""
    from draftdata.fleet.manage import fleet_down
    from draftdata.shared import paths

    paths.input_file(opts.fleet, "fleet down", NO_FLEET_HINT)
    for line in fleet_down(opts.fleet, grace_s=opts.grace):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add `up`, `status` and `down` to the fleet sub-app."""
    command(app, "up", UpOptions)(_up)
    command(app, "status", StatusOptions)(_status)
    command(app, "down", DownOptions)(_down)
