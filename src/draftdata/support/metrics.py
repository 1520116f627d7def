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


# -- what a stage left out or cut -------------------------------------------------------------

WARN_SHARE = 0.05  # above this share of what came in, left-out or cut rows earn a warning line


def share(n: int, total: int) -> str:
    """``n`` of ``total`` as a percentage with one decimal (``0.0%`` when ``total`` is 0)."""
    return f"{100.0 * n / total:.1f}%" if total else "0.0%"


def accounted(total: int, what: str, parts: list[tuple[str, int, str]], kept: int) -> str:
    """``of N <what>: part n (p%), part n (p%; why), ...``: where ``total`` went, each row
    counted in exactly one part (``(name, count, why)``; ``why`` may be ""), beside the
    ``kept`` rows the line's head counts. The parts and ``kept`` must add up to ``total``: a
    count line that does not is a bug in the counts (ValueError), never a line shown."""
    if sum(n for _, n, _ in parts) + kept != total or any(n < 0 for _, n, _ in parts):
        shown = ", ".join(f"{name} {n}" for name, n, _ in parts)
        raise ValueError(f"counts that do not add up: {total} {what} vs {shown}, kept {kept}")
    said = ", ".join(
        f"{name} {n:,} ({share(n, total)}{'; ' + why if why else ''})" for name, n, why in parts
    )
    return f"of {total:,} {what}: {said}"


def reasons(parts: dict[str, int]) -> str:
    """``reason n, reason n`` of the non-zero counts, in the given order ("" when none)."""
    return ", ".join(f"{k} {v:,}" for k, v in parts.items() if v)


def loss_warning(lost: int, total: int, what: str, detail: str, advice: str) -> str | None:
    """One ``warning:`` line when ``lost`` of ``total`` is more than ``WARN_SHARE``, else None:
    ``warning: 76 of 151 samples cut or left out (50.3%: truncated 57 at 512 tokens, ...);
    raise --max-length``.

    Every command that drops, cuts or truncates rows counts them in its summary line; this
    line is for when they are a share worth acting on (``what`` says what was lost, ``detail``
    how, ``advice`` what to do about it)."""
    if not total or lost <= WARN_SHARE * total:
        return None
    how = f": {detail}" if detail else ""
    return f"warning: {lost:,} of {total:,} {what} ({share(lost, total)}{how}); {advice}"
