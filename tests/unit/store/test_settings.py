"""A generate run's settings: one typed record, the manifest's JSON keys and hash unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import StoreError
from draftdata.generate.answers.thinking import recorded
from draftdata.generate.config import GenerateConfig, Override, Sampling
from draftdata.generate.preflight import run_settings
from draftdata.generate.prompts.source import Scan
from draftdata.store.manifest import settings_hash
from draftdata.store.opener import open_store
from draftdata.store.run import Run
from draftdata.store.settings import (
    PromptsIdentity,
    RunSettings,
    recorded_settings,
    settings_of,
)
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import history_policy

FOUND = Scan(sha256="ab" * 32, bytes=123, prompts=7, in_scope=7)
NULL_SAMPLING = {
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "min_p": None,
    "presence_penalty": None,
    "frequency_penalty": None,
    "repetition_penalty": None,
    "seed": None,
    "stop": None,
}


def test_the_json_keys_and_hash_are_those_runs_already_recorded() -> None:
    # the settings and hashes the dict-building run_settings wrote before the typed record: a
    # run started then resumes now without a settings change
    plain = run_settings(GenerateConfig(prompts="p", out="o", endpoints=["http://a"]), FOUND, "m")
    assert json.dumps(plain.to_json()) == json.dumps(
        {
            "stage": "generate",
            "prompts": {"sha256": "ab" * 32, "lines": 7, "bytes": 123},
            "model": "m",
            "max_tokens": "auto",
            "sampling": NULL_SAMPLING,
            "reasoning": "server",
            "chat_template_kwargs": {},
            "keep_reasoning_history": False,
            "n": 1,
            "overrides": [],
            "extra_body": {},
        }
    )  # key order too: manifest.json is written in this order
    assert settings_hash(plain.to_json()) == (
        "sha256:329d59523f94513cbd1112fbce9c1d8e4d524db7e403173cb74419ba84753fda"
    )
    config = GenerateConfig(
        prompts="p",
        out="o",
        endpoints=["http://a"],
        max_tokens=64,
        strict_limit=True,
        reasoning="on",
        keep_reasoning_history=True,
        n=2,
        sampling=Sampling(temperature=0.6, stop=["x"]),
        overrides=[Override(domain="math", max_tokens=5)],
        extra_body={"chat_template_kwargs": {"x": 1}, "top_a": 0.5},
    )
    full = run_settings(config, FOUND, "Qwen/Qwen3-8B")
    full = RunSettings(**{**_fields(full), "server_chat_template_kwargs": {"enable_thinking": 0}})
    out = full.to_json()
    assert list(out) == [
        "stage",
        "prompts",
        "model",
        "max_tokens",
        "strict_limit",
        "sampling",
        "reasoning",
        "chat_template_kwargs",
        "keep_reasoning_history",
        "n",
        "overrides",
        "extra_body",
        "server_chat_template_kwargs",
    ]
    assert out["chat_template_kwargs"] == {"x": 1, "enable_thinking": True}
    assert out["overrides"] == [
        {"source": None, "domain": "math", "sampling": None, "max_tokens": 5, "reasoning": None}
    ]
    out["server_chat_template_kwargs"] = {"enable_thinking": False}
    assert settings_hash(out) == (
        "sha256:1fe4b1820556e92faa5b49a863c3e8746822d1014a1af6b82d71d2dd01e28dc7"
    )


def _fields(s: RunSettings) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__struct_fields__}


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_obj = st.dictionaries(st.text(max_size=6), _json, max_size=4)
_records = st.builds(
    RunSettings,
    stage=st.just("generate"),
    prompts=st.builds(
        PromptsIdentity,
        sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
        lines=st.integers(0, 10**9),
        bytes=st.integers(0, 10**12),
    ),
    model=st.text(min_size=1, max_size=20),
    max_tokens=st.integers(1, 10**6) | st.just("auto"),
    strict_limit=st.booleans(),
    sampling=_obj,
    reasoning=st.sampled_from(["on", "off", "server"]),
    chat_template_kwargs=_obj,
    keep_reasoning_history=st.booleans(),
    n=st.integers(1, 64),
    overrides=st.lists(_obj, max_size=3),
    extra_body=_obj,
    server_chat_template_kwargs=st.none() | _obj,
)


@settings(max_examples=60, deadline=None)
@given(_records)
def test_what_is_written_reads_back_the_same(s: RunSettings) -> None:
    out = s.to_json()
    assert ("strict_limit" in out) == s.strict_limit
    assert ("server_chat_template_kwargs" in out) == (s.server_chat_template_kwargs is not None)
    back = json.loads(json.dumps(out))  # as manifest.json holds it
    assert settings_of({"effective_settings": back}, "m.json") == s
    assert settings_of({"settings": back}, "m.json") == s
    assert RunSettings(**_fields(settings_of({"settings": back}, "m"))).to_json() == out


def _run(tmp_path: Path, settings: dict[str, Any]) -> str:
    out = str(tmp_path / "run")
    with Run.open(out, settings=settings):
        pass
    return out


@pytest.mark.parametrize(("recorded_value", "keep"), [(True, True), (False, False), (None, False)])
def test_readers_take_the_recorded_settings(
    tmp_path: Path, recorded_value: bool | None, keep: bool
) -> None:
    settings: dict[str, Any] = {"model": "m", "copy": 1}  # unknown keys are ignored
    if recorded_value is not None:
        settings["keep_reasoning_history"] = recorded_value
        settings["server_chat_template_kwargs"] = {"enable_thinking": recorded_value}
    out = _run(tmp_path, settings)
    store = open_store(out)
    got = recorded_settings(store)
    assert got is not None and got.model == "m" and got.keep_reasoning_history is keep
    config = TokenizeConfig(run=out, out=str(tmp_path / "tok"), tokenizer="t")
    assert history_policy(config, store) is keep
    # an older run's one mode: read (a resume keeps it, so its hash holds), never rendered with
    assert got.server_chat_template_kwargs == (
        None if recorded_value is None else {"enable_thinking": recorded_value}
    )
    assert recorded(out) == ({} if recorded_value is None else {"enable_thinking": keep})
    assert recorded_settings(open_store(str(tmp_path / "none"))) is None
    assert recorded(str(tmp_path / "none")) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("keep_reasoning_history", "false"),  # a string: bool("false") would keep it
        ("keep_reasoning_history", 1),
        ("server_chat_template_kwargs", ["enable_thinking"]),
        ("model", 5),
        ("n", "2"),
    ],
)
def test_a_setting_of_the_wrong_type_is_a_damaged_manifest(
    tmp_path: Path, key: str, value: object
) -> None:
    out = _run(tmp_path, {key: value})
    config = TokenizeConfig(run=out, out=str(tmp_path / "tok"), tokenizer="t")
    with pytest.raises(StoreError, match=rf"manifest.json: the run's settings do not read .*{key}"):
        history_policy(config, open_store(out))
    with pytest.raises(StoreError) as err:
        recorded_settings(open_store(out))
    assert "\n" not in str(err.value)
