"""Readiness and supervision of started servers: wait until each serves or has surely failed.

``wait_ready`` watches every started server at once: it polls ``/health`` and ``/v1/models``
(and SGLang's ``/health_generate``), tails the server's log for known fatal patterns (CUDA out of
memory, address already in use, unsupported attention backend, unrecognized arguments, ...) and
notices a process that exited, so a server that cannot start is reported in one line as soon as
that is known, never after the timeout. A ready server is described by an ``EndpointSpec``
(URL, pid, served model id, engine version, context length, capacity) through the probes of
:mod:`draftdata.shared.endpoints`. ``watch`` keeps a started fleet under observation and, when
asked, restarts a crashed server with exponential backoff.

Starting processes is :mod:`draftdata.fleet.launch`; stopping them is :mod:`draftdata.fleet.procs`;
the ``up``/``status``/``down`` operations over fleet.yaml are :mod:`draftdata.fleet.manage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import msgspec

from draftdata.errors import FleetError
from draftdata.fleet.launch import CAPACITY_FLAGS, CONTEXT_FLAGS, Started, start_server
from draftdata.fleet.procs import Identity, describe_pid, stop_process
from draftdata.shared import endpoints
from draftdata.shared.fleetspec import EndpointSpec

# (pattern, what it means): matched against each new log line while a server starts.
FATAL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), why)
    for p, why in (
        (r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", "CUDA out of memory"),
        (r"address already in use|EADDRINUSE|Errno 98", "address already in use"),
        (
            r"attention.backend.*(not supported|unsupported|invalid choice)"
            r"|unsupported attention backend",
            "unsupported attention backend",
        ),
        (r"unrecognized arguments|No such option|invalid choice:", "unrecognized arguments"),
        (r"No CUDA GPUs are available|no CUDA-capable device", "no CUDA GPU visible"),
        (r"Engine core initialization failed", "engine failed to initialise"),
    )
)
POLL_S = 0.5
TAIL_LINES = 20


class Fate(msgspec.Struct, kw_only=True, frozen=True):
    """How one server's start ended: ready (with its endpoint) or failed (with the reason)."""

    index: int
    ok: bool
    seconds: float
    reason: str = ""
    endpoint: EndpointSpec | None = None


def match_fatal(line: str) -> str | None:
    """The meaning of ``line`` if it matches a known fatal pattern, else None."""
    for pattern, why in FATAL_PATTERNS:
        if pattern.search(line):
            return why
    return None


LOG_HEADER = b"# draftdata: "  # the line start_server writes before each start


class LogTail:
    """Reads what a log file gained since the last call; remembers the last lines.

    It starts after the last ``# draftdata:`` header (the command line of the latest start), so
    a restarted server is judged by its own output, not by the crash before it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.last: list[str] = []
        try:
            data = self.path.read_bytes()
        except OSError:
            return
        at = data.rfind(b"\n" + LOG_HEADER)
        at = at + 1 if at >= 0 else (0 if data.startswith(LOG_HEADER) else -1)
        if at >= 0:
            end = data.find(b"\n", at)
            self.offset = len(data) if end < 0 else end + 1

    def new_lines(self) -> list[str]:
        """Complete lines appended since the previous call (a missing file yields none)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        out = [ln.decode("utf-8", "replace").rstrip("\r") for ln in lines]
        self.last = (self.last + [ln for ln in out if ln.strip()])[-TAIL_LINES:]
        return out

    def last_line(self) -> str:
        """The last non-empty line seen (after reading what remains), or ``""``."""
        self.new_lines()
        tail = self.partial.decode("utf-8", "replace").strip()
        return tail or (self.last[-1] if self.last else "")


def _exit_code(started: Started, proc: subprocess.Popen[bytes] | None) -> int | str | None:
    """The exit code when the server process ended, ``"gone"`` when it ended elsewhere."""
    if proc is not None:
        return proc.poll()
    state, _ = describe_pid(Identity(pid=started.pid, pgid=started.pgid, started=started.started))
    return None if state == "ours" else "gone"


async def _version(session: aiohttp.ClientSession, root: str) -> str | None:
    """vLLM's ``GET /version`` (``{"version": ...}``); SGLang reports its own in /server_info."""
    try:
        async with session.get(root + "/version", timeout=aiohttp.ClientTimeout(total=5)) as r:
            if r.status != 200:
                return None
            data = await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None
    v = data.get("version") if isinstance(data, dict) else None
    return v if isinstance(v, str) else None


