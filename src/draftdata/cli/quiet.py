"""``-q/--quiet`` for every command: print nothing but errors.

A command takes ``quiet: bool = QUIET`` and is decorated with ``@quietable`` (below
``@app.command``), or has a ``quiet: Quiet = False`` field in its options (``cli/options.py``).
With ``-q`` the body runs with stdout and stderr sent to the null device and logging off, so
progress lines, summaries and library warnings vanish; a DraftdataError still
leaves the body and ``main`` prints it as the one ``error:`` line, and a usage error is Click's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import typer

QUIET: Any = typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]

F = TypeVar("F", bound=Callable[..., Any])


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


def quietable(fn: F) -> F:
    """Run the command ``fn`` under ``quiet_output`` when it is called with ``quiet=True``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with quiet_output(bool(kwargs.get("quiet"))):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
