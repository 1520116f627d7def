"""Servers that count no output tokens (no ``usage`` object, or 0 completion tokens) against
every figure that counts a run's output tokens.

Over the simulator's ``--usage none`` and ``--usage zero``, with and without token ids: the whole
run's figures (generate's summary, ``stats``, the report's headline), this command's own counts,
``stats``' per-domain lengths, the length model's history and the pilot's forecast all count an
answer's tokens the same way: from its token ids when it has them (exact: the same count the
server's usage would have given), else estimated from its text and said to be an estimate; never
0 tokens for an answer with text. A pilot whose answers carry no measured count is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.generate.helpers import completions, fast_config, write_prompts
from tests.integration.generate.test_engine import sim

from draftdata.errors import InputError
from draftdata.generate.engine.length import run_history
from draftdata.generate.plan.pilot import run_pilot
from draftdata.generate.plan.pilot_sample import PilotSpec
from draftdata.generate.stage import generate
from draftdata.sim.run import SimFleet
from draftdata.stats import compute_stats
from draftdata.stats.render import stats_renderable
from draftdata.store.opener import open_store

pytestmark = pytest.mark.integration

N = 40


def _sim_ids(out: Path) -> dict[tuple[str, int], int]:
    """Each committed completion's output ids, counted (what full usage would have said)."""
    return {
        (c.id, c.sample): sum(len(t.output_token_ids or []) for t in c.turns)
        for c in completions(out)
    }


@pytest.mark.parametrize("usage", ["none", "zero"])
@pytest.mark.parametrize("ids", [True, False])
def test_every_figure_counts_answers_whose_servers_counted_none(
    tmp_path: Path, usage: str, ids: bool
) -> None:
    from draftdata.shared.tokens import turns_tokens

    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, N)
    out = tmp_path / "run"
    with SimFleet(2, sim(usage=usage, token_ids=ids)) as fleet:
        cfg = fast_config(prompts, out, fleet.urls, token_ids="on" if ids else "off")
        summary = generate(cfg, handle_signals=False)
    got = completions(out)
    assert len(got) == N and all(c.usage.completion_tokens == 0 for c in got)
    assert all(any(t.content or t.reasoning for t in c.turns) for c in got)
    if ids:  # exact: the served ids, the count full usage gives
        want = sum(_sim_ids(out).values())
        assert want > 0
        estimated = 0
    else:
        counts = [turns_tokens(c.turns) for c in got]
        assert all(n > 0 and est for n, est in counts)  # never 0 for an answer with text
        want = sum(n for n, _ in counts)
        estimated = N
    run = summary.run
    assert run is not None
    # the whole run's figures, this command's own counts, per endpoint and per domain
    assert run.output_tokens == want and summary.output_tokens == want
    assert sum(e.output_tokens for e in run.endpoints) == want
    assert sum(d.output_tokens for d in run.domains.values()) == want
    assert run.estimated_answers == estimated == summary.estimated_answers
    assert run.output_tokens_per_s is not None and run.output_tokens_per_s > 0
    text = "\n".join(summary.lines())
    assert ("are counted from the text" in text and "another family" in text) == (not ids), text
    # stats of the run: the same figures, the per-domain lengths, the flag
    stats = compute_stats(str(out))
    assert stats["run"]["output_tokens"] == want
    assert stats["output_tokens_estimated"] == estimated
    assert stats["lengths"]["output_tokens"]["count"] == N
    rendered = str(stats_renderable(stats).renderables)
    assert ("counted from their text" in rendered and "another family" in rendered) == (not ids)
    # the length model's history
    assert sum(n for _, _, n in run_history(open_store(str(out)))) == want


@pytest.mark.parametrize("ids", [True, False])
def test_a_pilot_with_no_measured_tokens_is_refused(tmp_path: Path, ids: bool) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 60)
    out = tmp_path / "run"
    with SimFleet(2, sim(usage="none", token_ids=ids)) as fleet:
        cfg = fast_config(prompts, out, fleet.urls, token_ids="on" if ids else "off")
        if ids:
            result = run_pilot(cfg, PilotSpec(count=30), handle_signals=False)
            fc = result.forecast
            assert fc is not None and fc.output_tokens > 0
            measured = sum(_sim_ids(out).values())
            assert fc.committed_output_tokens == measured
            assert not any("estimate" in w for w in fc.warnings)
            return
        with pytest.raises(InputError, match="counted no output tokens") as exc:
            run_pilot(cfg, PilotSpec(count=30), handle_signals=False)
    assert "\n" not in str(exc.value)
    assert len(completions(out)) == 30  # the pilot's answers are kept
    assert not (out / "forecast.json").exists()
