"""`draftdata tokenize` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `tokenize` command to `app`."""

    @app.command("tokenize")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("tokenize: not built yet")
