"""Acceptance measurements in ``stats`` and ``report``: beside the mix, and side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.acceptance.test_sim_acceptance import PREFIX, write_prompts

from draftdata.acceptance.stage import AcceptanceConfig, measure_acceptance
from draftdata.cli import main
from draftdata.report import build_report
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


def _measure(out: Path, prompts: Path, rates: dict[str, float]) -> Path:
    config = SimConfig(
        flavor="sglang",
        time_scale=0,
        mean_output_tokens=120,
        spec_tokens=3,
        accept_rate_for={PREFIX[d]: r for d, r in rates.items()},
    )
    with SimFleet(n=2, config=config) as fleet:
        measure_acceptance(
            AcceptanceConfig(prompts=str(prompts), endpoints=tuple(fleet.urls), out=str(out))
        )
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("views")
    prompts = write_prompts(root / "eval.jsonl", per_domain=20)
    before = _measure(root / "before", prompts, {"code": 0.9, "math": 0.3, "general": 0.3})
    after = _measure(root / "after", prompts, {"code": 0.9, "math": 0.7, "general": 0.6})
    return prompts, before, after


def _main(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code in (0, None)


def test_stats_shows_a_measurement_and_two_side_by_side(
    two: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    prompts, before, after = two
    _main(["stats", str(prompts), str(before), str(after / "acceptance.json")])
    out = capsys.readouterr().out
    assert "side by side" in out and str(before) in out
    assert out.count("draft acceptance") >= 1
    _main(["stats", str(before), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "draftdata.acceptance/1"
    assert doc["by_domain"]["math"]["acceptance_rate"] < 0.3


def test_report_shows_acceptance_beside_the_mix_before_and_after(
    two: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    prompts, before, after = two
    page = build_report(prompts, before, after / "acceptance.json", out=tmp_path / "r.html")
    html = page.read_text()
    assert "Draft acceptance per domain" in html
    assert "acceptance: before" in html and "acceptance: after" in html
    assert "loss-token share" in html  # the mix of the subject, beside the acceptance
    got_before = json.loads((before / "acceptance.json").read_text())["by_domain"]["math"]
    assert f"{100 * got_before['acceptance_rate']:.1f}%" in html
    # a page of measurements alone
    alone = build_report(before, after, out=tmp_path / "alone.html").read_text()
    assert "Draft acceptance per domain" in alone
