"""A command's options declared once, as a typed record that Typer reads.

Each command declares its options as one frozen msgspec ``Struct``: a field is one option (or
argument), its type and default are the option's, and its ``Annotated`` metadata holds the
``typer.Option``/``typer.Argument`` that names and describes it, plus ``Setting`` where the
option sets a key of the stage's config. ``command`` hands Typer the Struct's fields as the
command's parameters, in order, and calls the command's body with one instance; ``settings``
reads the instance's ``Setting`` fields back as config keys, so the option → config mapping is
the Struct itself.

Importing this module imports Typer and msgspec only (``draftdata --help`` stays instant); it
parses nothing and checks no value: the config a command builds validates itself.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
import typer

from draftdata.cli.quiet import quiet_output

Opts = TypeVar("Opts", bound=msgspec.Struct)


class Setting:
    """``Annotated`` metadata: this option sets the config key ``key`` (default: the field's
    own name); ``"outer.inner"`` is a key of the nested table ``outer``."""

    __slots__ = ("key",)

    def __init__(self, key: str | None = None) -> None:
        self.key = key


SETTING = Setting()

# --protect as every command writing a dataset takes it (the config key ``protect``)
Protect = Annotated[
    list[str],
    typer.Option(
        "--protect",
        metavar="PREFIX",
        help="A prefix the output may not equal, contain or lie inside (repeatable).",
    ),
    SETTING,
]


def _hints(options: type[msgspec.Struct]) -> dict[str, Any]:
    return typing.get_type_hints(options, include_extras=True)


@functools.cache
def _setting_keys(options: type[msgspec.Struct]) -> tuple[tuple[str, str], ...]:
    """(field, config key) of every field marked ``Setting``, in declaration order."""
    hints = _hints(options)
    keys = []
    for name in options.__struct_fields__:
        for meta in getattr(hints[name], "__metadata__", ()):
            if isinstance(meta, Setting):
                keys.append((name, meta.key or name))
    return tuple(keys)


def settings(options: msgspec.Struct) -> dict[str, Any]:
    """The values of the options marked ``Setting``, by their config key (a dotted key in its
    nested table: ``{"sampling": {"seed": 1}}``)."""
    out: dict[str, Any] = {}
    for name, key in _setting_keys(type(options)):
        *outer, inner = key.split(".")
        table = out
        for part in outer:
            table = table.setdefault(part, {})
        table[inner] = getattr(options, name)
    return out


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return inspect.Parameter.empty  # a required argument: its Typer info says so


def command(
    app: typer.Typer, name: str, options: type[Opts]
) -> Callable[[Callable[[Opts], None]], Callable[..., None]]:
    """Register ``body(opts)`` as the command ``name`` of ``app`` with the fields of
    ``options`` as its parameters; ``body``'s docstring is the command's help. A field named
    ``quiet`` (``quiet.Quiet``) runs the body under ``quiet.quiet_output``."""
    hints = _hints(options)
    params = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=_default(field),
            annotation=hints[field.name],
        )
        for field in msgspec.structs.fields(options)
    ]

    def register(body: Callable[[Opts], None]) -> Callable[..., None]:
        def _cmd(**values: Any) -> None:
            with quiet_output(bool(values.get("quiet"))):
                body(options(**values))

        _cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        _cmd.__annotations__ = {p.name: p.annotation for p in params}
        _cmd.__doc__ = body.__doc__
        _cmd.__module__ = body.__module__
        _cmd.__qualname__ = _cmd.__name__ = body.__name__
        app.command(name)(_cmd)
        return _cmd

    return register
