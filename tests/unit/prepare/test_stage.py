"""The prepare stage end to end on the bundled samples: outputs, rejects, determinism, errors."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from draftdata.cli import app
from draftdata.errors import ConfigError, InputError
from draftdata.prepare import stage
from draftdata.prepare.config import ExistingConfig, PrepareConfig, SourceConfig, resolve_paths
from draftdata.prepare.dedup import DedupConfig
from draftdata.prepare.samples import sample_config, write_sample_sources
from draftdata.prepare.stage import prepare
from draftdata.records import parse_prompt
from draftdata.shared.formats import PREPARE_REPORT
from draftdata.store.prompts import iter_prompt_lines
from draftdata.support.config import load_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("samples")
    write_sample_sources(d)
    return d


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_quickstart_outputs(samples: Path, tmp_path: Path) -> None:
    result = prepare(sample_config(samples, tmp_path / "out"))
    out = tmp_path / "out"
    assert sorted(_files(out)) == [
        "prepare_report.json", "prepare_report.md", "prompts-00000.jsonl", "rejects.jsonl"
    ]  # fmt: skip
    prompts = [parse_prompt(raw, f"line {n}") for n, raw in iter_prompt_lines(result.shards[0])]
    assert len(prompts) == 100 == result.report["totals"]["taken"]
    assert len({p.id for p in prompts}) == 100
    assert {p.domain for p in prompts} == {"code", "math", "general", "tool", "agent"}
    assert all(p.id.startswith(p.source + "/") for p in prompts)
    tool = next(p for p in prompts if p.domain == "tool" and p.source == "hermes_fc" and p.tools)
    assert tool.tools is not None and tool.tools[0]["type"] == "function"
    report = PREPARE_REPORT.load((out / "prepare_report.json").read_bytes(), "report")
    assert report["format"] == PREPARE_REPORT.format
    by_name = {s["name"]: s for s in report["sources"]}
    assert by_name["infinity_instruct"]["rejected"] == {
        "bad_json": 1, "empty_content": 1, "no_user_turn": 1, "non_string_content": 1,
        "unknown_role": 1, "wrong_type": 1,
    }  # fmt: skip
    assert by_name["infinity_instruct"]["duplicates"] == {"exact": 1, "near": 1}
    assert by_name["hermes_fc"]["rejected"] == {"bad_tool_spec": 1, "non_string_content": 1}
    assert by_name["metamath"]["duplicates"] == {"exact": 1}
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == report["totals"]["rejected"]
    assert {"source", "row", "reason", "detail"} == set(rejects[0])
    assert {r["reason"] for r in rejects} >= {
        "bad_json",
        "unknown_role",
        "bad_tool_spec",
        "wrong_type",
    }
    md = (out / "prepare_report.md").read_text()
    assert "| infinity_instruct | rejected | unknown_role | 1 |" in md
    code = next(d for d in report["domains"] if d["domain"] == "code")
    assert code["before"] == pytest.approx(0.77) and code["after"] < 0.55


def test_same_inputs_and_seed_give_identical_bytes(samples: Path, tmp_path: Path) -> None:
    prepare(sample_config(samples, tmp_path / "a", seed=5))
    prepare(sample_config(samples, tmp_path / "b", seed=5))
    prepare(sample_config(samples, tmp_path / "c", seed=6))
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert a == b
    assert a["prompts-00000.jsonl"] != c["prompts-00000.jsonl"]


def test_dedup_batches_do_not_show_in_the_outputs(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows wait for the deduper in batches; whatever the batch size, the same files, byte for
    byte (rejects still in row order), and no signature file left behind."""
    cfg = sample_config(samples, tmp_path / "a", seed=5)
    cfg = msgspec.structs.replace(cfg, dedup=DedupConfig(threshold=0.7))
    prepare(cfg)
    for n, name in ((1, "b"), (7, "c")):
        monkeypatch.setattr(stage, "DEDUP_BATCH", n)
        prepare(msgspec.structs.replace(cfg, out=str(tmp_path / name)))
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert a == b == c
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(a)  # no spool, no .dedup-
    by_source: dict[str, list[int]] = {}
    for line in (tmp_path / "a" / "rejects.jsonl").open():
        reject = json.loads(line)
        by_source.setdefault(reject["source"], []).append(reject["row"])
    assert by_source and all(rows == sorted(rows) for rows in by_source.values())


def test_plan_only_writes_nothing(samples: Path, tmp_path: Path) -> None:
    result = prepare(sample_config(samples, tmp_path / "out"), plan_only=True)
    assert not (tmp_path / "out").exists()
    assert result.plan.total_new == 100 and result.shards == []


def test_existing_outputs_need_force(samples: Path, tmp_path: Path) -> None:
    cfg = sample_config(samples, tmp_path / "out")
    prepare(cfg)
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--force"):
        prepare(cfg)
    prepare(cfg, force=True)
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_unreadable_source_is_one_error(samples: Path, tmp_path: Path) -> None:
    cfg = sample_config(samples, tmp_path / "out")
    bad = SourceConfig(name="ghost", schema="sharegpt", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="source ghost"):
        prepare(msgspec.structs.replace(cfg, sources=[*cfg.sources, bad]))