async def _status(session: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            await resp.read()
            return resp.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


def _int_flag(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def describe(session: aiohttp.ClientSession, started: Started) -> EndpointSpec | None:
    """The fleet.yaml entry of a server that answers ``/v1/models``; None while it does not.

    Context length and capacity come from the server (SGLang ``/server_info``, vLLM
    ``/v1/models``) and fall back to the launch flags (``--context-length``/``--max-model-len``,
    ``--max-running-requests``/``--max-num-seqs``).
    """
    plan = started.plan
    cap = await endpoints.probe_capacity(session, plan.url)
    if cap is None or cap.model is None:
        return None
    version = cap.version or await _version(session, plan.url)
    return EndpointSpec(
        url=plan.url,
        pid=started.pid,
        pgid=started.pgid,
        started=started.started,
        gpu=plan.gpu,
        model=cap.model,
        engine=plan.engine if plan.engine in ("sglang", "vllm") else cap.engine,
        engine_version=version,
        context_length=cap.context_length or _int_flag(plan.flag(*CONTEXT_FLAGS)),
        max_running_requests=cap.max_running or _int_flag(plan.flag(*CAPACITY_FLAGS)),
        log=plan.log,
    )


async def _wait_one(
    session: aiohttp.ClientSession,
    started: Started,
    proc: subprocess.Popen[bytes] | None,
    deadline: float,
    t0: float,
) -> Fate:
    plan = started.plan
    tail = LogTail(plan.log)

    def failed(reason: str) -> Fate:
        return Fate(index=plan.index, ok=False, seconds=time.monotonic() - t0, reason=reason)

    while True:
        for line in tail.new_lines():
            why = match_fatal(line)
            if why is not None:
                return failed(f"{why}: {line.strip()[:200]}")
        code = _exit_code(started, proc)
        if code is not None:
            last = tail.last_line()
            how = "process exited" if code == "gone" else f"process exited with code {code}"
            why = match_fatal(last) if last else None
            return failed(f"{how}{f' ({why})' if why else ''}: {last[:200]}" if last else how)
        if await endpoints.probe_health(session, plan.url, timeout=5):
            endpoint = await describe(session, started)
            needs_generate = plan.engine == "sglang"
            if endpoint is not None and needs_generate:
                code_hg = await _status(session, plan.url + "/health_generate")
                # 404: an SGLang without the route; anything else but 200 means not yet.
                if code_hg not in (200, 404):
                    endpoint = None
            if endpoint is not None:
                return Fate(
                    index=plan.index, ok=True, seconds=time.monotonic() - t0, endpoint=endpoint
                )
        if time.monotonic() >= deadline:
            last = tail.last_line()
            return failed(
                f"not ready after {deadline - t0:.0f}s (still starting?)"
                + (f"; last log line: {last[:200]}" if last else "")
            )
        await asyncio.sleep(POLL_S)


async def wait_ready(
    servers: Sequence[tuple[Started, subprocess.Popen[bytes] | None]],
    timeout_s: float,
    report: Callable[[Fate, Started], None] | None = None,
) -> list[Fate]:
    """Wait for every server to be ready or to have failed; ``report`` is called per fate.

    A server fails at once when its process exits or its log shows a fatal pattern; otherwise it
    fails when ``timeout_s`` passes. Fates come back in server order.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    async with aiohttp.ClientSession() as session:

        async def one(started: Started, proc: subprocess.Popen[bytes] | None) -> Fate:
            fate = await _wait_one(session, started, proc, deadline, t0)
            if report is not None:
                report(fate, started)
            return fate

        return list(await asyncio.gather(*(one(s, p) for s, p in servers)))


def fate_line(fate: Fate, started: Started) -> str:
    """One line per server: where it is and how its start ended."""
    plan = started.plan
    head = f"server {plan.index} gpu {plan.gpu} {plan.url} pid {started.pid}:"
    if fate.ok and fate.endpoint is not None:
        ep = fate.endpoint
        engine = " ".join(x for x in (ep.engine, ep.engine_version) if x)
        return (
            f"{head} ready in {fate.seconds:.1f}s (model {ep.model}, {engine or 'engine ?'}, "
            f"context {ep.context_length or '?'}, capacity {ep.max_running_requests or '?'})"
        )
    return f"{head} FAILED after {fate.seconds:.1f}s: {fate.reason} (log: {plan.log})"


class Backoff(msgspec.Struct, kw_only=True, frozen=True):
    """Restart delays: ``first_s``, doubling up to ``max_s``; reset after ``stable_s`` of uptime."""

    first_s: float = 5.0
    max_s: float = 300.0
    stable_s: float = 600.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (1-based) of one server."""
        return float(min(self.max_s, self.first_s * 2 ** max(0, attempt - 1)))


class _Watched:
    """One supervised server: its current process and restart bookkeeping."""

    def __init__(self, started: Started, proc: subprocess.Popen[bytes] | None) -> None:
        self.started = started
        self.proc = proc
        self.up_since = time.monotonic()
        self.attempts = 0
        self.retry_at: float | None = None


async def watch(
    servers: Sequence[tuple[Started, subprocess.Popen[bytes] | None]],
    *,
    restart: bool,
    stop: asyncio.Event,
    echo: Callable[[str], None],
    on_restart: Callable[[Started, EndpointSpec], None] | None = None,
    backoff: Backoff = Backoff(),
    ready_timeout_s: float = 900.0,
    poll_s: float = 1.0,
) -> None:
    """Watch the servers until ``stop`` is set; report crashes, restart them if ``restart``.

    A crashed server is started again from its plan (its log is appended to, not truncated)
    after ``backoff.delay(n)`` seconds, waited on like at ``fleet up``, and ``on_restart`` is
    called with the new process and endpoint (to rewrite fleet.yaml). A server that stayed up
    ``backoff.stable_s`` before crashing starts again from the first delay.
    """

    watched = [_Watched(s, p) for s, p in servers]
    tasks: set[asyncio.Task[None]] = set()

    async def restart_one(w: _Watched) -> None:
        # Runs as its own task so one slow restart never delays noticing another crash. It
        # always decides what comes next, whatever stops it: the server is watched again, or
        # restarted again after the backoff. (A task that died of an error it did not expect,
        # a full disk or a log folder gone, left the server out of the watch for ever.)
        plan = w.started.plan
        started: Started | None = None
        try:
            started, proc = start_server(plan, append_log=True)
            fates = await wait_ready([(started, proc)], ready_timeout_s)
            echo(fate_line(fates[0], started))
            if fates[0].ok and fates[0].endpoint is not None:
                if on_restart is not None:  # fleet.yaml: what `fleet down` stops
                    on_restart(started, fates[0].endpoint)
                w.started, w.proc = started, proc
                w.up_since, w.retry_at = time.monotonic(), None
                return
            why = ""
        except asyncio.CancelledError:  # the watch ends: a server no fleet.yaml names goes too
            if started is not None:
                _stop_quietly(started)
            raise
        except FleetError as exc:
            why = f"{exc}; "
        except Exception as exc:
            why = f"server {plan.index}: restart failed: {type(exc).__name__}: {exc}; "
        if started is not None:
            _stop_quietly(started)
        w.attempts += 1
        delay = backoff.delay(w.attempts)
        w.retry_at = time.monotonic() + delay
        echo(f"{why}server {plan.index}: restart {w.attempts} in {delay:.0f}s")

    while not stop.is_set():
        now = time.monotonic()
        for w in watched:
            plan = w.started.plan
            if w.retry_at is None:
                code = _exit_code(w.started, w.proc)
                if code is None:
                    continue
                uptime = now - w.up_since
                how = "exited" if code == "gone" else f"exited with code {code}"
                last = LogTail(plan.log).last_line()
                echo(
                    f"server {plan.index} {plan.url} pid {w.started.pid} {how} after "
                    f"{uptime:.0f}s" + (f": {last[:200]}" if last else "")
                )
                if not restart:
                    w.retry_at = float("inf")
                    continue
                if uptime >= backoff.stable_s:
                    w.attempts = 0
                w.attempts += 1
                delay = backoff.delay(w.attempts)
                w.retry_at = now + delay
                echo(f"server {plan.index}: restart {w.attempts} in {delay:.0f}s")
            elif now >= w.retry_at:
                w.retry_at = float("inf")  # until the restart task below decides
                tasks.add(asyncio.create_task(restart_one(w)))
        tasks = {t for t in tasks if not t.done()}
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=poll_s)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # their servers stopped, not left


def _stop_quietly(started: Started) -> None:

    stop_process(Identity(pid=started.pid, pgid=started.pgid, started=started.started), grace_s=10)
