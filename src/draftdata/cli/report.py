"""`draftdata report` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `report` command to `app`."""

    @app.command("report")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("report: not built yet")
