"""`draftdata fleet ...`: `sim` is in fleet_sim.py; up, status, down in fleet_servers.py."""

from __future__ import annotations

import typer

from draftdata.cli import fleet_servers, fleet_sim

app = typer.Typer(
    help="Launch, watch and stop inference servers (or a simulated fleet).",
    no_args_is_help=True,
)
fleet_sim.register(app)
fleet_servers.register(app)
