"""Progress of a hidden-states command: committed samples, tokens and bytes, rates over a
sliding window, and the ETA, as one line on stderr at most every ``every`` seconds::

    hidden-states: 1,204/53,120 samples, 3.9M/171M tokens (2.3%), 2.1 GB; 41K tok/s, ETA 1 h 8 min

The counters are cumulative and fed by the stage as commits land (``add``); rates are
differences over ``window`` seconds, the ETA is the tokens left at the window's pace (the
pace since the start while the window is young). The clock is injectable (tests drive it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from draftdata.hidden.bill import human_bytes, human_count, human_time


class Progress:
    """Sliding-window rates over committed samples, tokens and bytes (see the docstring)."""

    def __init__(
        self,
        total_samples: int,
        total_tokens: int,
        *,
        show: Callable[[str], None] | None,
        every: float = 5.0,
        window: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_samples = total_samples
        self.total_tokens = total_tokens
        self.show = show
        self.every = every
        self.window = window
        self.clock = clock
        self.samples = 0
        self.tokens = 0
        self.bytes = 0
        self.started = clock()
        self._last_shown = self.started
        self._points: deque[tuple[float, int]] = deque([(self.started, 0)])

    def add(self, samples: int, tokens: int, nbytes: int) -> None:
        """Count what was just committed; show the line when it is due."""
        self.samples += samples
        self.tokens += tokens
        self.bytes += nbytes
        now = self.clock()
        self._points.append((now, self.tokens))
        while len(self._points) > 2 and self._points[1][0] <= now - self.window:
            self._points.popleft()
        if self.show is not None and now - self._last_shown >= self.every:
            self._last_shown = now
            self.show(self.line())

    def rate(self) -> float:
        """Tokens per second over the window (since the start while it is younger)."""
        now, tokens = self._points[-1]
        t0, k0 = self._points[0]
        return (tokens - k0) / (now - t0) if now > t0 else 0.0

    def eta(self) -> float | None:
        """Seconds left at the current rate (None while nothing has been measured)."""
        rate = self.rate()
        left = self.total_tokens - self.tokens
        if left <= 0:
            return 0.0
        return left / rate if rate > 0 else None

    def line(self) -> str:
        """The progress line."""
        share = self.tokens / self.total_tokens if self.total_tokens else 1.0
        eta = self.eta()
        return (
            f"hidden-states: {self.samples:,}/{self.total_samples:,} samples, "
            f"{human_count(self.tokens)}/{human_count(self.total_tokens)} tokens ({share:.1%}), "
            f"{human_bytes(self.bytes)}; {human_count(self.rate())} tok/s, "
            f"ETA {human_time(eta) if eta is not None else '?'}"
        )
