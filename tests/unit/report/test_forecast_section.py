"""The report's "Forecast against actual" section on a small run with a forecast file."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.stats import builders as b

from draftdata.report.build import build_report
from draftdata.store.forecast import FORECAST_FORMAT


def _forecast(
    prompts: int, rest_tokens: int, by_domain: dict[str, dict[str, float]]
) -> dict[str, object]:
    return {
        "format": FORECAST_FORMAT,
        "pilot": {"spec": "0.5", "seed": 0, "prompts": 3},
        "prompts": prompts,
        "output_tokens": rest_tokens,
        "output_tokens_90": [rest_tokens - 10, rest_tokens + 10],
        "run_output_tokens": rest_tokens + 200,
        "run_output_tokens_90": None,
        "wall_s": 9.0,
        "wall_s_90": [8.0, 10.0],
        "gpu_hours": 0.005,
        "gpu_hours_90": None,
        "gpus": 2,
        "committed_output_tokens": 200,
        "committed_active_s": 5.0,
        "by_domain": by_domain,
    }


def _text(html: str) -> str:
    section = html[html.index("Forecast against actual") :]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section))


def test_a_finished_run_is_compared_with_its_newest_forecast(tmp_path: Path) -> None:
    run = b.run_dir(tmp_path / "run")  # 7 completions (830 output tokens), 2 failures
    (run / "forecast.json").write_text(json.dumps(_forecast(99, 1, {})))  # an older one
    doms = {
        "code": {"prompts": 5, "mean_output_tokens": 110.0, "cut_share": 0.0,
                 "output_tokens": 460, "share": 0.6},
        "math": {"prompts": 3, "mean_output_tokens": 175.0, "cut_share": 0.5,
                 "output_tokens": 350, "share": 0.4},
    }  # fmt: skip
    (run / "forecast-2.json").write_text(json.dumps(_forecast(9, 630, doms)))
    text = _text(build_report(str(run), out=tmp_path / "r.html").read_text())
    assert "forecast-2.json: pilot of 3 prompts (0.5, seed 0) of 9" in text
    # rest: 830 committed now - 200 at the forecast = 630 -> ratio 1.000
    assert "output tokens, the rest of the run 630 620 - 640 630 1.000" in text
    assert "output tokens, the whole run 830 - 830 1.000" in text
    # wall: active 20 s now - 5 s at the forecast = 15 s against 9 s forecast
    assert "wall seconds, the rest (active time) 9.0 8.0 - 10.0 15.0 0.600" in text
    # per domain, actual beside forecast: code 4 completions of 460 tokens (mean 115)
    assert "code 5 110.0 115.0 0.0% 0.0% 460 460 60.0% 55.4%" in text
    assert "math 3 175.0 175.0 50.0% 50.0% 350 350 40.0% 42.2%" in text


def test_an_unfinished_run_shows_the_forecast_alone(tmp_path: Path) -> None:
    run = b.run_dir(tmp_path / "run")
    doms = {"code": {"prompts": 50, "mean_output_tokens": 110.0, "output_tokens": 5000}}
    (run / "forecast.json").write_text(json.dumps(_forecast(60, 5000, doms)))
    text = _text(build_report(str(run), out=tmp_path / "r.html").read_text())
    assert "the run is not finished (9 of 60 prompts settled)" in text
    assert "output tokens, the rest of the run 5,000 4,990 - 5,010 - -" in text


def test_a_run_without_a_pilot_says_so(tmp_path: Path) -> None:
    run = b.run_dir(tmp_path / "run")
    text = _text(build_report(str(run), out=tmp_path / "r.html").read_text())
    assert text.startswith("Forecast against actual no pilot forecast in the run")
