"""The mix the user asks prepare for acts on the plan, or prepare says in one line why not.

- ``examples/expansion.yaml`` as shipped (its sources on the bundled samples): a mix aimed at a
  domain takes the most prompts of that domain, for every domain, in rows and in tokens (the
  README's step 4: ``--mix suggested_mix.json --mix-by tokens``); no fixed ``take:`` overrides
  it;
- where sources' fixed ``take:`` hold the mix off its target, one ``warning:`` line says so
  with the resulting shares, and never where the mix acts.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.unit.prepare.expansion import SHIPPED, local_expansion

from draftdata.cli import main
from draftdata.prepare.config import PrepareConfig
from draftdata.prepare.samples import sample_config, write_sample_sources
from draftdata.prepare.stage import prepare
from draftdata.support.config import load_config

DOMAINS = ("agent", "code", "general", "math", "tool")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftdata.demo.existing import write_existing_set

    root = tmp_path_factory.mktemp("expansion")
    write_sample_sources(root / "samples")
    write_existing_set(root / "live.jsonl", rows=400, seed=0)
    return root


def test_the_shipped_config_fixes_no_take_and_plans_its_budget() -> None:
    cfg = load_config(SHIPPED, PrepareConfig)
    assert cfg.budget == 193_010 and cfg.mix
    assert len(cfg.sources) == 6 and all(s.hub and s.take is None for s in cfg.sources)


@pytest.mark.parametrize("mix_by", ["rows", "tokens"])
def test_the_shipped_config_lets_the_mix_act(folder: Path, mix_by: str) -> None:
    base = local_expansion(folder / "samples", str(folder / "live.jsonl"), budget=40)
    new: dict[str, dict[str, int]] = {}
    available: dict[str, int] = {}
    for aimed in DOMAINS:
        mix = {d: (0.8 if d == aimed else 0.05) for d in DOMAINS}
        cfg = msgspec.structs.replace(base, mix=mix, mix_by=mix_by, holdout=200)
        result = prepare(cfg, plan_only=True)
        assert result.plan.mix_by == mix_by and "mix_note" not in result.report
        new[aimed] = {r.domain: r.new for r in result.plan.domains}
        available = {r.domain: r.available for r in result.plan.domains}
    moved = 0
    for aimed in DOMAINS:
        most = max(new[other].get(aimed, 0) for other in DOMAINS)
        assert new[aimed].get(aimed, 0) == most, (aimed, new)
        if any(new[other].get(aimed, 0) < most for other in DOMAINS):
            moved += 1
        else:  # a domain every mix takes whole (agent: 4 prompts after the held-out split)
            assert most == available[aimed], (aimed, new, available)
    assert moved >= 3, new


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    takes=st.lists(st.one_of(st.none(), st.integers(0, 30)), min_size=6, max_size=6),
    weights=st.lists(st.integers(1, 10), min_size=5, max_size=5),
    budget=st.one_of(st.none(), st.integers(10, 90)),
)
def test_fixed_takes_that_hold_the_mix_off_its_target_are_said_in_one_line(
    folder: Path,
    capsys: pytest.CaptureFixture[str],
    takes: list[int | None],
    weights: list[int],
    budget: int | None,
) -> None:
    from draftdata.shared.mix import off_target

    cfg = sample_config(folder / "samples", folder / "out")
    cfg = msgspec.structs.replace(
        cfg,
        sources=[
            msgspec.structs.replace(s, take=t) for s, t in zip(cfg.sources, takes, strict=True)
        ],
        mix=dict(zip(DOMAINS, map(float, weights), strict=True)),
        budget=budget,
    )
    path = folder / "p.yaml"
    path.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    result = prepare(cfg, plan_only=True)
    plan = result.plan
    note = result.report.get("mix_note")
    if plan.fixed and off_target(plan):
        assert note is not None
        for r in plan.domains:
            if r.target is not None:
                assert f"{r.domain} {100 * r.after:.1f}% (target {100 * r.target:.1f}%)" in note
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main(["prepare", str(path), "--plan-only"])
        err = capsys.readouterr().err
        said = [x for x in err.splitlines() if "take:" in x]
        assert len(said) == 1 and said[0].startswith("warning: mix:"), err
    else:
        assert note is None


def test_a_config_whose_takes_fix_every_prompt_says_so(folder: Path) -> None:
    """The observed case: every source has a fixed ``take:``; the same plan with or without
    the mix, which prepare now says in its report (and the CLI in one line)."""
    cfg = sample_config(folder / "samples", folder / "out")
    cfg = msgspec.structs.replace(
        cfg, sources=[msgspec.structs.replace(s, take=6) for s in cfg.sources], budget=None
    )
    with_mix = prepare(cfg, plan_only=True)
    without = prepare(msgspec.structs.replace(cfg, mix={}), plan_only=True)
    assert with_mix.plan.per_source == without.plan.per_source
    note = with_mix.report["mix_note"]
    assert "decide 36 of the 36 new prompts" in note and "max_take:" in note
    assert json.dumps(with_mix.report)  # JSON-ready
