"""Derived ids cannot collide with real ones (issue 24): a prompt ``abc`` with two user turns and
another whose id is ``abc#1`` made tokenize write ``abc#0, abc#1, abc#1`` (and export two rows
``abc#1``), so merge dropped a different sample as a duplicate. generate refuses an id that ends
like a derived one (``#<digits>``, ``#s<digits>``) as a rejected line with its reason; the ids
of the run's per-turn samples and rows are then unique."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from draftdata.demo.tokenizer import ensure_demo_tokenizer
from draftdata.export.stage import export_run
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet
from draftdata.store.read import iter_completions
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize

pytestmark = pytest.mark.integration


def _prompts(path: Path) -> list[str]:
    rows = [
        {
            "id": "abc",
            "messages": [
                {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "(replaced)"},
                {"role": "user", "content": "And times three?"},
            ],
        },
        {"id": "abc#1", "messages": [{"role": "user", "content": "Name a prime."}]},
        {"id": "abc#s1", "messages": [{"role": "user", "content": "Name a colour."}]},
        {"id": "tag#blue", "messages": [{"role": "user", "content": "Name a fruit."}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return [str(r["id"]) for r in rows]


def test_an_id_shaped_like_a_derived_one_is_rejected_and_derived_ids_stay_unique(
    tmp_path: Path,
) -> None:
    tok = ensure_demo_tokenizer(tmp_path / "tok")
    prompts = tmp_path / "p.jsonl"
    _prompts(prompts)
    run = tmp_path / "run"
    sim = SimConfig(time_scale=0, mean_output_tokens=30, tool_call_rate=0, tokenizer=str(tok))
    lines: list[str] = []
    with SimFleet(1, sim) as fleet:
        summary = generate(
            GenerateConfig(
                prompts=str(prompts),
                endpoints=fleet.urls,
                out=str(run),
                progress="off",
                max_tokens=64,
                n=2,
            ),
            handle_signals=False,
            log=lines.append,
        )
    assert summary.completed == 4  # abc and tag#blue, two samples each
    assert {c.id for c in iter_completions(str(run))} == {"abc", "tag#blue"}
    (rejects,) = (run / "rejects").glob("*.jsonl")
    rows = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert sorted(r["reason"].split(":")[0] for r in rows) == ["derived_id", "derived_id"]
    assert all("'abc#1'" in r["reason"] or "'abc#s1'" in r["reason"] for r in rows)
    shown = [x for x in lines if x.startswith("generate: invalid prompt line ")]
    assert sum("derived_id" in x for x in shown) == 2  # each shown (the first few are)
    (total,) = [x for x in lines if "invalid prompt lines skipped" in x]
    assert "derived_id" in total and " 2" in total  # and counted by reason

    out = tmp_path / "tokenized"
    tokenize(TokenizeConfig(run=str(run), tokenizer=str(tok), out=str(out)))
    ids = [
        str(r["id"]) for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()
    ]
    assert len(ids) == len(set(ids)) and {"abc#0", "abc#1", "abc#s1#0", "abc#s1#1"} <= set(ids)

    rows_file = tmp_path / "specforge.jsonl"
    export_run(str(run), "specforge", rows_file)
    ids = [json.loads(x)["id"] for x in rows_file.read_text().splitlines()]
    assert len(ids) == len(set(ids)) and "abc#1" in ids
