"""Skeleton: the owning stage replaces this."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's fleet commands to `app`."""
