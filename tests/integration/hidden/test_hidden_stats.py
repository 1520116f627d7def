"""`stats` and `report` show a hidden-state set beside its dataset: samples and tokens done of
planned, bytes in the set, the layers, dtype and format, and the verification, read back from
the set's manifest, index, files and summary (stats/hiddenset.py). The sets are made by
`hidden-states --engine vllm` against the simulated fleet (cheap), locally and on S3 (moto)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.conftest import MotoS3
from tests.integration.hidden.simfleet import AUX, HIDDEN, LAYERS, run
from typer.testing import CliRunner

from draftdata.cli import app
from draftdata.report import build_report
from draftdata.stats.hiddenset import HIDDEN_STATS_FORMAT, hidden_set_stats, is_hidden_set

pytestmark = pytest.mark.integration


def _expected(sim_job: dict[str, Any], out: Path) -> tuple[int, int]:
    """(tokens, bytes) of the files there now, from the files themselves."""
    index = pq.read_table(out / "hidden_index.parquet").to_pylist()
    there = [r for r in index if (out / r["file"]).exists()]
    return sum(len(sim_job["samples"][r["id"]]) for r in there), sum(
        (out / r["file"]).stat().st_size for r in there
    )


def test_stats_and_report_of_a_finished_set(
    sim_job: dict[str, Any], sim_fleet: Any, tmp_path: Path
) -> None:
    _, yaml = sim_fleet(2)
    summary, _ = run(sim_job, yaml)
    out = sim_job["tmp"] / "set"
    assert is_hidden_set(str(out)) and not is_hidden_set(str(sim_job["tok"]))
    s = hidden_set_stats(str(out))
    tokens, size = _expected(sim_job, out)
    assert s["format"] == HIDDEN_STATS_FORMAT
    assert s["samples"] == {"planned": 48, "done": 48}
    assert s["tokens"]["planned"] == s["tokens"]["done"] == tokens == summary.tokens
    assert s["bytes"]["in_set"] == size == summary.bytes_total
    assert s["bytes"]["bill"] == summary.bill_bytes
    assert s["layers"] == {"aux": list(AUX), "last": LAYERS, "last_norm": "pre_norm", "count": 3}
    assert (s["dtype"], s["trainer_format"]) == ("bf16", "speculators")
    assert s["model"]["hidden_size"] == HIDDEN and s["complete"]
    assert s["verification"]["passed"] and s["verification"]["samples"] == 4
    # the command: the dataset's tables, then the set's, beside it
    res = CliRunner().invoke(app, ["stats", str(sim_job["tok"]), str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"hidden states: {out}" in res.output
    assert re.search(r"samples\s*│\s*48 / 48 \(complete\)", res.output)
    assert "passed: 4 samples one at a time" in res.output
    both = json.loads(
        CliRunner().invoke(app, ["stats", str(sim_job["tok"]), str(out), "--json"]).output
    )
    assert both[1] == s and both[0]["rows"] == 48
    # the report: a hidden-states section and headline, beside the tokenized dataset
    page = build_report(str(sim_job["tok"]), str(out), out=tmp_path / "r.html").read_text()
    assert "<h2>Hidden states</h2>" in page
    assert f"<td>{out}</td><td>48 / 48</td><td>{tokens:,}</td>" in page
    assert "passed (4 samples" in page
    alone = build_report(str(out), out=tmp_path / "alone.html").read_text()
    assert "<h2>Hidden states</h2>" in alone  # a set alone is shown as a set, not read as data


def test_stats_of_a_set_under_way(sim_job: dict[str, Any], sim_fleet: Any) -> None:
    """A pilot's set: some samples done, no summary yet (no command finished it)."""
    _, yaml = sim_fleet(1)
    run(sim_job, yaml, pilot=10)
    out = sim_job["tmp"] / "set"
    s = hidden_set_stats(str(out))
    tokens, size = _expected(sim_job, out)
    assert s["samples"] == {"planned": 48, "done": 10}
    assert s["tokens"]["done"] == tokens and s["bytes"]["in_set"] == size
    assert not s["complete"] and s["verification"] is None
    res = CliRunner().invoke(app, ["stats", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "10 / 48 (38 to do)" in res.output
    assert "no command has finished the set yet" in res.output


def test_stats_of_a_set_on_s3(sim_job: dict[str, Any], sim_fleet: Any, moto_s3: MotoS3) -> None:
    _, yaml = sim_fleet(2)
    url = moto_s3.url("hidden-stats")
    summary, _ = run(sim_job, yaml, out="unused")  # a local twin: the same files' sizes
    local = hidden_set_stats(str(sim_job["tmp"] / "unused"))
    from draftdata.hidden.config import HiddenConfig
    from draftdata.hidden.stage import hidden_states

    s3_summary = hidden_states(
        HiddenConfig(
            tokenized=str(sim_job["tok"]),
            model=str(sim_job["model"]),
            out=url,
            format="speculators",
            layers=",".join(map(str, AUX)),
            engine="vllm",
            batch_tokens=600,
            verify=2,
            progress=False,
            options={"fleet": str(yaml)},
        ),
        log=None,
    )
    s = hidden_set_stats(url)
    assert s["samples"] == {"planned": 48, "done": 48} and s["complete"]
    assert s["bytes"]["in_set"] == s3_summary.bytes_total == local["bytes"]["in_set"]
    assert s["tokens"] == local["tokens"]
    assert summary.complete
