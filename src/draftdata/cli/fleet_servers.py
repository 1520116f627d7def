"""`draftdata fleet up | status | down`: launch, watch and stop real (or simulated) servers.

Each command parses its options into a ``LaunchConfig`` / a fleet.yaml path and calls one
function of ``draftdata.fleet.manage``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from draftdata.cli.quiet import QUIET, quietable
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


def register(app: typer.Typer) -> None:
    """Add `up`, `status` and `down` to the fleet sub-app."""

    @app.command("up")
    @quietable
    def up(
        engine: str = typer.Option(
            ..., "--engine", help="sglang, vllm, sim (draftdata's simulator) or command."
        ),
        model: str = typer.Option(
            ..., "--model", help="Model path or hub id the servers load (sim: served name)."
        ),
        gpus: str | None = typer.Option(
            None,
            "--gpus",
            help="GPUs, e.g. 0-7 or 0,2,5: one server per GPU. Default: every GPU nvidia-smi "
            "lists (sim: one server).",
        ),
        port_base: int = typer.Option(
            30000, "--port-base", help="Server i listens on PORT_BASE+i."
        ),
        host: str = typer.Option("127.0.0.1", "--host", help="Address the servers bind."),
        dp: int = typer.Option(
            1,
            "--dp",
            help="Data parallelism: ONE server over all --gpus with N replicas (sglang "
            "--dp-size, vllm --data-parallel-size) instead of one server per GPU.",
        ),
        extra_args: str = typer.Option(
            "",
            "--extra-args",
            help="Flags appended to every server's command line; a flag the preset also sets "
            'replaces the preset\'s value, e.g. "--context-length 16384".',
        ),
        no_preset: bool = typer.Option(
            False,
            "--no-preset",
            help="Drop the engine's tuning flags (keep only model, host and port).",
        ),
        env: list[str] = typer.Option(
            [], "--env", help="KEY=VALUE added to every server's environment (repeatable)."
        ),
        command: str | None = typer.Option(
            None,
            "--command",
            help="--engine command: a template with {gpu} {port} {model} {host} {index} "
            "{python}, e.g. 'my-server --port {port}'.",
        ),
        python: str | None = typer.Option(
            None,
            "--python",
            help="Interpreter that runs the engine (sglang/vllm/sim). Default: "
            "$DRAFTDATA_ENGINE_PYTHON, else the one running draftdata.",
        ),
        out: Path = typer.Option(Path("fleet.yaml"), "--out", help="fleet.yaml to write."),
        log_dir: Path = typer.Option(
            Path("fleet-logs"), "--log-dir", help="One log file per server goes here."
        ),
        timeout: float = typer.Option(
            900.0, "--timeout", help="Seconds to wait for every server to be ready."
        ),
        foreground: bool = typer.Option(
            False, "--foreground", help="Stay, report crashes, and stop the fleet on Ctrl-C."
        ),
        restart_on_crash: bool = typer.Option(
            False,
            "--restart-on-crash",
            help="Restart a crashed server (after --restart-delay, doubling to 5min); without "
            "--foreground "
            "a detached watcher does it.",
        ),
        restart_delay: float = typer.Option(
            5.0,
            "--restart-delay",
            help="First restart delay in seconds; doubles per consecutive crash up to 300.",
        ),
        allow_partial: bool = typer.Option(
            False,
            "--allow-partial",
            help="Keep the servers that started when some failed (default: stop them all).",
        ),
        hidden_states: Path | None = typer.Option(
            None,
            "--hidden-states",
            help="Launch for `hidden-states --engine vllm`: every server extracts hidden states "
            "(vLLM's extract_hidden_states method and hidden-states KV connector) and writes "
            "them under this folder, which the hidden-states command must see too.",
        ),
        hidden_layers: str = typer.Option(
            "eagle3",
            "--hidden-layers",
            help="With --hidden-states: the layers captured, eagle3 or I,J,K (the ids of "
            "hidden-states --layers); the last layer is always captured too.",
        ),
        hidden_connector: str | None = typer.Option(
            None,
            "--hidden-connector",
            help="With --hidden-states: the KV connector class, or MODULE:CLASS for one the "
            "engine's python imports. Default: vLLM's ExampleHiddenStatesConnector.",
        ),
        dry_run: bool = typer.Option(
            False,
            "--dry-run",
            help="Print each server's command line and added environment; start nothing.",
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Start one inference server per GPU, wait until each serves, write fleet.yaml."""
        from draftdata import paths
        from draftdata.fleet.launch import HIDDEN_ENGINES, LaunchConfig, parse_env, parse_gpus
        from draftdata.fleet.manage import fleet_up, plan_servers

        paths.output_file(out, "--out")
        paths.output_folder(log_dir, "--log-dir")
        if python is not None and "/" in python:
            paths.input_file(python, "--python")
        try:
            extra = tuple(shlex.split(extra_args))
        except ValueError as exc:
            raise ConfigError(f"--extra-args {extra_args!r}: {exc}") from None
        layer_ids: tuple[int, ...] = ()
        width: int | None = None
        if hidden_states is not None and engine in HIDDEN_ENGINES:  # else LaunchConfig says no
            paths.output_folder(hidden_states, "--hidden-states")
            layer_ids, width = _hidden_launch(model, hidden_layers)
        elif hidden_connector is not None and hidden_states is None:
            raise ConfigError("--hidden-connector is only used with --hidden-states DIR")
        cfg = LaunchConfig(
            engine=engine,
            model=model,
            gpus=parse_gpus(gpus) if gpus is not None else None,
            port_base=port_base,
            host=host,
            dp=dp,
            extra_args=extra,
            env=parse_env(env),
            command=command,
            preset_args=not no_preset,
            python=python,
            log_dir=str(log_dir),
            hidden_states=str(hidden_states.resolve()) if hidden_states is not None else None,
            hidden_connector=hidden_connector,
            hidden_layers=layer_ids,
            hidden_size=width,
        )
        if dry_run:
            for plan in plan_servers(cfg):
                added = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env)
                typer.echo(f"server {plan.index} {plan.url}: {added} {shlex.join(plan.argv)}")
            return
        if cfg.hidden_states is not None:  # where the servers write; vLLM expects it there
            Path(cfg.hidden_states).mkdir(parents=True, exist_ok=True)
        fleet_up(
            cfg,
            out,
            timeout_s=timeout,
            foreground=foreground,
            restart=restart_on_crash,
            allow_partial=allow_partial,
            restart_delay_s=restart_delay,
            echo=typer.echo,
        )

    @app.command("status")
    @quietable
    def status(
        fleet: Path = typer.Argument(Path("fleet.yaml"), help="fleet.yaml of the fleet."),
        quiet: bool = QUIET,
    ) -> None:
        """Show each server's process, health, running/waiting requests and uptime.

        Exit code 1 when any server is unhealthy.
        """
        from draftdata import paths
        from draftdata.fleet.manage import fleet_status, format_uptime

        paths.input_file(fleet, "fleet status", NO_FLEET_HINT)
        rows = fleet_status(fleet)
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

    @app.command("down")
    @quietable
    def down(
        fleet: Path = typer.Argument(Path("fleet.yaml"), help="fleet.yaml written by fleet up."),
        grace: float = typer.Option(30.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
        quiet: bool = QUIET,
    ) -> None:
        """Stop exactly the servers `fleet up` started (pid + start time checked)."""
        from draftdata import paths
        from draftdata.fleet.manage import fleet_down

        paths.input_file(fleet, "fleet down", NO_FLEET_HINT)
        for line in fleet_down(fleet, grace_s=grace):
            typer.echo(line)
