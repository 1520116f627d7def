"""``table(title, header, rows)``: the rich summary table the CLIs print (first column left)."""

from __future__ import annotations

from rich.table import Table


def table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    """A left-titled table: the first column left-aligned, the (numeric) rest right-aligned."""
    out = Table(title=title, title_justify="left")
    for i, h in enumerate(header):
        out.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        out.add_row(*r)
    return out
