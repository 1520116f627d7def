"""`draftdata demo` (skeleton: the owning stage replaces this)."""

from __future__ import annotations

import typer

from draftdata.errors import DraftdataError


def register(app: typer.Typer) -> None:
    """Add the `demo` command to `app`."""

    @app.command("demo")
    def _cmd() -> None:
        """Not built yet."""
        raise DraftdataError("demo: not built yet")
