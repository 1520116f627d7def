"""Errors of every shape, raised in a worker process (``test_worker_deaths``): a module of
its own, so a spawned worker imports it without the test's imports."""

from __future__ import annotations

import threading

from draftdata.errors import RowError


class TwoArgs(Exception):
    """An ``__init__`` that takes other arguments than ``args``: it does not unpickle."""

    def __init__(self, what: str, where: str) -> None:
        super().__init__(f"{what} on {where}")


class HoldsLock(Exception):
    """An attribute that does not pickle."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def make(shape: str, text: str) -> Exception:
    if shape == "TwoArgs":
        return TwoArgs(text, "cuda:1")
    if shape == "HoldsLock":
        return HoldsLock(text)
    if shape == "RowError":
        return RowError("bad_json", text)
    return ValueError(text)


def fail(shape: str, text: str) -> None:
    """A task, or an initializer, that raises ``make(shape, text)``."""
    raise make(shape, text)
