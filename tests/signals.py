"""Children that a test signals start with the default disposition of the signals it sends.

A child inherits an ignored signal (exec keeps SIG_IGN, drops handlers) and the signal mask.
Started from a background job of a non-interactive shell, the suite has SIGINT ignored, and a
CI runner or a thread may hand down a blocked SIGTERM: a child started as it is would not
stop at the test's Ctrl-C, or (a Python program that finds SIGINT ignored installs no
KeyboardInterrupt handler) would skip its own signal handling, and the test would fail, or pass
testing nothing, by how the suite was started. ``tests/conftest.py`` restores SIGINT in the
suite itself; a test that signals its child also passes ``preexec_fn=default_signals``, so the
verdict does not depend on the parent at all (SIGKILL and SIGSTOP cannot be ignored or blocked
and need nothing).
"""

from __future__ import annotations

import os
import signal

import psutil

# the signals tests send their children (SIGKILL, SIGSTOP and SIGCONT always act)
SENT = (signal.SIGINT, signal.SIGTERM)


def default_signals() -> None:
    """``preexec_fn`` for a child a test will signal: SIGINT and SIGTERM at their default
    disposition and unblocked, whatever this process has (it runs in the forked child, before
    exec, and calls only what is safe there)."""
    for sig in SENT:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SENT)


def session_processes(sid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of session ``sid``: a command a test started with
    ``start_new_session=True`` and every process it made (workers, the resource tracker)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found
