"""Token-id path against rendered path on completions the generate engine got from the simulator.

The simulator (with the demo tokenizer) returns prompt and output token ids the way SGLang does;
the run's completions therefore take the token-id path. Stripping the ids gives the same
completions on the rendered path: both must produce the same samples, and verification must
pass on every one. Also: several worker processes give the same bytes, and S3 works both ways.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest
from tests.conftest import MotoS3
from tests.unit.tokenize.helpers import WEATHER_TOOL

from draftdata.fleet.sim import SimFleet
from draftdata.fleet.sim_config import SimConfig
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.store.read import iter_completions
from draftdata.store.run import Run
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import read_summary, tokenize

pytestmark = pytest.mark.integration


def _prompts(path: Path, n: int = 24) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            p: dict[str, object] = {
                "id": f"p{i}",
                "domain": ("math", "code", "tool")[i % 3],
                "messages": [{"role": "user", "content": f"Question {i}: {i} + {i}? café 🙂"}],
            }
            if i % 3 == 2:
                p["tools"] = [WEATHER_TOOL]
            if i % 4 == 0:  # multi-turn: the target answers both user turns
                p["messages"] += [  # type: ignore[operator]
                    {"role": "assistant", "content": "(original)"},
                    {"role": "user", "content": "And twice that?"},
                ]
            fh.write(json.dumps(p, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, demo_tokenizer: Path) -> tuple[str, str]:
    """(run with server token ids, the same completions without them)."""
    root = tmp_path_factory.mktemp("sim")
    sim = SimConfig(
        tokenizer=str(demo_tokenizer), time_scale=0, mean_output_tokens=60, tool_call_rate=0.3
    )
    served = str(root / "served")
    with SimFleet(1, sim) as fleet:
        summary = generate(
            GenerateConfig(
                prompts=str(_prompts(root / "prompts.jsonl")),
                endpoints=fleet.urls,
                out=served,
                progress="plain",
                max_tokens=300,
            ),
            handle_signals=False,
            log=lambda _line: None,
        )
    assert summary.completed == 24
    plain = str(root / "plain")
    with Run.open(plain, settings={"copy": True}) as run:
        for c in iter_completions(served):
            turns = [
                msgspec.structs.replace(t, prompt_token_ids=None, output_token_ids=None)
                for t in c.turns
            ]
            run.add_completion(msgspec.structs.replace(c, turns=turns))
    return served, plain


def _samples(out: str) -> list[dict[str, object]]:
    rows = [r for p in sorted(Path(out).glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return sorted(rows, key=lambda r: str(r["id"]))


def test_token_ids_verified_and_equal_to_rendered(
    runs: tuple[str, str], demo_tokenizer: Path, tmp_path: Path
) -> None:
    served, plain = runs
    tok = str(demo_tokenizer)
    a = tokenize(TokenizeConfig(run=served, tokenizer=tok, out=str(tmp_path / "a")))
    b = tokenize(TokenizeConfig(run=plain, tokenizer=tok, out=str(tmp_path / "b")))
    assert a.count("path.token_ids") == 24 and b.count("path.rendered") == 24
    assert a.count("mismatched") == 0 and a.count("unverifiable") == 0
    assert a.count("verified") == a.count("samples") > 24  # multi-turn prompts split per turn
    assert a.count("split_turns") == 6
    assert _samples(str(tmp_path / "a")) == _samples(str(tmp_path / "b"))
    ids = {str(r["id"]) for r in _samples(str(tmp_path / "a"))}
    assert {"p0#0", "p0#1", "p1"} <= ids


def test_tampered_ids_are_reported(
    runs: tuple[str, str], demo_tokenizer: Path, tmp_path: Path
) -> None:
    served, _ = runs
    tampered = str(tmp_path / "tampered")
    with Run.open(tampered, settings={"copy": True}) as run:
        for c in iter_completions(served):
            if c.id == "p1":
                t = c.turns[0]
                assert t.output_token_ids
                ids = list(t.output_token_ids)
                ids[1] = ids[0]  # one token the renderer would not produce
                c = msgspec.structs.replace(
                    c, turns=[msgspec.structs.replace(t, output_token_ids=ids)]
                )
            run.add_completion(c)
    s = tokenize(
        TokenizeConfig(run=tampered, tokenizer=str(demo_tokenizer), out=str(tmp_path / "o"))
    )
    assert s.count("mismatched") == 1
    assert s.mismatches[0].startswith("p1: token ")
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["counts"]["mismatched"] == 1


def test_workers_give_identical_output(
    runs: tuple[str, str], demo_tokenizer: Path, tmp_path: Path
) -> None:
    served, _ = runs
    tok = str(demo_tokenizer)
    one = tokenize(
        TokenizeConfig(run=served, tokenizer=tok, out=str(tmp_path / "w1"), batch_rows=5)
    )
    two = tokenize(
        TokenizeConfig(run=served, tokenizer=tok, out=str(tmp_path / "w2"), batch_rows=5, workers=2)
    )
    assert one.counts == two.counts
    names = sorted(p.name for p in (tmp_path / "w1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w2").iterdir())
    for name in names:
        if name != "summary.json":
            assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()


def test_s3_in_and_out(
    runs: tuple[str, str], demo_tokenizer: Path, moto_s3: MotoS3, tmp_path: Path
) -> None:
    served, _ = runs
    remote_run = moto_s3.url("run")
    with Run.open(remote_run, settings={"copy": True}) as run:
        for c in iter_completions(served):
            run.add_completion(c)
    s = tokenize(TokenizeConfig(run=remote_run, tokenizer=str(demo_tokenizer)))
    assert s.out == f"{remote_run}/tokenized" and s.count("verified") == s.count("samples")
    doc = read_summary(s.out)
    assert doc["counts"]["samples"] == s.count("samples")
    local = tokenize(
        TokenizeConfig(run=served, tokenizer=str(demo_tokenizer), out=str(tmp_path / "l"))
    )
    assert local.counts == s.counts
