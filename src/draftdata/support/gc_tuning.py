"""Python's cyclic garbage collector tuned for a long batch loop (generate's engine, prepare's
passes) while it runs.

The engine allocates a few dozen GC-tracked objects per request (HTTP responses, futures,
decoded turns, records) and keeps thousands of jobs alive in its look-ahead window, so with
the default thresholds (a young collection every 700 allocations, a full one whenever a
quarter of the long-lived objects are new) the collector took about a third of the engine's
CPU at zero-latency request rates, most of it in full collections walking every object that
the start-up imports created. prepare decodes millions of rows into dicts and lists that die
young; the young collections cost it about a tenth of its CPU. Almost nothing either builds
is cyclic (records are freed by reference counting), so while one runs:

- the objects alive at its start (modules, classes, the run's manifest) are frozen
  (``gc.freeze``): collections no longer walk them;
- young collections run every ``YOUNG_THRESHOLD`` allocations instead of 700; cyclic garbage
  (tracebacks, closed connections) is still collected, in fewer and larger passes.

Both are undone when the block ends: a program embedding ``generate`` or ``prepare`` gets its
own thresholds back (a threshold of 0, the collector switched off, is kept as it is).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Freeze what is alive and raise the young-generation threshold until the block ends."""
    before = gc.get_threshold()
    gc.freeze()
    if before[0]:
        gc.set_threshold(max(before[0], YOUNG_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
