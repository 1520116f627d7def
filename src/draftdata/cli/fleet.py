"""`draftdata fleet ...` (skeleton: the fleet stage replaces this)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Launch, watch and stop inference servers (or a simulated fleet).")
