"""Records, formats and config: validation messages and round trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import ConfigError, FormatVersionError, InputError
from draftdata.records import (
    Completion,
    JsonArraySplitter,
    Message,
    Turn,
    Usage,
    content_hash,
    decode_json_line,
    parse_prompt,
)
from draftdata.shared.formats import (
    COMPLETION_FORMAT,
    SAMPLE_SCHEMA,
    check_format,
    completions_table,
    iter_completions,
)
from draftdata.support.config import load_config


def test_parse_prompt_minimal() -> None:
    p = parse_prompt(b'{"id": "a", "messages": [{"role": "user", "content": "hi"}]}')
    assert p.id == "a" and p.messages[0].content == "hi" and p.tools is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"id": "a", "messages": [{"role": "gpt2", "content": "x"}]}', "messages[0].role"),
        (b'{"id": "a", "messages": [{"role": "user", "content": 3}]}', "messages[0].content"),
        (b'{"id": "a", "messages": []}', "empty conversation"),
        (b'{"id": "a", "messages": [{"role": "system", "content": "s"}]}', "no user turn"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "id"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_parse_prompt_errors_are_located(line: bytes, expected: str) -> None:
    with pytest.raises(InputError) as err:
        parse_prompt(line, "prompts.jsonl:7")
    assert str(err.value).startswith("prompts.jsonl:7: ")
    assert expected in str(err.value)


def test_content_hash_ignores_whitespace_and_case() -> None:
    a = [Message(role="user", content="Hello   World")]
    b = [Message(role="user", content="hello world")]
    c = [Message(role="user", content="hello there")]
    assert content_hash(a) == content_hash(b) != content_hash(c)


def test_completion_parquet_round_trip() -> None:
    c = Completion(
        id="p1",
        messages=[Message(role="user", content="2+2?")],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        turns=[
            Turn(
                content="4",
                reasoning="add",
                tool_calls=[{"id": "c", "type": "function", "function": {"name": "f"}}],
                finish_reason="stop",
                prompt_token_ids=[1, 2],
                output_token_ids=[3],
                usage=Usage(prompt_tokens=2, completion_tokens=1),
            )
        ],
        sampling={"temperature": 0.6},
    )
    table = completions_table([c])
    check_format(table.schema, COMPLETION_FORMAT, "t")
    assert list(iter_completions(table)) == [c]


def test_check_format_rejects_other_versions() -> None:
    other = pa.schema(SAMPLE_SCHEMA, metadata={b"draftdata.format": b"sample/99"})
    with pytest.raises(FormatVersionError, match="sample/99"):
        check_format(other, "sample/1", "x.parquet")
    with pytest.raises(FormatVersionError, match="missing"):
        check_format(pa.schema([("id", pa.string())]), "sample/1", "x.parquet")


class _Sampling(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    temperature: float = 0.6
    top_p: float = 0.95


class _Cfg(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    model: str = "m"
    sampling: _Sampling = msgspec.field(default_factory=_Sampling)


def test_config_errors_name_key_file_and_type(tmp_path: Path) -> None:
    f = tmp_path / "gen.yaml"
    f.write_text("sampling:\n  temperatur: 0.7\n")
    with pytest.raises(ConfigError, match=r"gen.yaml: sampling.temperatur: unknown key"):
        load_config(f, _Cfg)
    f.write_text("sampling:\n  temperature: hot\n")
    with pytest.raises(ConfigError, match=r"gen.yaml: sampling.temperature: expected float"):
        load_config(f, _Cfg)
    f.write_text("model: [\n")
    with pytest.raises(ConfigError, match=r"gen.yaml:\d+: invalid YAML"):
        load_config(f, _Cfg)
    f.write_text("model: big\n")
    assert load_config(f, _Cfg, model="small").model == "small"
    assert load_config(None, _Cfg).sampling.top_p == 0.95


def test_yaml_on_off_stay_strings_true_false_are_booleans(tmp_path: Path) -> None:
    from draftdata.generate.config import GenerateConfig

    f = tmp_path / "gen.yaml"
    f.write_text("reasoning: on\nhedge: false\noverrides:\n  - {domain: math, reasoning: off}\n")
    cfg = load_config(f, GenerateConfig)
    assert cfg.reasoning == "on" and cfg.hedge is False
    assert cfg.overrides[0].reasoning == "off"


_element_ok = st.builds(
    lambda q: {"q": q, "n": [1, {"a": "]},["}]}, st.text(alphabet='ab"\\,[]{} é\n', max_size=12)
)
_element_bad = st.sampled_from(
    [
        b'{"q": "lone \\ud800"}',
        b'{"q": "bad \xff"}',
        b'{"q": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        b'{"q": NaN}',
        b'{"q": tru}',
        b"1 2",
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(_element_ok.map(lambda r: (True, r)) | _element_bad.map(lambda x: (False, x))),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=6),
    tail=st.sampled_from([b"]", b" ] \n", b"", b", "]),
)
def test_json_array_splitter_finds_every_element(
    items: list[tuple[bool, Any]], cuts: list[int], tail: bytes
) -> None:
    """Every element of an array, bad ones included, comes out once and whole, however the
    bytes are chunked; a cut array gives its cut last element."""
    raws = [json.dumps(x).encode() if ok else x for ok, x in items]
    data = b" [" + b",\n ".join(raws) + (tail if raws else b"]")
    splitter = JsonArraySplitter()
    got: list[bytes | None] = []
    last = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        got += splitter.feed(data[last:cut])
        last = cut
    got += splitter.feed(data[last:]) + splitter.close()
    assert got == raws
    for (ok, x), raw in zip(items, got, strict=True):
        if ok:
            assert json.loads(raw or b"") == x
        else:
            with pytest.raises(ValueError):
                decode_json_line(raw or b"")


def test_json_array_splitter_drops_an_oversized_element_unread() -> None:
    splitter = JsonArraySplitter(max_element=100)
    data = b'[1, "' + b"x" * 1000 + b'", [' + b"2," * 100 + b"3], 4]"
    got = [e for i in range(0, len(data), 7) for e in splitter.feed(data[i : i + 7])]
    assert got == [b"1", None, None, b"4"] and splitter.closed
    with pytest.raises(ValueError):
        JsonArraySplitter().feed(b'  {"not": "an array"}')


# -- derived ids (issue 24: a prompt "abc#1" collided with turn 1 of "abc") --------------------


def _derived(pid: str, samples: int = 3, turns: int = 3) -> set[str]:
    """Every id the pipeline derives from ``pid``: its samples (``sample_key``), and their turns
    as tokenize's per-turn samples and export's per-turn rows name them."""
    from draftdata.records import sample_key
    from draftdata.shared.trainer_rows import per_turn_id

    out = set()
    for s in range(samples):
        base = sample_key(pid, s)
        out.add(base)
        out |= {per_turn_id(base, t, turns) for t in range(turns)}
    return out


_ID_CHARS = st.text(alphabet="ab#s01", min_size=1, max_size=8)


@settings(max_examples=500, deadline=None)
@given(ids=st.lists(_ID_CHARS, min_size=2, max_size=6, unique=True))
def test_ids_that_pass_the_rule_never_share_a_derived_id(ids: list[str]) -> None:
    from draftdata.records import derived_id_fault

    allowed = [i for i in ids if derived_id_fault(i) is None]
    seen: dict[str, str] = {}
    for pid in allowed:
        for d in _derived(pid):
            assert seen.setdefault(d, pid) == pid, (d, pid, seen[d])


@pytest.mark.parametrize("pid", ["abc#1", "abc#s2", "x#0", "a#b#12", "q#s10"])
def test_an_id_that_ends_like_a_derived_id_is_refused_with_its_reason(pid: str) -> None:
    from draftdata.records import derived_id_fault

    fault = derived_id_fault(pid)
    assert fault is not None and fault.startswith("derived_id: ") and repr(pid) in fault
    assert "\n" not in fault


@pytest.mark.parametrize("pid", ["abc", "abc#", "sharegpt#row-7", "a#s", "a#1b", "a#s1x", "#a"])
def test_an_id_with_a_hash_elsewhere_is_kept(pid: str) -> None:
    from draftdata.records import derived_id_fault

    assert derived_id_fault(pid) is None
