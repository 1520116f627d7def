"""stats and report on a real run: generate over the simulator (two servers, real sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.generate.helpers import fast_config, write_prompts

from draftdata.generate.stage import generate
from draftdata.report import build_report
from draftdata.report.collect import collect
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet
from draftdata.stats import compute_stats

pytestmark = pytest.mark.integration


def test_report_of_a_generated_run(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 150, kind="mixed")
    sim = SimConfig(
        time_scale=0.01,
        mean_output_tokens=60,
        output_sigma=0.3,
        max_running=8,
        faults=FaultConfig(context_400=0.05),
    )
    run = tmp_path / "run"
    with SimFleet(2, sim) as fleet:
        # a strict limit: an injected context error on a computed or lowerable one is first
        # retried smaller
        summary = generate(
            fast_config(
                prompts, run, fleet.urls, metrics_interval=0.3, max_tokens=256, strict_limit=True
            )
        )
    assert summary.failures > 0 and summary.completed > 0

    stats = compute_stats(str(run))
    assert stats.rows == summary.completed
    assert stats["failures"]["by_reason"] == summary.failed
    assert stats.length()["total"] == summary.output_tokens
    turns = sum(summary.finish_reasons.values())
    assert sum(stats["finish_reasons"].values()) == turns
    m = stats["metrics"]
    assert m["output_tokens"] == summary.output_tokens and m["failed"] == summary.failures

    data = collect([str(run)])
    h = data.headline()
    assert h["prompts"] == 150 and h["completions"] == summary.completed
    tp = data.throughput()
    assert set(tp) == set(fleet.urls)
    # the rates are built from the committed answers: they integrate back to the tokens each
    # endpoint's committed answers hold (a hedge copy that lost is generated work, not committed)
    for e in summary.endpoints:
        points = tp[e.url]
        # the bins' width from the first and last centre: the centres are rounded to 1 ms, and
        # two neighbours' difference can be 3% off a 33 ms bin
        n = len(points)
        width = (points[-1][0] - points[0][0]) / (n - 1) if n > 1 else 2 * points[0][0]
        assert sum(r for _, r in points) * width == pytest.approx(e.output_tokens, rel=0.01)
        assert e.output_tokens <= e.generated_tokens

    text = build_report(run, out=tmp_path / "r.html").read_text()
    for pid in ("domain-mix", "output-length", "finish-reasons", "failures", "throughput"):
        assert f'id="plot-{pid}"' in text
