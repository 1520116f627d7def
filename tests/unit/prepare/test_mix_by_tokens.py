"""prepare --mix-by tokens: lengths from a pilot's forecast or the existing set's answers, the
plan landing on token shares, the report's expected tokens, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from draftdata.cli import app
from draftdata.errors import ConfigError, DraftdataError
from draftdata.prepare.config import ExistingConfig, PrepareConfig
from draftdata.prepare.samples import sample_config, write_sample_sources
from draftdata.prepare.stage import prepare
from draftdata.records import parse_prompt
from draftdata.store.forecast import FORECAST_FORMAT
from draftdata.store.prompts import iter_prompt_lines


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("samples")
    write_sample_sources(d)
    return d


def write_forecast(path: Path, per_prompt: dict[str, float]) -> Path:
    """A forecast file as a pilot writes one (only the fields prepare reads matter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "format": FORECAST_FORMAT,
        "by_domain": {
            d: {"prompts": 100, "mean_output_tokens": v, "output_tokens_per_prompt": v,
                "measured": True}
            for d, v in per_prompt.items()
        },
    }  # fmt: skip
    path.write_text(json.dumps(data))
    return path


LENGTHS = {"code": 300.0, "math": 3000.0, "general": 900.0, "tool": 150.0, "agent": 1200.0}


def _config(samples: Path, out: Path, **kw: Any) -> PrepareConfig:
    kw.setdefault("existing", None)
    return msgspec.structs.replace(sample_config(samples, out), **kw)


