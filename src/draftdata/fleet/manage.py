"""``fleet up``, ``fleet status`` and ``fleet down`` over a fleet.yaml and its state file.

``fleet_up`` plans the servers, refuses ports that are taken and a fleet.yaml that still
describes a live fleet, starts every server, writes a provisional fleet.yaml at once (so even an
interrupted ``up`` can be taken ``down``), waits for readiness (one line per server), then writes
the final fleet.yaml. It then returns, leaving the servers running; with ``foreground`` it stays
and supervises them until Ctrl-C (then stops them); with ``restart`` and no ``foreground`` it
leaves a small detached watcher process that restarts crashed servers. ``fleet_status`` probes
each endpoint (process, health, load, uptime); ``fleet_down`` stops exactly the processes
fleet.yaml records, verified by pid and start time.

The state file ``<fleet.yaml>.state`` (JSON) holds what a restart needs (each server's argv,
environment and log) and the watcher's identity; fleet.yaml stays the public contract.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import msgspec

from draftdata.errors import ConfigError, FleetError
from draftdata.fleet.launch import (
    VLLM_HIDDEN_CONNECTOR,
    LaunchConfig,
    ServerPlan,
    Started,
    check_engine,
    detect_gpus,
    engine_python,
    installed_version,
    plan_fleet,
    port_in_use,
    start_server,
)
from draftdata.fleet.procs import Identity, describe_pid, stop_process
from draftdata.fleet.supervise import Backoff, Fate, fate_line, wait_ready, watch
from draftdata.shared import endpoints
from draftdata.shared.fleetspec import (
    EndpointSpec,
    FleetSpec,
    HiddenStatesSpec,
    no_fleet_file,
    process_start_time,
    read_fleet,
    write_fleet,
)
from draftdata.support.redact import redact_url

STATE_FORMAT = "draftdata.fleet-state/1"
Echo = Callable[[str], None]


class FleetState(msgspec.Struct, kw_only=True, frozen=True):
    """What ``down`` and the restart watcher need beyond fleet.yaml."""

    format: str = STATE_FORMAT
    plans: list[ServerPlan] = msgspec.field(default_factory=list)
    restart: bool = False
    watcher: Identity | None = None
    backoff: Backoff = msgspec.field(default_factory=Backoff)


def state_path(fleet_path: Path) -> Path:
    """Where the state file of ``fleet_path`` lives (``fleet.yaml.state``)."""
    return fleet_path.with_name(fleet_path.name + ".state")


def read_state(fleet_path: Path) -> FleetState | None:
    """The state file next to ``fleet_path``, or None when there is none (hand-written fleet)."""
    p = state_path(fleet_path)
    try:
        state = msgspec.json.decode(p.read_bytes(), type=FleetState)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{p}: unreadable fleet state ({exc}); delete it if stale") from exc
    if state.format != STATE_FORMAT:
        raise ConfigError(f"{p}: format {state.format!r}; this draftdata reads {STATE_FORMAT}")
    return state


def write_state(fleet_path: Path, state: FleetState) -> None:
    """Write the state file atomically."""
    p = state_path(fleet_path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    tmp.replace(p)


def _ident(ep: EndpointSpec) -> Identity | None:
    return Identity(pid=ep.pid, pgid=ep.pgid, started=ep.started) if ep.pid is not None else None


def _provisional(s: Started) -> EndpointSpec:
    p = s.plan
    engine = p.engine if p.engine in ("sglang", "vllm") else None
    return EndpointSpec(
        url=p.url, pid=s.pid, pgid=s.pgid, started=s.started, gpu=p.gpu, engine=engine, log=p.log
    )


def _check_out(out: Path) -> None:
    """Refuse to overwrite a fleet.yaml whose servers still run (their pids would be lost)."""
    if not out.exists():
        return
    try:
        old = read_fleet(out)
    except ConfigError:
        return
    for ep in old.endpoints:
        ident = _ident(ep)
        if ident is not None and describe_pid(ident)[0] == "ours":
            raise FleetError(
                f"{out} describes a running fleet ({ep.url}, pid {ep.pid}); run "
                f"`draftdata fleet down {out}` first, or pass another --out"
            )


def _stop_all(started: Sequence[Started], echo: Echo, grace_s: float = 15.0) -> None:
    for s in started:
        what = stop_process(Identity(pid=s.pid, pgid=s.pgid, started=s.started), grace_s=grace_s)
        echo(f"server {s.plan.index} {s.plan.url} pid {s.pid}: {what}")


def fleet_spec(cfg: LaunchConfig, endpoints: list[EndpointSpec]) -> FleetSpec:
    """fleet.yaml's contents for the fleet ``cfg`` launches, with ``endpoints`` (and, for a
    fleet that extracts hidden states, where they are written and which layers)."""
    hidden = None
    if cfg.hidden_states is not None:
        hidden = HiddenStatesSpec(
            path=cfg.hidden_states,
            layers=list(cfg.hidden_layers),
            connector=cfg.hidden_connector
            or (VLLM_HIDDEN_CONNECTOR if cfg.engine == "vllm" else None),
        )
    return FleetSpec(engine=cfg.engine, model=cfg.model, endpoints=endpoints, hidden_states=hidden)


def plan_servers(cfg: LaunchConfig) -> list[ServerPlan]:
    """The fleet's servers as ``fleet up`` would start them: the GPUs (detected when not
    given), and SGLang's preset named as the installed SGLang knows its flags."""
    gpus = cfg.gpus if cfg.gpus is not None else ("0",) if cfg.engine == "sim" else detect_gpus()
    if cfg.engine == "sglang" and cfg.preset_args and cfg.engine_version is None:
        version = installed_version(engine_python(cfg), "sglang")
        cfg = msgspec.structs.replace(cfg, engine_version=version)
    return plan_fleet(cfg, gpus)


