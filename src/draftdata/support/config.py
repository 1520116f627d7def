"""YAML configuration: typed structs with defaults, and errors that name file, key and type.

Each stage defines its own config struct (``prepare/config.py``, ``generate/config.py``, ...)
as a frozen, keyword-only msgspec Struct with defaults; ``load_config`` reads YAML into it.
An unknown key, a wrong type or an unparsable file is a ConfigError such as::

    gen.yaml: sampling.temperatur: unknown key
    gen.yaml: sampling.temperature: expected float, got str

A value given by a command-line flag is named by its flag, not by a config key
(``--reasoning: 'yes' is not one of on, off, server``): ``Origins`` remembers which settings
the flags gave, and every message about a loaded setting names it through ``Origins.name``.

This module does not know any stage's settings; it only does the loading and the messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec
import yaml

from draftdata.errors import ConfigError

T = TypeVar("T")

_UNKNOWN = re.compile(r"Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?")
_AT = re.compile(r"^(.*) - at `\$\.?([^`]*)`$")


def _join(path: str, key: str) -> str:
    path = re.sub(r"\[(\d+)\]", r".\1", path).strip(".")
    return f"{path}.{key}" if path else key


Namer = Callable[[str], str]  # a setting's dotted key -> how a message names it


def in_file(where: str) -> Namer:
    """Name a setting as a key of ``where`` (a file, or "config"): ``gen.yaml: order``."""
    return lambda key: f"{where}: {key or '(top level)'}"


class Origins:
    """Which settings of a loaded config the command-line flags gave (the rest came from the
    file ``where``, or are defaults), so that a message names what the user wrote: the flag
    (``--reasoning``) for a flag's value, the file's key (``gen.yaml: reasoning``) for the
    file's. ``flag_names`` maps a key whose flag is not ``--`` + the key with dashes (e.g.
    ``endpoints`` -> ``--endpoint``); a key of a group of flags (``sampling.top_p``, from
    ``--top-p``) is named by its last part, a key inside one flag's value by the flag
    (``--extra-body (min_p)``)."""

    def __init__(
        self, where: str, flagged: set[str], flag_names: Mapping[str, str] | None = None
    ) -> None:
        self.where = where
        self.flagged = flagged  # dotted keys the flags gave (a dict flag: each of its keys)
        self.flag_names = dict(flag_names or {})

    def name(self, key: str) -> str:
        """How a message names the setting at dotted ``key`` (``sources.0.name`` too)."""
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            head = ".".join(parts[:n])
            if head in self.flagged:
                flag = self.flag_names.get(head) or "--" + parts[n - 1].replace("_", "-")
                rest = ".".join(parts[n:])
                return f"{flag} ({rest})" if rest else flag
        return in_file(self.where)(key)


def explain(err: msgspec.ValidationError, where: str | Namer) -> ConfigError:
    """Turn msgspec's validation message into ``where: key: what is wrong`` (``where``: the
    file, or a ``Namer`` of the keys)."""
    name = in_file(where) if isinstance(where, str) else where
    text = str(err)
    m = _UNKNOWN.match(text)
    if m:
        return ConfigError(f"{name(_join(m.group(2) or '', m.group(1)))}: unknown key")
    m = _AT.match(text)
    if m:
        what, path = m.group(1), re.sub(r"\[(\d+)\]", r".\1", m.group(2)).strip(".")
        what = what.replace("`", "").replace("Expected ", "expected ")
        return ConfigError(f"{name(path)}: {what}")
    return ConfigError(f"{name('')}: {text}")


def allowed_values(type_: Any, path: str) -> list[str] | None:
    """The values a ``Literal`` field at dotted ``path`` of struct ``type_`` allows (None when
    the field is not a Literal), e.g. ``reasoning`` -> ``["on", "off", "server"]``."""
    t: Any = type_
    for part in path.split(".") if path else []:
        t = _unwrap(t)
        if part.isdigit() or get_origin(t) in (list, dict):
            args = get_args(t)
            t = args[-1] if args else None
            if part.isdigit():
                continue
            t = _unwrap(t)
        try:
            t = get_type_hints(t).get(part) if isinstance(t, type) else None
        except (NameError, TypeError):
            return None
        if t is None:
            return None
    values = [a for a in _literal_args(t) if isinstance(a, str)]
    return values or None


def _unwrap(t: Any) -> Any:
    """``X | None`` -> ``X``."""
    args = [a for a in get_args(t) if a is not type(None)]
    if get_origin(t) in (Union, UnionType) and len(args) == 1:
        return args[0]
    return t


def _literal_args(t: Any) -> list[Any]:
    if get_origin(t) is Literal:
        return list(get_args(t))
    if get_origin(t) in (Union, UnionType):
        return [v for a in get_args(t) for v in _literal_args(a)]
    return []


def convert(data: Any, type_: type[T], where: str | Namer) -> T:
    """Validate plain data (from YAML, CLI overrides, ...) into ``type_``; an invalid choice
    lists the allowed values. ``where``: the file the data came from, or a ``Namer``."""
    try:
        return msgspec.convert(data, type_, strict=False)
    except msgspec.ValidationError as exc:
        err = explain(exc, where)
        m = re.match(r"Invalid enum value (.*) - at `\$\.?([^`]*)`$", str(exc))
        if m:
            path = re.sub(r"\[(\d+)\]", r".\1", m.group(2)).strip(".")
            allowed = allowed_values(type_, path)
            if allowed:
                name = in_file(where) if isinstance(where, str) else where
                raise ConfigError(
                    f"{name(path)}: {m.group(1)} is not one of {', '.join(allowed)}"
                ) from exc
        raise err from exc


class _Yaml12BoolLoader(yaml.SafeLoader):
    """SafeLoader whose booleans are YAML 1.2's (true/false only).

    YAML 1.1 reads ``on``/``off``/``yes``/``no`` as booleans, so ``reasoning: on`` would be
    ``True`` where draftdata expects the string "on"; here they stay strings.
    """


_Yaml12BoolLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12BoolLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def read_yaml(path: Path | str) -> dict[str, Any]:
    """Read a YAML mapping; errors name the file (and line, for syntax errors)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: {p} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config ({exc.strerror})") from exc
    try:
        data = yaml.load(text, Loader=_Yaml12BoolLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{p}{line}: invalid YAML: {problem}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of settings, got {type(data).__name__}")
    return data


def load_config(path: Path | str | None, type_: type[T], **overrides: Any) -> T:
    """Load ``path`` (or defaults when None) into ``type_``; non-None ``overrides`` (the
    flags) win; an error names a flag's value by its flag (``load_with_origins``)."""
    return load_with_origins(path, type_, **overrides)[0]


def load_with_origins(
    path: Path | str | None,
    type_: type[T],
    *,
    flag_names: Mapping[str, str] | None = None,
    flag_groups: Collection[str] = (),
    **overrides: Any,
) -> tuple[T, Origins]:
    """Load ``path`` (or defaults when None) into ``type_``; non-None ``overrides`` win (a dict
    merged one level deep into the file's). ``flag_groups``: overrides that are dicts of
    several flags, one per key (``sampling``: ``--temperature``, ``--top-p``, ...); any other
    override is one flag. Returns the config and its ``Origins``, which the command's further
    checks name their settings with; a value that does not convert is named so already.
    """
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    flagged: set[str] = set()
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and key in flag_groups:  # each key is a flag's
            flagged.update(f"{key}.{k}" for k in value)
        else:
            flagged.add(key)
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    origins = Origins(str(path) if path is not None else "config", flagged, flag_names)
    return convert(data, type_, origins.name), origins
