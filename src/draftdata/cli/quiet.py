"""``-q/--quiet`` for every command: print nothing but errors.

A command has a ``quiet: Quiet = False`` field in its options (``cli/options.py``), which runs
its body under ``quiet_output``. With ``-q`` the body runs with stdout and stderr sent to the
null device and logging off, so progress lines, summaries and library warnings vanish; a
DraftdataError still leaves the body and ``main`` prints it as the one ``error:`` line, and a
usage error is Click's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Annotated

import typer

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]


@contextlib.contextmanager
def quiet_output(enabled: bool) -> Iterator[None]:
    """While active (and ``enabled``), stdout, stderr and logging print nothing."""
    if not enabled:
        yield
        return
    previous = logging.root.manager.disable
    with (
        open(os.devnull, "w", encoding="utf-8") as null,
        contextlib.redirect_stdout(null),
        contextlib.redirect_stderr(null),
    ):
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(previous)
