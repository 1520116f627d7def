"""Settings hashes and the change messages."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.store.manifest import diff_settings, manifest_bytes, new_manifest, settings_hash


def test_hash_ignores_key_order() -> None:
    a = {"model": "m", "sampling": {"temperature": 0.6, "top_p": 0.95}}
    b = {"sampling": {"top_p": 0.95, "temperature": 0.6}, "model": "m"}
    assert settings_hash(a) == settings_hash(b)
    assert settings_hash(a) != settings_hash({**a, "model": "n"})


def test_diff_names_each_changed_leaf() -> None:
    old = {"model": "m", "sampling": {"temperature": 0.6, "top_k": 20}}
    new = {"model": "m", "sampling": {"temperature": 0.7, "min_p": 0.1}}
    assert diff_settings(old, new) == [
        "sampling.min_p: (unset) -> 0.1",
        "sampling.temperature: 0.6 -> 0.7",
        "sampling.top_k: 20 -> (unset)",
    ]


@settings(max_examples=60, deadline=None)
@given(
    settings_=st.recursive(
        st.one_of(
            st.sampled_from([math.nan, math.inf, -math.inf]),
            st.floats(),
            st.integers(),
            st.text(max_size=5),
            st.none(),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )
)
def test_a_manifest_is_json_or_refused_naming_the_setting(settings_: Any) -> None:
    """Any settings either make a manifest every JSON parser reads (no NaN/Infinity tokens), or
    are refused with a ConfigError; never a manifest that is not JSON."""
    try:
        manifest = new_manifest({"sampling": settings_})
    except ConfigError as exc:
        assert "NaN or infinity" in str(exc)
        assert "sampling" in str(exc)
        return
    text = manifest_bytes(manifest).decode()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
