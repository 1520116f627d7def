"""`draftdata merge` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `merge` command to `app`."""

    @app.command("merge")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("merge: not built yet")
