"""No prompt line can end a read: fuzzed lines through PromptReader, scan and the validators.

Every line is either a valid prompt (yielded, in order) or a reject located ``file:line`` with
a reason; nothing raises. Deep nesting, arbitrary bytes, big lines and a byte-order mark are
drawn on purpose, since each once ended a whole generate run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.generate.prompts.source import PromptReader, scan
from draftdata.records import (
    BOM,
    MAX_JSON_DEPTH,
    InputError,
    Message,
    parse_prompt,
    prompt_id,
    tool_order_fault,
)


def _valid(i: int, text: str) -> bytes:
    return json.dumps(
        {"id": f"ok-{i}", "messages": [{"role": "user", "content": text or "hi"}]}
    ).encode()


def _nested(depth: int, opener: str) -> bytes:
    closer = "]" if opener == "[" else "}"
    inner = "".join(opener if opener == "[" else '{"a":' for _ in range(depth))
    body = inner + ("1" if opener == "{" else "") + closer * depth
    return b'{"id":"deep","messages":[{"role":"user","content":"x"}],"meta":{"x":' + (
        body.encode() + b"}}"
    )


# one bad line of each kind that once broke a reader, plus arbitrary bytes
_bad = st.one_of(
    st.binary(max_size=200).filter(lambda b: b.strip() and b"\n" not in b and b"\r" not in b),
    st.sampled_from(["[", "{"]).flatmap(
        lambda o: st.integers(MAX_JSON_DEPTH + 5, 20_000).map(lambda d: _nested(d, o))
    ),
    st.integers(1, 5000).map(lambda d: b"[" * d),
    st.just(
        b'{"id": "t", "messages": [{"role": "user", "content": "q"}, '
        b'{"role": "tool", "content": "r"}]}'
    ),
    st.just(b'{"id": "", "messages": [{"role": "user", "content": "q"}]}'),
    st.just(b'{"id": "a", "messages": []}'),
    st.just(b'"\\ud800"'),
    st.integers(100_000, 2_000_000).map(lambda n: b'{"id": "big", "messages": "' + b"x" * n),
)


@st.composite
def _lines(draw: st.DrawFn) -> tuple[list[bytes], list[bool]]:
    n = draw(st.integers(1, 12))
    lines: list[bytes] = []
    good: list[bool] = []
    for i in range(n):
        if draw(st.booleans()):
            lines.append(_valid(i, draw(st.text(max_size=30).filter(lambda t: t.strip()))))
            good.append(True)
        else:
            lines.append(draw(_bad))
            good.append(False)
    return lines, good


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=_lines(), bom=st.booleans(), partition=st.sampled_from([None, "0/2", "1/2"]))
def test_no_line_ends_the_reader(
    tmp_path: Path, data: tuple[list[bytes], list[bool]], bom: bool, partition: str | None
) -> None:
    lines, good = data
    f = tmp_path / "p.jsonl"
    f.write_bytes((BOM if bom else b"") + b"\n".join(lines) + b"\n")
    rejects: list[tuple[str, bytes]] = []
    reader = PromptReader(
        [f], partition=partition, on_reject=lambda m, raw: rejects.append((m, raw))
    )
    got = reader.take(10_000)
    assert reader.exhausted
    from draftdata.generate.prompts.partition import parse_partition

    part = parse_partition(partition) if partition else None
    want = [
        json.loads(line)["id"]
        for line, ok in zip(lines, good, strict=True)
        if ok and (part is None or part.contains(json.loads(line)["id"]))
    ]
    assert [p.id for p in got] == want
    bad_linenos = [i + 1 for i, ok in enumerate(good) if not ok]
    # every bad line is a reject located file:line with a reason (unless its id puts it in
    # another partition, which the id-only decoder may read from an invalid prompt)
    located = [m.split(": ", 1)[0] for m, _ in rejects]
    assert set(located) <= {f"{f}:{n}" for n in bad_linenos}
    if part is None:
        assert located == [f"{f}:{n}" for n in bad_linenos]
        assert reader.invalid == len(bad_linenos)
    assert all(m.split(": ", 1)[1] for m, _ in rejects)
    found = scan([f], limit=None, partition=None)
    assert found.prompts == len(lines)


def test_bom_first_line_is_generated(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_bytes(BOM + _valid(0, "first") + b"\n" + _valid(1, "second") + b"\n")
    rejects: list[str] = []
    got = PromptReader([f], on_invalid=rejects.append).take(10)
    assert [p.id for p in got] == ["ok-0", "ok-1"] and not rejects
    assert prompt_id(BOM + _valid(0, "x")) == "ok-0"
    assert scan([f], limit=None, partition=None).prompts == 2


def test_5000_nested_brackets_are_a_reject_not_a_recursion_error() -> None:
    line = b'{"id": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert prompt_id(line) == ""
    with pytest.raises(InputError, match=r"f:3: nesting deeper than"):
        parse_prompt(line, "f:3")
    # a depth msgspec decodes fine is still refused past MAX_JSON_DEPTH (later encoders recurse)
    with pytest.raises(InputError, match="nesting deeper than"):
        parse_prompt(_nested(MAX_JSON_DEPTH + 1, "["), "f:1")
    parse_prompt(_nested(MAX_JSON_DEPTH - 10, "{"), "f:1")


def _conv(*roles: str, **kw: Any) -> list[Message]:
    out = []
    for r in roles:
        if r == "call":
            calls = [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in kw.get("ids", ["c1"])
            ]
            out.append(Message(role="assistant", tool_calls=calls))
        elif r == "tool":
            out.append(Message(role="tool", content="r", tool_call_id=kw.get("answer")))
        else:
            out.append(Message(role=r, content="x"))
    return out


@pytest.mark.parametrize(
    ("roles", "kw", "fault"),
    [
        (("user", "tool"), {}, "messages[1]: tool message without a preceding assistant tool call"),
        (("system", "tool", "user"), {}, "messages[1]: tool message without"),
        (("user", "assistant", "tool"), {}, "messages[2]: tool message without"),
        (("user", "call", "tool", "user", "tool"), {}, "messages[4]: tool message without"),
        (("user", "call", "tool"), {"answer": "zz"}, "messages[2].tool_call_id: 'zz' answers no"),
        (("user", "call", "tool"), {}, None),
        (("user", "call", "tool"), {"answer": "c1"}, None),
        (("user", "call", "tool", "tool"), {"ids": ["a", "b"], "answer": "b"}, None),
        (("user", "call", "tool", "assistant", "user"), {}, None),
    ],
)
def test_tool_message_must_answer_a_preceding_call(
    roles: tuple[str, ...], kw: dict[str, Any], fault: str | None
) -> None:
    got = tool_order_fault(_conv(*roles, **kw))
    assert (got is None) if fault is None else (got is not None and got.startswith(fault))


def test_orphan_tool_is_rejected_by_generate_and_prepare() -> None:
    from draftdata.errors import RowError
    from draftdata.prepare.validate import ORPHAN_TOOL, check_prompt

    line = b'{"id": "t", "messages": [{"role": "user", "content": "q"}, ' + (
        b'{"role": "tool", "content": "r"}]}'
    )
    with pytest.raises(InputError, match=r"p.jsonl:7: messages\[1\]: tool message without"):
        parse_prompt(line, "p.jsonl:7")
    with pytest.raises(RowError) as info:
        check_prompt(_conv("user", "tool"), 10_000)
    assert info.value.reason == ORPHAN_TOOL


def test_a_huge_line_is_a_reject_read_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from draftdata import records

    monkeypatch.setattr(records, "MAX_LINE_BYTES", 1000)
    f = tmp_path / "p.jsonl"
    huge = _valid(1, "x" * 5000)  # valid JSON, but over the (lowered) limit
    body = _valid(0, "a") + b"\n" + huge + b"\n" + _valid(2, "b") + b"\n"
    f.write_bytes(body)
    rejects: list[str] = []
    got = PromptReader([f], on_invalid=rejects.append).take(10)
    assert [p.id for p in got] == ["ok-0", "ok-2"]
    assert rejects == [f"{f}:2: line longer than 0 MiB"]
    found = scan([f], limit=None, partition=None)
    # the identity still covers every byte, the skipped rest of the long line included
    assert found.sha256 == hashlib.sha256(b"p.jsonl\x00" + body).hexdigest()
    assert (found.bytes, found.prompts) == (len(body), 3)
