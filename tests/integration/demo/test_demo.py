"""`draftdata demo` end to end: every stage's output exists, is consistent, and lands the mix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from draftdata.demo.pipeline import DEMO_MIX, DEMO_TOLERANCE, MARKER, run_demo
from draftdata.errors import InputError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo-tokenizer cache for the module (training it takes a few seconds)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Path:
    out = tmp_path_factory.mktemp("demo") / "out"
    lines: list[str] = []
    result = run_demo(
        out, time_scale=0.0, mean_output_tokens=120, cache_dir=cache, log=lines.append
    )
    assert result.out == out.resolve()
    assert any("7/7" in line for line in lines)
    return out


def test_every_stage_wrote_its_output(demo: Path) -> None:
    assert (demo / MARKER).is_file()
    assert sorted(p.name for p in (demo / "samples").iterdir())
    assert list((demo / "prompts").glob("*.jsonl"))
    manifest = json.loads((demo / "run" / "manifest.json").read_text())
    assert manifest["run_id"]
    completions = (
        pq.ParquetDataset(sorted((demo / "run" / "completions").glob("*.parquet")))
        .read(columns=["id"])
        .num_rows
    )
    assert completions == 120
    shards = sorted((demo / "tokenized").glob("*.parquet"))
    tokenized = pq.ParquetDataset(shards).read(columns=["id", "input_ids", "loss_mask"])
    assert tokenized.num_rows >= completions  # multi-turn prompts give one sample per turn
    html = (demo / "report.html").read_text()
    assert "<img" in html and "http://" not in html.replace("http://127.0.0.1", "")


def test_merge_lands_the_demo_mix_from_a_77_percent_code_set(demo: Path) -> None:
    report = json.loads((demo / "merged" / "merge_report.json").read_text())
    before = report["inputs"][0]["by_domain"]
    assert before["code"] / sum(before.values()) == pytest.approx(0.77, abs=0.005)
    # the mix is of loss tokens (merge's default): count them in the written rows
    from draftdata.stats.compute import compute_stats

    assert report["reachable"] and report["mix_by"] == "loss_tokens"
    written = compute_stats(str(demo / "merged")).domain_loss_token_shares()
    for domain, share in DEMO_MIX.items():
        assert abs(written[domain] - share) <= DEMO_TOLERANCE + 1e-6, (domain, written)
    assert report["plan"]["kept_share"] > 0


def test_tokenized_samples_are_token_exact_against_the_template(demo: Path) -> None:
    summary = json.loads((demo / "tokenized" / "summary.json").read_text())
    counts = summary["counts"]
    assert counts["path.token_ids"] == 120
    assert counts.get("mismatched", 0) == 0, summary["mismatches"][:3]
    assert counts["verified"] > 0


def test_rerun_replaces_a_demo_folder_but_refuses_a_foreign_one(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(InputError, match="not made by the demo"):
        run_demo(foreign, budget=10, time_scale=0.0, log=lambda _: None)
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_cli_prints_the_paths(tmp_path: Path, cache: Path) -> None:
    out = tmp_path / "cli-demo"
    exe = str(Path(sys.executable).with_name("draftdata"))
    cmd = [exe, "demo", "--out", str(out), "--budget", "20"]
    cmd += ["--time-scale", "0", "--mean-output-tokens", "60", "--cache-dir", str(cache)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"report: {out.resolve() / 'report.html'}" in res.stdout
    # a second run replaces the first demo's folder
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
