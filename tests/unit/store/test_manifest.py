"""Settings hashes and the change messages."""

from __future__ import annotations

from draftdata.store.manifest import diff_settings, settings_hash


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
