"""`draftdata stats` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `stats` command to `app`."""

    @app.command("stats")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("stats: not built yet")