def fleet_up(
    cfg: LaunchConfig,
    out: Path,
    *,
    timeout_s: float = 900.0,
    foreground: bool = False,
    restart: bool = False,
    allow_partial: bool = False,
    restart_delay_s: float = 5.0,
    echo: Echo = print,
) -> FleetSpec:
    """Start the fleet ``cfg`` describes, wait until it serves and write ``out`` (fleet.yaml).

    Raises FleetError (after stopping everything it started) when the engine is not installed
    (before starting anything), a port is taken, a server cannot start, or (unless
    ``allow_partial``) any server fails to become ready.
    """
    if restart_delay_s <= 0:
        raise ConfigError(f"--restart-delay {restart_delay_s}: must be > 0 seconds")
    backoff = Backoff(first_s=restart_delay_s, max_s=max(300.0, restart_delay_s))
    plans = plan_servers(cfg)
    _check_out(out)
    check_engine(cfg, plans)
    taken = [p for p in plans if port_in_use(p.host, p.port)]
    for p in taken:
        echo(f"server {p.index} gpu {p.gpu} {p.url}: FAILED: port {p.port} is already in use")
    if taken:
        raise FleetError(
            f"{len(taken)} of {len(plans)} ports are already in use "
            f"({', '.join(str(p.port) for p in taken)}); stop what listens there or pick "
            "another --port-base"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    servers: list[tuple[Started, subprocess.Popen[bytes]]] = []
    spec = fleet_spec(cfg, [])
    try:
        for plan in plans:
            servers.append(start_server(plan))
        started = [s for s, _ in servers]
        spec = fleet_spec(cfg, [_provisional(s) for s in started])
        write_fleet(spec, out)
        write_state(out, FleetState(plans=plans, restart=restart, backoff=backoff))
        echo(f"started {len(started)} {cfg.engine} servers; waiting up to {timeout_s:.0f}s")
        fates = asyncio.run(
            wait_ready(servers, timeout_s, report=lambda f, s: echo(fate_line(f, s)))
        )
    except BaseException:
        _stop_all([s for s, _ in servers], echo)
        state_path(out).unlink(missing_ok=True)
        if servers:
            out.unlink(missing_ok=True)
        raise
    state = FleetState(plans=plans, restart=restart, backoff=backoff)
    return _finish(cfg, out, servers, fates, state, foreground, allow_partial, echo)


def _finish(
    cfg: LaunchConfig,
    out: Path,
    servers: list[tuple[Started, subprocess.Popen[bytes]]],
    fates: list[Fate],
    state: FleetState,
    foreground: bool,
    allow_partial: bool,
    echo: Echo,
) -> FleetSpec:
    bad = [s for (s, _), f in zip(servers, fates, strict=True) if not f.ok]
    good = [(s, p) for (s, p), f in zip(servers, fates, strict=True) if f.ok]
    if bad and (not allow_partial or not good):
        _stop_all([s for s, _ in servers], echo)
        state_path(out).unlink(missing_ok=True)
        out.unlink(missing_ok=True)
        raise FleetError(
            f"{len(bad)} of {len(servers)} servers failed to start (see the lines above); "
            "every server was stopped"
            + ("" if allow_partial else " (--allow-partial keeps the rest)")
        )
    _stop_all(bad, echo)
    endpoints = [f.endpoint for f in fates if f.ok and f.endpoint is not None]
    spec = fleet_spec(cfg, endpoints)
    write_fleet(spec, out)
    state = msgspec.structs.replace(state, plans=[s.plan for s, _ in good])
    write_state(out, state)
    echo(f"fleet ready: {len(endpoints)} of {len(servers)} servers -> {out}")
    if foreground:
        # `fleet down` from another shell stops this process first (by pid only: its process
        # group is the user's shell job), which then stops the servers.
        me = Identity(pid=os.getpid(), started=process_start_time(os.getpid()))
        write_state(out, msgspec.structs.replace(state, watcher=me))
        _foreground(out, good, state.restart, state.backoff, echo)
    elif state.restart:
        watcher = _spawn_watcher(out, cfg.log_dir)
        write_state(out, msgspec.structs.replace(state, watcher=watcher))
        echo(f"restart-on-crash watcher pid {watcher.pid} (stopped by `draftdata fleet down`)")
    return spec


def _replace_endpoint(out: Path, endpoint: EndpointSpec) -> None:
    spec = read_fleet(out)
    eps = [endpoint if ep.url == endpoint.url else ep for ep in spec.endpoints]
    write_fleet(msgspec.structs.replace(spec, endpoints=eps), out)


def _foreground(
    out: Path,
    servers: Sequence[tuple[Started, subprocess.Popen[bytes] | None]],
    restart: bool,
    backoff: Backoff,
    echo: Echo,
) -> None:
    """Supervise until SIGINT/SIGTERM, then stop every server of the fleet."""

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        echo("supervising in the foreground; Ctrl-C stops the fleet")
        await watch(
            servers,
            restart=restart,
            stop=stop,
            echo=echo,
            backoff=backoff,
            on_restart=lambda _, ep: _replace_endpoint(out, ep),
        )

    try:
        asyncio.run(run())
    finally:
        for line in fleet_down(out):
            echo(line)


def _spawn_watcher(out: Path, log_dir: str) -> Identity:
    """Start the detached restart watcher (its own session) and return its identity."""
    log = Path(log_dir) / "watcher.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    code = "from draftdata.fleet.manage import watcher_main; watcher_main()"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(out.resolve())],
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Identity(pid=proc.pid, pgid=proc.pid, started=process_start_time(proc.pid))


def watcher_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the detached watcher: restart crashed servers of one fleet until SIGTERM."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0])
    state = read_state(out)
    if state is None:
        raise SystemExit(f"{out}: no fleet state; nothing to watch")
    by_url = {ep.url: ep for ep in read_fleet(out).endpoints}
    servers: list[tuple[Started, subprocess.Popen[bytes] | None]] = []
    for plan in state.plans:
        ep = by_url.get(plan.url)
        if ep is not None and ep.pid is not None and ep.started is not None:
            s = Started(plan=plan, pid=ep.pid, pgid=ep.pgid or ep.pid, started=ep.started)
            servers.append((s, None))

    def echo(line: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", flush=True)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        echo(f"watching {len(servers)} servers of {out} (pid {os.getpid()})")
        await watch(
            servers,
            restart=True,
            stop=stop,
            echo=echo,
            backoff=state.backoff,
            on_restart=lambda _, ep: _replace_endpoint(out, ep),
        )

    asyncio.run(run())


def fleet_down(path: Path, *, grace_s: float = 30.0) -> list[str]:
    """Stop the servers ``path`` records (and its watcher); one line per server.

    Only processes whose pid and start time match what ``fleet up`` recorded are signalled
    (SIGTERM to the server's process group, SIGKILL after ``grace_s``); an endpoint without a
    recorded pid, or whose pid now belongs to another process, is left alone.
    """
    if not path.exists():
        raise no_fleet_file(path)
    lines: list[str] = []
    state = read_state(path)
    if state is not None and state.watcher is not None and state.watcher.pid != os.getpid():
        lines.append(f"watcher pid {state.watcher.pid}: {stop_process(state.watcher, grace_s=10)}")
    spec = read_fleet(path)
    for i, ep in enumerate(spec.endpoints):
        ident = _ident(ep)
        what = (
            "no pid recorded: not started by draftdata, left alone"
            if ident is None
            else stop_process(ident, grace_s=grace_s)
        )
        shown = redact_url(ep.url)
        lines.append(f"server {i} {shown}" + (f" pid {ep.pid}" if ep.pid else "") + f": {what}")
    state_path(path).unlink(missing_ok=True)
    return lines


class ServerStatus(msgspec.Struct, kw_only=True, frozen=True):
    """One row of ``fleet status``."""

    index: int
    url: str
    process: str  # running | exited | reused | external
    healthy: bool
    running: int | None = None
    waiting: int | None = None
    uptime_s: float | None = None
    model: str | None = None
    capacity: int | None = None


async def _status_all(spec: FleetSpec) -> list[ServerStatus]:

    async with aiohttp.ClientSession() as session:

        async def one(i: int, ep: EndpointSpec) -> ServerStatus:
            ident = _ident(ep)
            if ident is None:
                process = "external"
            else:
                state = describe_pid(ident)[0]
                process = {"ours": "running", "gone": "exited"}.get(state, state)
            healthy = await endpoints.probe_health(session, ep.url, timeout=5)
            load = await endpoints.probe_load(session, ep.url, ep.engine or "unknown", timeout=5)
            return ServerStatus(
                index=i,
                url=redact_url(ep.url),
                process=process,
                healthy=healthy,
                running=load.running if load else None,
                waiting=load.waiting if load else None,
                uptime_s=time.time() - ep.started if ep.started and process == "running" else None,
                model=ep.model,
                capacity=ep.max_running_requests,
            )

        return list(await asyncio.gather(*(one(i, ep) for i, ep in enumerate(spec.endpoints))))


def fleet_status(path: Path) -> list[ServerStatus]:
    """Probe every endpoint of ``path``: process state, /health, running/waiting, uptime."""
    return asyncio.run(_status_all(read_fleet(path)))


def format_uptime(seconds: float | None) -> str:
    """``3d04h``, ``2h05m``, ``4m07s`` or ``-``."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"
