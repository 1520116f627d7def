"""Free ports for the servers a test starts by number (``fleet up --port-base``, the
walkthrough's commands), safe beside other tests running at the same time.

A port found free by binding port 0 lies in the kernel's ephemeral range (32768-60999 on
Linux), where, until the server binds it, any outgoing connection or another test's bind(0)
may take it; with pytest-xdist's workers side by side that happens. These ports come from
below that range, each worker (``$PYTEST_XDIST_WORKER``: gw0, gw1, ...) scanning a stretch of
its own from a random place, and never handed out twice by one process.
"""

from __future__ import annotations

import os
import random
import socket

LOW = 20000  # the stretches lie in [LOW, LOW + STRETCH * WORKERS), below the ephemeral range
STRETCH = 1000
WORKERS = 12  # a worker gwN scans stretch N % WORKERS
_given: set[int] = set()  # ports this process handed out already


def _stretch() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:]) if worker[2:].isdigit() else 0
    start = LOW + (k % WORKERS) * STRETCH
    return range(start, start + STRETCH)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base(n: int = 1) -> int:
    """A port P such that P..P+n-1 are all free now and were not handed out before here."""
    ports = _stretch()
    first = random.randrange(len(ports))
    for i in range(len(ports)):
        base = ports.start + (first + i) % len(ports)
        want = range(base, base + n)
        if want.stop > ports.stop or any(p in _given for p in want):
            continue
        if all(_free(p) for p in want):
            _given.update(want)
            return base
    raise RuntimeError(f"no {n} free ports in a row in {ports.start}-{ports.stop - 1}")
