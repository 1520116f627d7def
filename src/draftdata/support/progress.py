"""Progress as every stage shows it: one look, on a terminal or in a log.

``RowProgress(stage)`` is the progress of a loop over rows (prepare's sources, merge's inputs
and routing): call it with ``(what, rows so far)``. On a terminal it is rich's ``Progress``:
one line per ``what``, its rows, its own speed (rich's per-task estimate) and elapsed time,
refreshed at most ``REFRESH_PER_SECOND`` times a second however often it is called. Off a
terminal (a log, a pipe, a test) it prints a plain line every ``interval`` seconds,
``STAGE: WHAT: N rows (R rows/s)``, and always the last count of each ``what``: when the next
one starts and at ``close``, so a short input shows all its rows, not the first batch's. The
CLI makes none with ``-q``.

generate's engine has its own live view (per endpoint: state, in-flight, tokens/s; an ETA),
built from the same parts: the bold stage name first, numbers with thousands separators,
``fmt_duration`` for times, ``REFRESH_PER_SECOND``, and a plain ``STAGE: ...`` line off a
terminal. This module prints to stderr and keeps no state between commands.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

REFRESH_PER_SECOND = 2  # live views redraw at most this often
PLAIN_INTERVAL_S = 2.0  # seconds between two plain lines


def fmt_duration(seconds: float | None) -> str:
    """``4m05s``, ``1h02m`` (hours with thousands separators); ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h:,}h{m:02d}m" if h else f"{m}m{s:02d}s"


def rate_line(stage: str, what: str, rows: int, seconds: float) -> str:
    """``STAGE: WHAT: N rows (R rows/s)``, the plain progress line."""
    rate = rows / max(seconds, 1e-9)
    return f"{stage}: {what}: {rows:,} rows ({rate:,.0f} rows/s)"


class _Speed(ProgressColumn):
    """A task's own rows/s: rich's estimate over its recent updates while it runs, its whole
    average once it has stopped (or before rich has two updates to measure)."""

    def render(self, task: Task) -> Text:
        speed = task.speed if task.started and not task.stop_time else None
        if speed is None and task.elapsed:
            speed = task.completed / task.elapsed
        return Text("" if speed is None else f"{speed:,.0f} rows/s", style="cyan")


class _Elapsed(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"elapsed {fmt_duration(task.elapsed)}", style="dim")


class RowProgress:
    """``progress(what, rows)`` for a loop over rows (module docstring)."""

    def __init__(
        self,
        stage: str,
        *,
        console: Console | None = None,
        interval: float = PLAIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.console = console if console is not None else Console(stderr=True)
        self.interval = interval
        self.clock = clock
        self.what: str | None = None
        self.rows = 0
        self.started = self.last_call = clock()  # a WHAT begins when the one before ended
        self.last_print = float("-inf")
        self.shown = True  # whether ``rows`` of ``what`` is on screen (plain lines)
        self.live = self.console.is_terminal
        self._bar: Progress | None = None  # the live view, while one is up
        self._task: TaskID | None = None

    def _live(self) -> Progress:
        if self._bar is None:
            self._bar = Progress(
                TextColumn(f"[bold]{self.stage}[/]"),
                TextColumn("{task.description}", markup=False),
                TextColumn("{task.completed:,.0f} rows"),
                _Speed(),
                _Elapsed(),
                console=self.console,
                refresh_per_second=REFRESH_PER_SECOND,
            )
            self._bar.start()
            self._task = None
        return self._bar

    def __call__(self, what: str, rows: int) -> None:
        now = self.clock()
        bar = self._live() if self.live else None
        if what != self.what or (bar is not None and self._task is None):
            self._show_last()
            if what != self.what:
                self.what, self.started = what, self.last_call
            if bar is not None:
                if self._task is not None:
                    bar.stop_task(self._task)
                self._task = bar.add_task(what, total=None)
        self.rows, self.shown, self.last_call = rows, False, now
        if bar is not None and self._task is not None:
            bar.update(self._task, completed=rows)
        elif now - self.last_print >= self.interval:
            self._print(now)

    def _print(self, now: float) -> None:
        assert self.what is not None
        self.console.print(
            rate_line(self.stage, self.what, self.rows, now - self.started),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        self.last_print, self.shown = now, True

    def _show_last(self) -> None:
        if not self.live and self.what is not None and not self.shown:
            self._print(self.clock())

    def close(self) -> None:
        """Show the last count where it is not on screen yet; stop the live view (a later
        call starts another, below what was printed in between)."""
        self._show_last()
        if self._bar is not None:
            if self._task is not None:
                self._bar.stop_task(self._task)
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> RowProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