def test_existing_dataset_and_exclusions(samples: Path, tmp_path: Path) -> None:
    existing = tmp_path / "existing.jsonl"
    texts = [
        "Write a short poem about an old lighthouse.",
        "Write a python function that reverses a linked list.",
    ]
    rows = [
        {
            "id": f"e{i}",
            "messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "..."}],
        }
        for i, t in enumerate(texts)
    ]
    existing.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    bench = tmp_path / "gsm8k_test.jsonl"
    bench.write_text(
        json.dumps(
            {
                "question": "Ava buys 3 boxes of apples. Each box costs $2. "
                "How much does Ava spend in total?"
            }
        )
        + "\n"
    )
    mtbench = tmp_path / "mt_bench.txt"
    mtbench.write_text("Describe the first snow of winter in three vivid sentences.\n")
    cfg = PrepareConfig(
        sources=sample_config(samples, tmp_path).sources,
        out=str(tmp_path / "out"),
        existing=ExistingConfig(path=str(existing)),
        dedup=DedupConfig(exclude=[str(bench), str(mtbench)], ngram=3, threshold=0.7),
    )
    result = prepare(cfg)
    dups = {s["name"]: s["duplicates"] for s in result.report["sources"]}
    assert dups["infinity_instruct"].get("existing_exact") == 1
    assert dups["infinity_instruct"].get("excluded_exact") == 1
    assert dups["codefeedback"] == {"existing_exact": 2}  # the row and its planted copy
    assert dups["metamath"] == {"excluded_exact": 2}  # the row and its upper-cased copy
    assert result.report["excluded_prompts"] == 2
    existing_counts = {
        d["domain"]: d["existing"] for d in result.report["domains"] if d["existing"]
    }
    assert existing_counts == {"general": 1, "code": 1}
    assert result.report["totals"]["taken"] == result.report["totals"]["usable"]  # no budget: all


def test_regenerate_mode_drops_answers(samples: Path, tmp_path: Path) -> None:
    cfg = msgspec.structs.replace(
        sample_config(samples, tmp_path / "out"), prompt_mode="regenerate", budget=None, mix={}
    )
    result = prepare(cfg)
    prompts = [parse_prompt(raw) for _, raw in iter_prompt_lines(result.shards[0])]
    agent = [p for p in prompts if p.source == "agentinstruct"]
    # no original answer text is left (a tool-calling turn would stay as its calls alone)
    assert agent and all(
        m.role != "assistant" or (m.tool_calls and not m.content) for p in agent for m in p.messages
    )
    assert agent[0].meta["prompt_mode"] == "regenerate"


def test_quickstart_yaml_matches_sample_config(samples: Path, tmp_path: Path) -> None:
    path = ROOT / "examples" / "quickstart.yaml"
    cfg = resolve_paths(load_config(path, PrepareConfig, out=str(tmp_path / "o")), path.parent)
    expected = sample_config(path.parent / "samples", tmp_path / "o")
    assert cfg == expected


def test_cli_plan_only_and_run(samples: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "sources:\n"
        f"  - {{name: cf, schema: codefeedback, path: {samples}/codefeedback.jsonl, "
        "domain: code}\n"
        f"  - {{name: mm, schema: metamath, path: {samples}/metamathqa.json, domain: math}}\n"
        "budget: 20\nmix: {code: 0.5, math: 0.5}\n"
    )
    runner = CliRunner()
    res = runner.invoke(app, ["prepare", str(cfg), "--plan-only", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "before" in res.output and "after" in res.output and "50.0%" in res.output
    assert not (tmp_path / "o").exists()
    res = runner.invoke(
        app, ["prepare", str(cfg), "--out", str(tmp_path / "o"), "--seed", "3", "-q"]
    )
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "o" / "prompts-00000.jsonl").read_text().splitlines()
    assert len(lines) == 20


def test_cli_bad_config_key(tmp_path: Path) -> None:
    from draftdata.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text("sources: []\nbudjet: 3\n")
    with pytest.raises(SystemExit) as exc:
        main(["prepare", str(cfg)])
    assert exc.value.code == 1


def test_cli_write_samples(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["prepare", "--write-samples", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "s").iterdir())) == 6


def test_a_row_id_that_ends_like_a_derived_id_is_rejected_with_its_reason(tmp_path: Path) -> None:
    """Issue 24: a source row with id ``x#1`` would become prompt ``src/x#1``, which collides
    with turn 1 of prompt ``src/x`` in tokenize and export; other ``#`` are kept."""
    src = tmp_path / "src.jsonl"
    rows = [
        ("x", "What is 2 + 2?"),
        ("x#1", "Name a prime number."),
        ("x#s2", "Name a colour."),
        ("x#blue", "Name a fruit."),
    ]
    src.write_text(
        "".join(
            json.dumps({"id": rid, "conversations": [{"from": "human", "value": text}]}) + "\n"
            for rid, text in rows
        )
    )
    out = tmp_path / "out"
    cfg = PrepareConfig(
        sources=[SourceConfig(name="src", schema="sharegpt", path=str(src), domain="general")],
        out=str(out),
    )
    result = prepare(cfg)
    ids = {parse_prompt(raw).id for n, raw in iter_prompt_lines(result.shards[0])}
    assert ids == {"src/x", "src/x#blue"}
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rejects) == ["derived_id", "derived_id"]
    assert all("#<turn>" in r["detail"] for r in rejects)
