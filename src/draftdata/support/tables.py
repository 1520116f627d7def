"""``table(title, header, rows)``: the rich summary table the CLIs print (first column left),
``console()``: the Console they print with, ``compact(n)``: a large count in a few
characters (token counts), and ``human_bytes(n)``: a size (hidden-states' bill, stats)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table


def console(stderr: bool = False) -> Console:
    """A Console for CLI output. On a terminal: its width. Piped or redirected: lines are never
    wrapped (a summary line stays one line for ``grep`` and logs) and tables get 200 columns
    (``$COLUMNS`` when set), instead of rich's 80."""
    out = Console(stderr=stderr)
    if out.is_terminal:
        return out
    width = None if os.environ.get("COLUMNS") else 200
    return Console(stderr=stderr, soft_wrap=True, width=width)


def table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    """A left-titled table: the first column left-aligned, the (numeric) rest right-aligned."""
    out = Table(title=title, title_justify="left")
    for i, h in enumerate(header):
        out.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        out.add_row(*r)
    return out


def compact(value: float, estimated: bool = False) -> str:
    """``value`` in a few characters (``8,512``, ``45.3K``, ``1.25M``, ``2.10B``), with ``~``
    in front when it is an estimate."""
    v = float(value)
    if abs(v) >= 1e9:
        text = f"{v / 1e9:.2f}B"
    elif abs(v) >= 1e6:
        text = f"{v / 1e6:.2f}M"
    elif abs(v) >= 1e4:
        text = f"{v / 1e3:.1f}K"
    else:
        text = f"{v:,.0f}"
    return f"~{text}" if estimated else text


def human_bytes(n: float) -> str:
    """``7.0 TB``, ``412 GB``, ``3.1 MB``, ``870 B`` (decimal units)."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 100 else f"{v:,.0f} {unit}"
    return f"{int(n)} B"
