"""`draftdata prepare` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `prepare` command to `app`."""

    @app.command("prepare")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("prepare: not built yet")
