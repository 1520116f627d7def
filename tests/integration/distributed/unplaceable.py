"""A driver asked for tasks no node of the 2-CPU local cluster can run: refused in one line
within a bound, never left waiting for a node that could run them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from draftdata.errors import ConfigError

WITHIN_S = 30.0


def refused_at_once(go: Callable[[], object], what: str, cpus: float) -> ConfigError:
    """Run ``go`` in a daemon thread (a hang must not hold pytest's exit); it must end within
    ``WITHIN_S`` with a one-line ConfigError naming the ask and what the node has."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            go()
            outcome.append(None)
        except BaseException as exc:  # judged below
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WITHIN_S)
    assert not t.is_alive(), f"{what} with {cpus:g} CPUs per task waits for ever"
    (exc,) = outcome
    assert isinstance(exc, ConfigError), exc
    assert f"one task of {cpus:g} CPU" in str(exc) and "2 CPU" in str(exc), str(exc)
    assert "\n" not in str(exc)
    return exc
