"""merge's plan and tables say only what is true of the next command.

- the ways out of a plan that keeps too little: every one suggested keeps at least
  ``--min-keep`` when the next command takes it (a generator over supplies, lengths, mixes,
  tolerances and ``--min-keep``), so no suggestion is refused in turn;
- the row table labels its shares: the rows' shares are of rows and the target of the unit the
  mix was planned in, so a token target beside a row share is not read as a miss.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.unit.merge.test_token_mix import run_cli, samples

from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge

DOMAINS = ("agent", "code", "general", "math", "tool")


def _with(config: MergeConfig, option: str) -> MergeConfig:
    """``config`` as the next command would have it with ``option`` added."""
    words = option.split()
    changes: dict[str, object] = {}
    for i, w in enumerate(words):
        if w == "--upsample":
            changes["upsample"] = True
        elif w == "--max-repeat":
            changes["max_repeat"] = int(words[i + 1])
        elif w == "--tolerance":
            changes["tolerance"] = float(words[i + 1])
        elif w == "--allow-drop":
            changes["allow_drop"] = True
    return msgspec.structs.replace(config, **changes)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    supply=st.dictionaries(
        st.sampled_from(DOMAINS),
        st.tuples(st.integers(1, 60), st.integers(5, 400)),
        min_size=2,
        max_size=5,
    ),
    weights=st.lists(st.integers(1, 20), min_size=5, max_size=5),
    min_keep=st.sampled_from([0.3, 0.5, 0.7, 0.9]),
    tolerance=st.sampled_from([0.0, 0.005, 0.02]),
    upsample=st.booleans(),
    by=st.sampled_from(["tokens", "rows"]),
)
def test_every_way_out_it_suggests_passes_the_next_command(
    tmp_path_factory: pytest.TempPathFactory,
    supply: dict[str, tuple[int, int]],
    weights: list[int],
    min_keep: float,
    tolerance: float,
    upsample: bool,
    by: str,
) -> None:
    folder = samples(tmp_path_factory.mktemp("in") / "s", supply, "x")
    mix = {d: float(w) for d, w in zip(sorted(supply), weights, strict=False)}
    config = MergeConfig(
        existing=[str(folder)],
        mix=mix,
        out=str(folder.parent / "out"),
        min_keep=min_keep,
        tolerance=tolerance,
        upsample=upsample,
        mix_by=by,
        plan_only=True,
    )
    plan = merge(config).report.plan
    if not plan.stops:
        assert plan.ways_out is None
        return
    ways = plan.ways_out
    assert ways is not None and ways[-1].option == "--allow-drop"
    for way in ways[:-1]:
        if way.kept_share is None:  # says that nothing short of --allow-drop is enough
            assert len(ways) == 2
            continue
        assert way.kept_share >= min_keep, way
        again = merge(_with(config, way.option)).report.plan
        assert not again.stops, (way, again.kept_share)
        assert again.kept_share >= way.kept_share - 1e-6, (way, again.kept_share)


def test_the_row_table_labels_row_shares_and_token_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = samples(tmp_path / "s", {"code": (60, 10), "math": (20, 300)}, "x")
    for by, unit in (("tokens", "of tokens"), ("rows", "of rows")):
        out = tmp_path / f"out-{by}"
        args = ["merge", "--existing", str(folder), "--mix", "code=0.2,math=0.8"]
        code, text, err = run_cli(
            [*args, "--mix-by", by, "--allow-drop", "--out", str(out)], capsys
        )
        assert code == 0, err
        rows_table = text[text.index("domain mix in rows") : text.index("loss tokens (before")]
        assert "before % (rows)" in rows_table and "train % (rows)" in rows_table
        assert f"target ({unit})" in rows_table, rows_table
        tokens_table = text[text.index("loss tokens (before") :]
        assert "train % (tokens)" in tokens_table and f"target ({unit})" in tokens_table
        card = (out / "README.md").read_text()
        report = json.loads((out / "merge_report.json").read_text())
        label = "loss tokens" if report["mix_by"] == "loss_tokens" else "rows"
        assert f"| train (rows) | eval (rows) | target (share of {label}) |" in card
