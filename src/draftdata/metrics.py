"""One small mechanism for stage statistics: named counters and timers.

A stage creates a ``StageStats``, calls ``add("rejected.empty_content")`` or wraps work in
``with stats.timed("encode"):``, and returns it; the CLI prints ``stats.to_dict()`` and writes it
into the stage's summary file. Dotted names group naturally (``dropped.too_long``). The clock is
injectable so tests can drive it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class StageStats:
    """Counters and wall-time totals of one stage run."""

    def __init__(self, stage: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stage = stage
        self.counters: Counter[str] = Counter()
        self.timings: dict[str, float] = {}
        self._clock = clock
        self._started = clock()

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        self.counters[name] += n

    def get(self, name: str) -> int:
        """The value of counter ``name`` (0 if never added)."""
        return self.counters.get(name, 0)

    def group(self, prefix: str) -> dict[str, int]:
        """Counters under ``prefix.`` with the prefix removed, e.g. group('dropped')."""
        p = prefix + "."
        return {k[len(p) :]: v for k, v in sorted(self.counters.items()) if k.startswith(p)}

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Accumulate the wall time spent inside the block under ``name``."""
        start = self._clock()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + self._clock() - start

    @property
    def elapsed(self) -> float:
        """Seconds since the stats object was created."""
        return self._clock() - self._started

    def merge(self, other: StageStats) -> None:
        """Fold another stats object (e.g. from a worker) into this one."""
        self.counters.update(other.counters)
        for k, v in other.timings.items():
            self.timings[k] = self.timings.get(k, 0.0) + v

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view: stage, counters, timings and elapsed seconds."""
        return {
            "stage": self.stage,
            "counters": dict(sorted(self.counters.items())),
            "timings_s": {k: round(v, 4) for k, v in sorted(self.timings.items())},
            "elapsed_s": round(self.elapsed, 4),
        }
