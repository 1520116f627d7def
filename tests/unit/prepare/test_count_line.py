"""prepare's summary line counts every row read once (issue 31): "not taken 2,221 (budget and
mix)" held the 681 prompts held out as the evaluation split. Generated over holdouts, budgets
and seeds on the bundled sample sources: rejected + duplicates + held out + not taken + the
prompts taken is the rows read, and held out is the evaluation split's size."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.cli import main


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftdata.prepare.samples import sample_config, write_sample_sources

    root = tmp_path_factory.mktemp("samples")
    write_sample_sources(root / "samples")
    cfg = sample_config(root / "samples", root / "out")
    path = root / "prep.yaml"
    path.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    return path


def _count(line: str, name: str) -> int:
    m = re.search(rf"{name} ([\d,]+) \(", line)
    return int(m.group(1).replace(",", "")) if m else 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    holdout=st.integers(0, 12),
    budget=st.one_of(st.none(), st.integers(0, 150)),
    seed=st.integers(0, 5),
)
def test_every_row_read_is_counted_once(
    config: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    holdout: int,
    budget: int | None,
    seed: int,
) -> None:
    out = tmp_path_factory.mktemp("prep") / "out"
    argv = ["prepare", str(config), "--out", str(out), "--holdout", str(holdout)]
    argv += ["--seed", str(seed)] + ([] if budget is None else ["--budget", str(budget)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    printed = capsys.readouterr().out.replace("\n", " ")
    assert exit_.value.code in (0, None), printed
    m = re.search(r"\(([\d,]+) rows in [\d.]+s", printed)
    assert m, printed
    read = int(m.group(1).replace(",", ""))
    line = printed[printed.index(f"of {read:,} rows read: ") :]
    parts = {k: _count(line, k) for k in ("rejected", "duplicates", "held out", "not taken")}
    # what was written, counted from the files: the prompts taken and the evaluation split
    taken = sum(len(p.read_text().splitlines()) for p in out.glob("prompts-*.jsonl"))
    held = sum(len(p.read_text().splitlines()) for p in out.glob("eval/**/*.jsonl"))
    assert parts["held out"] == held, (line, held)
    assert sum(parts.values()) + taken == read, (line, taken, read)
    assert ("held out" in line) == bool(held), line


def test_counts_that_do_not_add_up_are_a_bug() -> None:
    from draftdata.support.metrics import accounted

    assert accounted(10, "rows read", [("a", 3, ""), ("b", 2, "why")], 5) == (
        "of 10 rows read: a 3 (30.0%), b 2 (20.0%; why)"
    )
    for parts, kept in (([("a", 3, "")], 5), ([("a", 12, "")], 0), ([("a", -1, "")], 11)):
        with pytest.raises(ValueError):
            accounted(10, "rows read", parts, kept)
