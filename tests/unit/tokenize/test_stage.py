"""The stage on a local run: shards, summary.json, datasets loading, reruns, refusals, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.unit.tokenize.helpers import completion

from draftdata.errors import ConfigError, InputError
from draftdata.store.run import Run
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import read_summary, tokenize


def _convo(i: int) -> list[dict[str, object]]:
    return [
        {"role": "user", "content": f"Question {i}: what is {i} + {i}? 🙂"},
        {"role": "assistant", "content": f"It is {2 * i}.", "reasoning_content": f"{i} twice."},
    ]


def make_run(path: Path, n: int = 6, flush: int = 4) -> str:
    url = str(path)
    settings = {"keep_reasoning_history": False}
    with Run.open(url, settings=settings, flush_records=flush, flush_seconds=3600) as run:
        for i in range(n):
            run.add_completion(completion(f"p{i}", _convo(i), domain=("math", "code")[i % 2]))
            if run.flush_due():
                run.flush()
    return url


def test_stage_writes_shards_and_summary(tmp_path: Path, demo_tokenizer: Path) -> None:
    run = make_run(tmp_path / "run")
    summary = tokenize(TokenizeConfig(run=run, tokenizer=str(demo_tokenizer), batch_rows=3))
    out = tmp_path / "run" / "tokenized"
    assert summary.out == str(out)
    shards = sorted(p.name for p in out.glob("*.parquet"))
    assert len(shards) == summary.shards == 3  # shards of 4 + 2 rows, batches of 3 rows
    rows = [r for s in shards for r in pq.read_table(out / s).to_pylist()]
    assert sorted(r["id"] for r in rows) == [f"p{i}" for i in range(6)]
    doc = read_summary(str(out))
    assert doc["counts"]["samples"] == 6 == summary.count("samples")
    assert doc["domains"]["math"]["samples"] == 3
    assert doc["domains"]["math"]["tokens"] == sum(
        r["num_tokens"] for r in rows if r["domain"] == "math"
    )
    assert doc["shards"] == shards and "wall_s" not in doc


def test_output_loads_with_hf_datasets(
    tmp_path: Path, demo_tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    import datasets

    run = make_run(tmp_path / "run")
    tokenize(TokenizeConfig(run=run, tokenizer=str(demo_tokenizer)))
    files = sorted(str(p) for p in (tmp_path / "run" / "tokenized").glob("*.parquet"))
    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "c")
    )
    assert ds.num_rows == 6
    assert str(ds.features["input_ids"].feature.dtype) == "int32"
    assert str(ds.features["loss_mask"].feature.dtype) == "int8"
    row = ds[0]
    assert (
        len(row["input_ids"]) == row["num_tokens"]
        and sum(row["loss_mask"]) == row["num_loss_tokens"]
    )


def test_rerun_is_a_no_op_and_other_settings_are_refused(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    run = make_run(tmp_path / "run")
    config = TokenizeConfig(run=run, tokenizer=str(demo_tokenizer))
    first = tokenize(config)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run" / "tokenized").iterdir()}
    again = tokenize(config)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run" / "tokenized").iterdir()}
    assert before == after and again.counts == first.counts
    with pytest.raises(ConfigError, match="other settings"):
        tokenize(TokenizeConfig(run=run, tokenizer=str(demo_tokenizer), max_length=16))
    other = tokenize(
        TokenizeConfig(
            run=run, tokenizer=str(demo_tokenizer), max_length=16, out=str(tmp_path / "o")
        )
    )
    assert other.count("truncated") + other.count("dropped.too_few_loss_tokens") == 6
    with Run.open(run, settings={"keep_reasoning_history": False}) as more:
        more.add_completion(completion("p9", _convo(9)))
    with pytest.raises(ConfigError, match="earlier state of the run"):
        tokenize(config)


def test_refusals(tmp_path: Path, demo_tokenizer: Path) -> None:
    run = make_run(tmp_path / "run")
    tok = str(demo_tokenizer)
    for out in (run, f"{run}/completions", f"{run}/completions/x", str(tmp_path)):
        with pytest.raises(ConfigError, match="--out"):
            tokenize(TokenizeConfig(run=run, tokenizer=tok, out=out))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no completion shards"):
        tokenize(TokenizeConfig(run=str(tmp_path / "empty"), tokenizer=tok))
    with pytest.raises(ConfigError, match="--tokenizer"):
        tokenize(TokenizeConfig(run=run, tokenizer=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="--max-length"):
        TokenizeConfig(run=run, tokenizer=tok, max_length=1).validate()


def test_cli(tmp_path: Path, demo_tokenizer: Path) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    run = make_run(tmp_path / "run", n=3)
    base = ["tokenize", run, "--tokenizer", str(demo_tokenizer)]
    runner = CliRunner()
    done = runner.invoke(app, [*base, "--max-length", "4096", "--out", str(tmp_path / "t")])
    assert done.exit_code == 0, done.output
    assert "tokenize: 3 samples from 3 completions" in done.output and "math" in done.output
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["counts"]["samples"] == 3
    bad = runner.invoke(app, [*base, "--long", "shorten"])
    assert bad.exit_code == 1 and "--long: 'shorten'" in str(bad.exception)
    unsure = runner.invoke(app, [*base, "--server-thinking", "maybe"])
    assert unsure.exit_code == 1 and "--server-thinking 'maybe'" in str(unsure.exception)
    stated = runner.invoke(app, [*base, "--server-thinking", "on", "--out", str(tmp_path / "s")])
    assert stated.exit_code == 0, stated.output
    said = json.loads((tmp_path / "s" / "summary.json").read_text())["settings"]
    assert said["server_thinking"] is True


def test_killed_run_finishes_on_rerun(tmp_path: Path, demo_tokenizer: Path) -> None:
    run = make_run(tmp_path / "run")
    config = TokenizeConfig(run=run, tokenizer=str(demo_tokenizer), batch_rows=2)
    tokenize(config)
    out = tmp_path / "run" / "tokenized"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # As if killed after the first shards: the summary and the last shard never landed.
    (out / "summary.json").unlink()
    (out / sorted(n for n in before if n.endswith(".parquet"))[-1]).unlink()
    tokenize(config)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_protect_refuses_an_overlapping_output_and_allows_a_sibling(
    tmp_path: Path, demo_tokenizer: Path
) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app
    from draftdata.errors import ProtectedPrefixError

    run = make_run(tmp_path / "run", n=3)
    live = tmp_path / "live"
    (live / "sub").mkdir(parents=True)
    (live / "sub" / "keep.parquet").write_bytes(b"x")
    tok = str(demo_tokenizer)
    for out, how in ((live, "equals"), (live / "sub", "lies inside"), (tmp_path, "contains")):
        with pytest.raises(ProtectedPrefixError, match=how):
            tokenize(TokenizeConfig(run=run, tokenizer=tok, out=str(out), protect=[str(live)]))
    assert sorted(p.name for p in live.rglob("*")) == ["keep.parquet", "sub"]  # nothing written
    runner = CliRunner()
    base = ["tokenize", run, "--tokenizer", tok, "--protect", str(live)]
    bad = runner.invoke(app, [*base, "--out", str(live / "tok")])
    assert bad.exit_code == 1 and "protected prefix" in str(bad.exception)
    ok = runner.invoke(app, [*base, "--out", str(tmp_path / "live_v2")])  # a sibling, not inside
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "live_v2" / "summary.json").exists()
