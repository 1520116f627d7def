"""`draftdata export` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `export` command to `app`."""

    @app.command("export")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("export: not built yet")
