"""Every number a generate setting holds is validated as one class (issue 24: ``--temperature
nan`` was written as NaN into manifest.json): non-finite values and values out of the setting's
range are a one-line ConfigError naming the option, whichever setting it is, top level, in
``sampling`` or in an override; values in range pass."""

from __future__ import annotations

import math
import types
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.generate.config import (
    NUMBER_RULES,
    GenerateConfig,
    Override,
    Sampling,
    option_name,
    validate,
)

BASE: dict[str, Any] = {"prompts": "p.jsonl", "out": "run", "endpoints": ["http://127.0.0.1:1"]}


def _numeric(tp: Any) -> type | None:
    """float or int when the field's type admits a number (None otherwise)."""
    args = typing.get_args(tp) if isinstance(tp, types.UnionType) or typing.get_args(tp) else ()
    options = args or (tp,)
    if float in options:
        return float
    if int in options:
        return int
    return None


def _fields() -> list[tuple[str, type, type]]:
    """(path, struct, number type) of every numeric setting."""
    out = []
    for struct, prefix in ((GenerateConfig, ""), (Sampling, "sampling."), (Override, "o.")):
        for f in msgspec.structs.fields(struct):
            kind = _numeric(f.type)
            if kind is not None:
                out.append((prefix + f.name, struct, kind))
    return out


FIELDS = _fields()


def _config(path: str, value: Any) -> GenerateConfig:
    key = path.rpartition(".")[2]
    if path.startswith("sampling."):
        return GenerateConfig(**BASE, sampling=Sampling(**{key: value}))
    if path.startswith("o."):
        return GenerateConfig(**BASE, overrides=[Override(domain="math", **{key: value})])
    return GenerateConfig(**BASE, **{key: value})


def test_every_numeric_setting_has_a_rule() -> None:
    assert len(FIELDS) >= 30
    missing = [p for p, _, _ in FIELDS if p.rpartition(".")[2] not in NUMBER_RULES]
    assert missing == []


def _bad_values(key: str, kind: type) -> st.SearchStrategy[Any]:
    least, inclusive, most = NUMBER_RULES[key]
    options: list[st.SearchStrategy[Any]] = []
    if kind is float:
        options.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    if least is not None:
        if kind is int:
            top = int(least) - (0 if not inclusive else 1)
            options.append(st.integers(max_value=top, min_value=top - 10**9))
        else:
            below = st.floats(max_value=least, allow_nan=False, allow_infinity=False)
            options.append(below.filter(lambda v: v < least or (v == least and not inclusive)))
    if most is not None:
        if kind is int:
            options.append(st.integers(min_value=int(most) + 1))
        else:
            above = st.floats(min_value=most, allow_nan=False, allow_infinity=False)
            options.append(above.filter(lambda v: v > most))
    return st.one_of(options) if options else st.nothing()


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_bad_number_in_any_setting_is_one_line_naming_it(data: st.DataObject) -> None:
    path, _, kind = data.draw(st.sampled_from(FIELDS))
    key = path.rpartition(".")[2]
    least, _, most = NUMBER_RULES[key]
    if kind is int and least is None and most is None:
        return  # any integer is valid (seed)
    value = data.draw(_bad_values(key, kind))
    name = option_name(path.replace("o.", "overrides.0.", 1))
    with pytest.raises(ConfigError) as err:
        validate(_config(path, value))
    said = str(err.value)
    assert "\n" not in said
    assert said.startswith(f"generate: {name}: "), said
    assert "finite" in said or "range" in said


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_number_in_range_passes(data: st.DataObject) -> None:
    path, _, kind = data.draw(st.sampled_from(FIELDS))
    key = path.rpartition(".")[2]
    least, inclusive, most = NUMBER_RULES[key]
    low = least if least is not None else -(10**6)
    high = most if most is not None else low + 10**6
    if kind is int:
        value: Any = data.draw(st.integers(int(low) + (0 if inclusive else 1), int(high)))
    else:
        value = data.draw(st.floats(low, high, exclude_min=not inclusive))
    if key == "concurrency" and kind is int:
        value = max(1, value)
    validate(_config(path, value))


def test_flags_name_the_option_and_yaml_keys_the_key() -> None:
    assert option_name("read_timeout") == "--read-timeout"
    assert option_name("sampling.temperature") == "--temperature"
    assert option_name("sampling.min_p") == "sampling.min_p"
    assert option_name("backoff_max") == "backoff_max"
    assert option_name("overrides.0.max_tokens") == "overrides.0.max_tokens"


@pytest.mark.parametrize("value", [math.nan, math.inf, [1.0, -math.inf], {"a": math.nan}])
def test_non_finite_numbers_in_extra_body_are_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match="--extra-body: NaN and Infinity"):
        validate(GenerateConfig(**BASE, extra_body={"x": value}))
