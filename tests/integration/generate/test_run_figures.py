"""A run in three segments (two interrupts, then a resume to the end): every figure generate's
summary, ``stats`` and the report show is over the whole run and matches the committed shards."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.integration.generate.helpers import completions, failures, fast_config, write_prompts
from tests.integration.generate.test_engine import sim

from draftdata.generate.stage import generate
from draftdata.generate.summary import GenerateSummary
from draftdata.report import build_report
from draftdata.report.collect import collect
from draftdata.sim.run import FaultConfig, SimFleet
from draftdata.stats import compute_stats
from draftdata.stats.render import stats_renderable
from draftdata.stats.runfigures import completion_reason

pytestmark = pytest.mark.integration

N = 150
GAP_S = 1.0


def _interrupt_after(extra: int, stop: threading.Event) -> Any:
    """An ``on_engine`` hook that interrupts the engine once it has ``extra`` completions."""

    def on_engine(engine: Any) -> None:
        loop = asyncio.get_running_loop()

        def watch() -> None:
            while not stop.is_set() and engine.tally.completed < extra:
                time.sleep(0.01)
            if not stop.is_set():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(engine.interrupt)

        threading.Thread(target=watch, daemon=True).start()

    return on_engine


def _check_against_shards(out: Path, s: GenerateSummary, segments: int) -> None:
    """Every whole-run figure of the summary equals what the committed shards hold."""
    got = completions(out)
    fails = failures(out)
    run = s.run
    assert run is not None
    assert run.completions == len(got)
    assert run.prompts == len({c.id for c in got} | {f.id for f in fails})
    assert run.failed == dict(Counter(f.reason for f in fails))
    assert run.output_tokens == sum(c.usage.completion_tokens for c in got)
    assert run.prompt_tokens == sum(c.usage.prompt_tokens for c in got)
    reasons = Counter(completion_reason([t.finish_reason for t in c.turns]) for c in got)
    assert run.finish_reasons == dict(reasons)
    assert sum(run.finish_reasons.values()) == run.completions  # per completion, not per turn
    assert run.turns == sum(len(c.turns) for c in got)
    assert run.cut == sum(any(t.finish_reason == "length" for t in c.turns) for c in got)
    by_ep = Counter(c.endpoint for c in got)
    assert {e.url: e.completions for e in run.endpoints} == dict(by_ep)
    assert {e.url: e.output_tokens for e in run.endpoints} == {
        u: sum(c.usage.completion_tokens for c in got if c.endpoint == u) for u in by_ep
    }
    assert abs(sum(e.share for e in run.endpoints) - 1.0) < 1e-4
    for d, fig in run.domains.items():
        assert fig.completions == sum(c.domain == d for c in got)
        assert fig.failures == sum(f.domain == d for f in fails)
        # the lengths expected when sent, beside what the same answers took: every committed
        # answer of every segment, once
        assert fig.expected_answers == fig.completions
        assert fig.expected_measured == fig.output_tokens
        assert fig.expected_tokens > 0 and fig.expected_se > 0
        assert fig.lengths_line().startswith("; output tokens per answer: expected ")
    assert len(run.segments) == segments
    assert len(run.gaps) == segments - 1
    assert all(b - a >= GAP_S * 0.8 for a, b in run.gaps)
    assert run.span_s >= run.active_s + (segments - 1) * GAP_S * 0.8
    # this command's shares are of what it committed: they sum to 100% (or are all 0)
    shares = sum(e.share for e in s.endpoints)
    assert abs(shares - 1.0) < 0.01 if s.completed else shares == 0.0
    text = "\n".join(s.lines())
    assert f"{run.completions} completions" in text and "in the whole run" in text
    assert "finish reasons per completion" in text and "wasted (not committed)" in text
    assert f"already done before: {s.already_done}" in text
    pct = [float(x) for x in re.findall(r"([\d.]+)% of committed output tokens", text)]
    assert pct and abs(sum(pct) - 100.0) < 0.5


def test_three_segments_figures_match_the_committed_shards(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, N, kind="mixed")
    out = tmp_path / "run"
    faults = FaultConfig(error_500=0.05, context_400=0.03, slow={0: 4.0})
    summaries: list[GenerateSummary] = []
    walls: list[float] = []
    with SimFleet(3, sim(time_scale=0.05, faults=faults)) as fleet:
        cfg = fast_config(prompts, out, fleet.urls, grace_seconds=0.0, hedge_min_age=0.2)
        for k, extra in enumerate((25, 40, None)):
            stop = threading.Event()
            hook = _interrupt_after(extra, stop) if extra else None
            try:
                s = generate(cfg, on_engine=hook)
            finally:
                stop.set()
            assert s.interrupted == (extra is not None)
            summaries.append(s)
            walls.append(s.wall_s)
            _check_against_shards(out, s, k + 1)
            time.sleep(GAP_S)
        # a resume with nothing left: no share is claimed for it; the run is unchanged
        idle = generate(cfg)
    assert idle.completed == 0 and all(e.share == 0.0 for e in idle.endpoints)
    last, run = summaries[-1].run, idle.run
    assert last is not None and run is not None
    assert (run.completions, run.prompts, run.output_tokens) == (
        last.completions,
        last.prompts,
        last.output_tokens,
    )
    assert run.prompts == N  # every prompt settled once, not once per command
    assert run.completions + run.failures == N
    # active time is the commands' own time, not the first nor the span
    assert sum(walls) * 0.9 - 0.5 <= last.active_s <= sum(walls) + 1.5
    rate = last.output_tokens_per_s
    assert rate is not None and abs(rate - last.output_tokens / last.active_s) < 1e-6
    assert last.wasted.hedges == sum(s.hedges for s in summaries)
    assert last.wasted.retries == sum(s.retries for s in summaries)
    committed = sum(e.output_tokens for e in last.endpoints)
    assert committed == last.output_tokens
    generated = sum(e.generated_tokens for s in summaries for e in s.endpoints)
    assert generated >= committed
    assert last.wasted.output_tokens == generated - committed

    # stats: the same figures, from the same shards
    st = compute_stats(str(out))
    assert st["run"]["completions"] == run.completions
    assert st["run"]["prompts"] == N
    assert st["run"]["active_s"] == run.active_s
    assert sum(st["finish_reasons"].values()) == run.completions
    assert abs(st["metrics"]["wall_s"] - run.active_s) < 0.01  # the snapshots' headline too
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(stats_renderable(st))
    shown = console.export_text()
    assert f"whole run: {N:,} prompts, {run.completions:,} completions" in shown
    assert "over the active time" in shown

    # the report: headline over the whole run, committed endpoint table, gaps on the time axis
    data = collect([str(out)])
    head = data.headline()
    assert head["prompts"] == N and head["completions"] == run.completions
    assert head["output_tokens"] == run.output_tokens
    assert head["wall_s"] == round(run.active_s, 1)
    assert head["segments"] == 4
    assert len(data.runs[0].gaps()) == 3
    page = build_report(str(out), out=tmp_path / "r.html").read_text()
    assert "committed output tokens" in page and "wasted work (not committed)" in page
    assert "gaps between the run&#x27;s segments" in page or "gaps between the run's" in page
    assert "per completion" in page
