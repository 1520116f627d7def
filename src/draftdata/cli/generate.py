"""`draftdata generate` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `generate` command to `app`."""

    @app.command("generate")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("generate: not built yet")
