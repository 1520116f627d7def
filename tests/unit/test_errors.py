"""errors.py is the one exception tree: no module defines an exception of its own, and the
module's docstring draws every class it holds."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import draftdata
from draftdata import errors


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(draftdata.__path__, "draftdata.")]


def test_no_exception_is_defined_outside_errors_py() -> None:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and name != "draftdata.errors"
            ):
                found.append(f"{name}.{attr}")
    assert found == [], "exceptions belong in errors.py (its docstring is the list)"


def test_the_docstring_names_every_exception_of_errors_py() -> None:
    doc = errors.__doc__ or ""
    classes = [
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == "draftdata.errors"
    ]
    assert len(classes) > 20
    assert [c for c in classes if c not in doc] == []
