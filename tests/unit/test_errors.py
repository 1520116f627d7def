"""errors.py is the one exception tree: no module defines an exception of its own, and the
module's docstring draws every class it holds."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import signal

from hypothesis import given
from hypothesis import strategies as st

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


def _tree(cls: type[BaseException]) -> list[type[BaseException]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _tree(sub))]


def _made(cls: type[BaseException]) -> st.SearchStrategy[BaseException]:
    """Instances made by the class's own ``__init__``: its parameters' annotated types (a
    signal number where one is asked), or a message where it takes Exception's."""
    own = next(k for k in cls.__mro__ if "__init__" in vars(k))
    if own in (Exception, BaseException):
        return st.text().map(cls)
    signums = st.sampled_from([signal.SIGINT, signal.SIGTERM])
    wanted = inspect.signature(vars(own)["__init__"]).parameters
    return st.builds(cls, **({"signum": signums} if "signum" in wanted else {}))


@given(
    exc=st.sampled_from(
        [c for c in _tree(errors.DraftdataError) if c.__module__ == errors.__name__]
        + [errors.Interrupted]
    ).flatmap(_made)
)
def test_every_error_comes_back_from_a_pickle_as_it_was(exc: BaseException) -> None:
    """Every error of the tree, made by its own ``__init__``, is itself after a pickle: a worker
    process's error reaches the command that way. One whose ``__init__`` takes other arguments
    than ``args`` did not unpickle (``RowError``, ``RefusedRequestError``, ``Interrupted``: the
    pool broke, said as a worker that died) or came back altered (``EmptyInputError``'s text
    twice)."""
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert back.args == exc.args
    assert str(back) == str(exc)
    assert vars(back) == vars(exc)
