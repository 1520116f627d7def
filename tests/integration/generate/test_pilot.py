"""``generate --pilot`` against the simulator: the sample runs into the run, the full command
resumes it, and the forecast's arithmetic holds on a fleet whose answer lengths are known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, fast_config

from draftdata.generate.plan.pilot import run_pilot
from draftdata.generate.plan.pilot_sample import PilotSpec
from draftdata.generate.stage import generate
from draftdata.records import Message, Prompt
from draftdata.report.build import build_report
from draftdata.shared.domains import classify_domain
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store.forecast import read_forecast

pytestmark = pytest.mark.integration

# with sigma 0 every answer of a domain is its mean plus the end-of-turn token
MEANS = {"math": 60, "code": 24, "general": 12}
TEXTS = {
    "math": "Solve for x: {a}x + 2 = 11. What is the probability of {i}?",
    "code": "Write a python function that sorts the list {i} and explain the algorithm.",
    "general": "Tell me about the sky on day {i}.",
}


def write_prompts(path: Path, n: int) -> dict[str, str]:
    """``n`` prompts over three sources and three domains (tagged by the classifier, as
    prepare does); returns id -> domain."""
    out = {}
    with path.open("wb") as fh:
        for i in range(n):
            domain = ("math", "code", "general", "code")[i % 4]
            source = ("alpha", "beta", "gamma")[i % 3]
            m = [Message(role="user", content=TEXTS[domain].format(a=i % 7 + 2, i=i))]
            p = Prompt(id=f"{source}/{i:05d}", source=source, domain=classify_domain(m),
                       messages=m)  # fmt: skip
            out[p.id] = p.domain
            fh.write(msgspec.json.encode(p) + b"\n")
    return out


def fleet_config(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "time_scale": 0.3,
        "output_sigma": 0.0,
        "mean_output_tokens": 30,
        "domain_mean_output_tokens": MEANS,
        "max_running": 8,
    }
    base.update(kw)
    return SimConfig(**base)


def test_pilot_then_the_full_command_resumes_and_the_forecast_is_exact(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    domains = write_prompts(prompts, 480)
    assert set(domains.values()) == set(MEANS)
    run = tmp_path / "run"
    with SimFleet(2, fleet_config()) as fleet:
        cfg = fast_config(prompts, run, fleet.urls, max_tokens=500)
        pilot = run_pilot(cfg, PilotSpec(fraction=0.1), seed=5, handle_signals=False)
        manifest = (run / "manifest.json").read_bytes()
        got = {c.id for c in completions(run)}
        assert got == pilot.sample.ids and len(got) == 48  # the sample, and only it
        fc = pilot.forecast
        assert fc is not None and pilot.forecast_url == str(run / "forecast.json")
        assert read_forecast(str(run))[1] == fc
        full = generate(cfg, handle_signals=False)
    # the same command without --pilot: the same run, the pilot's answers skipped
    assert (run / "manifest.json").read_bytes() == manifest
    assert not (run / "manifest-history").exists()
    assert full.already_done == 48 and full.completed == 480 - 48
    check_exactly_once(str(run), set(domains))
    # the forecast against the run: lengths are exact, so are the tokens
    rest = sum(c.usage.completion_tokens for c in completions(run) if c.id not in got)
    assert fc.output_tokens == rest
    assert fc.remaining_prompts == 432 and fc.prompts == 480
    for d, mean in MEANS.items():
        row = fc.by_domain[d]
        assert row.prompts == sum(1 for v in domains.values() if v == d)
        assert row.mean_output_tokens == mean + 1 == row.p90_output_tokens
        assert row.cut_share == 0
        assert row.output_tokens == row.prompts * (mean + 1)
    assert fc.run_output_tokens == sum(c.usage.completion_tokens for c in completions(run))
    if fc.wall_s is not None:  # measured: the time arithmetic holds
        rate = fc.throughput.output_tokens_per_s
        fixed = fc.throughput.overhead_s + fc.throughput.drain_s
        assert fc.wall_s == pytest.approx(fixed + rest / rate, abs=0.2)
        assert fc.gpu_hours == pytest.approx(2 * fc.wall_s / 3600, abs=1e-3)
    else:
        assert any("not measured" in w for w in fc.warnings)
    # the report shows the forecast against the finished run
    page = build_report(str(run), out=tmp_path / "report.html").read_text()
    section = page[page.index("Forecast against actual") :]
    assert "output tokens, the rest of the run" in section and "1.000" in section


def test_a_second_pilot_writes_the_next_forecast_and_a_bigger_one_adds_prompts(
    tmp_path: Path,
) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 200)
    run = tmp_path / "run"
    with SimFleet(2, fleet_config(time_scale=0.05)) as fleet:
        cfg = fast_config(prompts, run, fleet.urls, max_tokens=500)
        first = run_pilot(cfg, PilotSpec(count=20), handle_signals=False)
        again = run_pilot(cfg, PilotSpec(count=20), handle_signals=False)
        bigger = run_pilot(cfg, PilotSpec(count=40), handle_signals=False)
    assert first.forecast_url and first.forecast_url.endswith("forecast.json")
    assert again.forecast_url and again.forecast_url.endswith("forecast-2.json")
    assert bigger.forecast_url and bigger.forecast_url.endswith("forecast-3.json")
    assert again.summary.completed == 0 and again.summary.already_done == 20  # same sample
    assert bigger.summary.completed == 20 and first.sample.ids <= bigger.sample.ids
    assert again.forecast is not None and first.forecast is not None
    assert again.forecast.output_tokens == first.forecast.output_tokens
    if first.forecast.wall_s is not None:  # the second ran nothing: the first's rate
        assert again.forecast.throughput.source.endswith("forecast.json")
    assert read_forecast(str(run))[0].endswith("forecast-3.json")
    assert len(completions(run)) == 40


def test_a_pilot_into_an_s3_run(tmp_path: Path, moto_s3: Any) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 120)
    url = moto_s3.url("pilot")
    with SimFleet(1, fleet_config(time_scale=0.02)) as fleet:
        cfg = fast_config(prompts, Path("unused"), fleet.urls, max_tokens=500)
        cfg = msgspec.structs.replace(cfg, out=url)
        result = run_pilot(cfg, PilotSpec(fraction=0.25), handle_signals=False)
        second = run_pilot(cfg, PilotSpec(fraction=0.25), handle_signals=False)
    assert result.forecast_url == f"{url}/forecast.json"
    assert second.forecast_url == f"{url}/forecast-2.json"
    found, data = read_forecast(url)
    assert found == f"{url}/forecast-2.json" and data.prompts == 120
    assert read_forecast(f"{url}/forecast.json")[1].pilot.prompts == 30


CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]


def test_the_cli_prints_the_forecast_and_refuses_bad_values(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 100)
    run = tmp_path / "run"
    with SimFleet(1, fleet_config(time_scale=0.02)) as fleet:
        base = ["--prompts", str(prompts), "--endpoint", fleet.urls[0], "--out", str(run)]
        res = subprocess.run(
            [*CLI, *base, "--pilot", "0.2", "--max-tokens", "500", "--progress", "off",
             "--summary-json", str(tmp_path / "s.json")],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert "pilot: 20 prompts (0.2, seed 0" in res.stdout
        assert f"forecast written to {run / 'forecast.json'}" in res.stdout
        assert "the whole run:" in res.stdout
        assert json.loads((tmp_path / "s.json").read_text())["forecast"]["prompts"] == 100
        for value, says in [("0", "must be above 0"), ("1", "1 is neither"), ("x", "number")]:
            bad = subprocess.run(
                [*CLI, *base, "--pilot", value], capture_output=True, text=True, timeout=60,
                check=False,
            )  # fmt: skip
            assert bad.returncode == 1
            lines = bad.stderr.strip().splitlines()
            assert len(lines) == 1 and says in lines[0] and lines[0].startswith("error: --pilot")
        ray = subprocess.run(
            [*CLI, *base, "--pilot", "0.1", "--ray"], capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert ray.returncode == 1 and "a pilot runs on one machine" in ray.stderr


@pytest.mark.parametrize("password", [None, "pw-pilot-x7"])
@pytest.mark.parametrize("gpus", ["0", "0,1", "2,3,4"])
def test_the_forecast_counts_each_endpoints_gpus_from_the_fleet_file(
    tmp_path: Path, password: str | None, gpus: str
) -> None:
    """fleet.yaml's ``gpu`` of an endpoint (with or without a password in its URL) is the GPUs
    its forecast counts, never a default of one; the password is in no forecast."""
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 60)
    with SimFleet(1, fleet_config(time_scale=0.05)) as fleet:
        url = fleet.urls[0]
        if password:
            url = url.replace("http://", f"http://alice:{password}@", 1)
        fleet_file = tmp_path / "fleet.yaml"
        fleet_file.write_text(f"endpoints:\n  - url: {url}\n    gpu: '{gpus}'\n")
        cfg = fast_config(prompts, tmp_path / "run", [], max_tokens=200)
        cfg = msgspec.structs.replace(cfg, endpoints=[], fleet=str(fleet_file))
        pilot = run_pilot(cfg, PilotSpec(count=12), seed=1, handle_signals=False)
    fc = pilot.forecast
    assert fc is not None
    (ep,) = fc.throughput.endpoints
    assert ep.gpus == len(gpus.split(","))
    if password:
        assert password not in json.dumps(pilot.forecast_json()) and "alice:***@" in ep.url
