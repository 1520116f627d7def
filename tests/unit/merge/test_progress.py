"""merge's progress lines are true: the last line of each input shows all its rows, and the
route line all rows routed (issue 24: a 2,000-row input in 64-row shards showed "64 rows",
the first batch, and nothing after it). The CLI in-process over tokenized parquet of random
sizes and shard counts."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.merge.helpers import token_samples

from draftdata.cli import main

LINE = re.compile(r"^merge: (?P<what>.+): (?P<rows>[\d,]+) rows \((?P<rate>[\d,]+) rows/s\)$")


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(rows=st.integers(1, 3000), shards=st.integers(1, 40))
def test_the_last_progress_line_of_an_input_shows_all_its_rows(
    capsys: pytest.CaptureFixture[str], rows: int, shards: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = token_samples(Path(tmp) / "in", {"code": rows}, prefix="r", shards=shards)
        capsys.readouterr()
        try:
            main(["merge", "--add", str(data), "--out", str(Path(tmp) / "out"), "--workers", "1"])
        except SystemExit as exc:
            assert not exc.code
        err = capsys.readouterr().err
    seen: dict[str, list[int]] = {}
    for line in err.splitlines():
        m = LINE.match(line)
        if m:
            seen.setdefault(m["what"], []).append(int(m["rows"].replace(",", "")))
    assert set(seen) == {str(data), "route"}, err
    for what, counts in seen.items():
        assert counts == sorted(counts) and counts[-1] == rows, (what, counts, err)