def _written(result: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for shard in result.shards:
        for n, raw in iter_prompt_lines(shard):
            p = parse_prompt(raw, f"line {n}")
            counts[p.domain] = counts.get(p.domain, 0) + 1
    return counts


def test_a_plan_in_tokens_from_a_forecast_lands_on_the_token_shares(
    samples: Path, tmp_path: Path
) -> None:
    fc = write_forecast(tmp_path / "run" / "forecast.json", LENGTHS)
    mix = {"code": 0.5, "math": 0.5}
    result = prepare(_config(samples, tmp_path / "out", budget=22, mix=mix, lengths=str(fc)))
    rep = result.report
    assert rep["mix_by"] == "tokens" and result.plan.mix_by == "tokens"
    assert rep["lengths"]["source"] == str(fc)
    assert rep["lengths"]["tokens_per_row"]["math"] == 3000.0
    new = {d["domain"]: d["new"] for d in rep["domains"]}
    assert new["code"] == 20 and new["math"] == 2  # 6,000 tokens each: 10 code rows per math
    assert _written(result) == {"code": 20, "math": 2}
    rows = {d["domain"]: d for d in rep["domains"]}
    assert rows["code"]["new_tokens"] == 6000 and rows["math"]["new_tokens"] == 6000
    assert rows["code"]["tokens_after"] == pytest.approx(0.5)
    md = (tmp_path / "out" / "prepare_report.md").read_text()
    assert "Planned in tokens" in md and "tok after" in md and str(fc) in md
    # the same config in rows takes 11 of each; auto without lengths is rows as before
    rows_plan = prepare(
        _config(samples, tmp_path / "o2", budget=22, mix=mix, lengths=str(fc), mix_by="rows"),
        plan_only=True,
    )
    assert {d.domain: d.new for d in rows_plan.plan.domains if d.new} == {"code": 11, "math": 11}
    assert rows_plan.plan.mix_by == "rows" and rows_plan.report["lengths"]  # shown, not planned
    plain = prepare(_config(samples, tmp_path / "o3", budget=22, mix=mix), plan_only=True)
    assert plain.plan.mix_by == "rows" and "lengths" not in plain.report
    assert all(d.tokens_per_row is None for d in plain.plan.domains)


def test_the_newest_forecast_of_a_run_folder_is_read_and_outputs_are_deterministic(
    samples: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    write_forecast(run / "forecast.json", {"code": 10.0, "math": 10.0})
    write_forecast(run / "forecast-2.json", LENGTHS)
    cfg = _config(samples, tmp_path / "a", budget=22, mix={"code": 0.5, "math": 0.5},
                  lengths=str(run))  # fmt: skip
    a = prepare(cfg)
    assert a.report["lengths"]["source"] == str(run / "forecast-2.json")
    prepare(msgspec.structs.replace(cfg, out=str(tmp_path / "b")))
    for name in ("prompts-00000.jsonl", "prepare_report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_lengths_measured_from_the_existing_answers(samples: Path, tmp_path: Path) -> None:
    existing = tmp_path / "existing.jsonl"
    long_answer = " ".join(["token"] * 800)
    rows = [
        {"messages": [{"role": "user", "content": f"Solve for x: {i}x + 2 = 11."},
                      {"role": "assistant", "content": long_answer}], "domain": "math"}
        for i in range(5)
    ] + [
        {"messages": [{"role": "user", "content": f"Write a python function number {i}."},
                      {"role": "assistant", "content": "def f(): return 1"}], "domain": "code"}
        for i in range(20)
    ]  # fmt: skip
    existing.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = _config(samples, tmp_path / "out", budget=30, mix={"code": 0.5, "math": 0.5},
                  mix_by="tokens", existing=ExistingConfig(path=str(existing)))  # fmt: skip
    result = prepare(cfg, plan_only=True)
    lengths = result.report["lengths"]
    assert lengths["source"] == "existing answers" and lengths["existing_measured"]
    per = lengths["tokens_per_row"]
    assert per["math"] > 100 * per["code"] / 10  # 800 words against a one-liner
    assert any("no expected length for domain" in n for n in lengths["notes"])  # e.g. tool
    rows = {d.domain: d for d in result.plan.domains}
    assert rows["math"].existing == 5 and rows["math"].existing_tokens == pytest.approx(
        5 * per["math"], rel=0.01
    )
    # math already holds most of the tokens: the new rows go to code
    assert rows["code"].new > rows["math"].new


def test_refusals_are_one_line_and_come_before_any_work(samples: Path, tmp_path: Path) -> None:
    not_forecast = tmp_path / "lengths.json"
    not_forecast.write_text(json.dumps({"format": "draftdata.prepare_report/1"}))
    out = tmp_path / "out"
    for lengths, says in [
        (str(not_forecast), "this draftdata reads draftdata.forecast/1 (a pilot's forecast)"),
        (str(tmp_path / "missing.json"), "no such file"),
        (str(samples / "codefeedback.jsonl"), "not valid JSON"),
    ]:
        with pytest.raises(DraftdataError) as info:
            prepare(_config(samples, out, mix={"code": 1.0}, lengths=lengths))
        assert says in str(info.value) and "\n" not in str(info.value)
        assert not out.exists()  # refused before the output folder was touched
    with pytest.raises(ConfigError, match="--mix-by tokens: the expected answer lengths"):
        prepare(_config(samples, out, mix={"code": 1.0}, mix_by="tokens"), plan_only=True)
    with pytest.raises(ConfigError, match="mix_by: 'bytes'; use auto, rows, tokens"):
        prepare(_config(samples, out, mix_by="bytes"), plan_only=True)


def test_cli_options(samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fc = write_forecast(tmp_path / "fc" / "forecast.json", LENGTHS)
    config = tmp_path / "q.yaml"
    cfg = sample_config(samples, tmp_path / "out")
    data = msgspec.to_builtins(msgspec.structs.replace(cfg, existing=None, budget=22,
                                                       mix={"code": 0.5, "math": 0.5}))  # fmt: skip
    config.write_text(json.dumps(data))  # JSON is YAML
    monkeypatch.chdir(tmp_path / "fc")  # --lengths is relative to the working directory
    runner = CliRunner()
    res = runner.invoke(app, ["prepare", str(config), "--plan-only", "--lengths", "forecast.json"])
    assert res.exit_code == 0, res.output
    assert "in expected tokens" in res.output and "tok after" in res.output
    assert f"expected tokens per new prompt's answer from {fc}" in res.output.replace("\n", "")
    res = runner.invoke(app, ["prepare", str(config), "--plan-only", "--mix-by", "bytes"])
    assert isinstance(res.exception, ConfigError)  # main() prints it as one line, exit 1
    assert str(res.exception) == "--mix-by 'bytes': use rows, tokens or auto"
