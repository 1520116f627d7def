"""merge_report.json, the dataset card, the plan shown and a refusal stay byte for byte what
main's merge stage wrote for the same inputs (recorded in data/, report_cases.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.unit.merge.report_cases import CASES, outcome, record, recorded


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_report_is_the_recorded_one(name: str, tmp_path: Path) -> None:
    now = outcome(name, tmp_path)
    if os.environ.get("DRAFTDATA_WRITE_MERGE_FIXTURES"):
        record(name, now)
    want = recorded(name)
    assert sorted(now) == sorted(want)
    for key, text in want.items():
        assert now[key] == text, f"{name}.{key}"
