"""Process identity and stopping: never signal a process draftdata did not start.

A server is identified by its pid, its process-group id and the kernel's start time of the pid
(``EndpointSpec.pid/pgid/started``). ``is_ours`` checks that the pid still runs the process we
started (a reused pid has another start time); ``group_members`` lists the live processes of that
group started no earlier than it (the engine's workers, e.g. vLLM's EngineCore); ``stop_process``
sends SIGTERM to them, waits, then SIGKILLs what is left, re-checking identity before each signal.

This module knows nothing about HTTP, fleets or fleet.yaml.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import msgspec
import psutil

# Kernel start times are derived from boot time + clock ticks; the same process reads back equal
# to well under this, a reused pid differs by at least the time between the two processes.
START_TOLERANCE_S = 0.5


class Identity(msgspec.Struct, kw_only=True, frozen=True):
    """Who a server process is: pid, process group, kernel start time (epoch seconds)."""

    pid: int
    pgid: int | None = None
    started: float | None = None


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def describe_pid(ident: Identity) -> tuple[str, psutil.Process | None]:
    """``("ours", proc)``, ``("gone", None)`` or ``("reused", None)`` for a recorded identity.

    ``"unknown"`` when no start time was recorded (a hand-written fleet.yaml): such a pid is never
    signalled, since nothing proves it is ours.
    """
    try:
        proc = psutil.Process(ident.pid)
        created = float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone", None
    if not _alive(proc):
        return "gone", None
    if ident.started is None:
        return "unknown", None
    if abs(created - ident.started) > START_TOLERANCE_S:
        return "reused", None
    return "ours", proc


def is_ours(ident: Identity) -> bool:
    """True when ``ident.pid`` is alive and is the very process that was recorded."""
    return describe_pid(ident)[0] == "ours"


def group_members(ident: Identity) -> list[psutil.Process]:
    """Live processes of ``ident``'s process group that started no earlier than the leader.

    Without a recorded pgid only the process itself (when it is ours) is listed; without a
    start time, nothing. The leader itself is included while it lives.
    """
    if ident.started is None:
        return []
    if ident.pgid is None:
        state, proc = describe_pid(ident)
        return [proc] if state == "ours" and proc is not None else []
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != ident.pgid:
                continue
            if float(proc.create_time()) < ident.started - START_TOLERANCE_S:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
            continue
        if _alive(proc):
            out.append(proc)
    return out


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


def stop_process(
    ident: Identity,
    *,
    grace_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Stop the recorded server and its workers: SIGTERM, wait ``grace_s``, then SIGKILL.

    Returns what happened in a few words (``"stopped"``, ``"killed after 30s"``, ``"already
    stopped"``, ``"pid reused by another process: left alone"``, ...). Only processes whose
    identity checks out are signalled.
    """
    state, _leader = describe_pid(ident)
    if state == "unknown":
        return "no start time recorded: not started by draftdata, left alone"
    if state == "reused":
        # The pid (and so the group id) was handed to a new process: that group is not ours.
        return f"pid {ident.pid} now belongs to another process: left alone"
    members = group_members(ident)
    if not members:
        return "already stopped"
    _signal_all(members, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        members = [p for p in members if _alive(p)]
        if not members:
            return "stopped"
        sleep(0.1)
    # Re-list: workers may have been forked meanwhile; the identity check still applies.
    if describe_pid(ident)[0] == "reused":
        return "stopped"
    members = group_members(ident)
    if not members:
        return "stopped"
    _signal_all(members, signal.SIGKILL)
    for proc in members:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
            proc.wait(timeout=10)
    return f"killed after {grace_s:g}s (did not stop on SIGTERM)"
