"""merge_report.json, the dataset card, the plan shown and a refusal stay byte for byte what
main's merge stage wrote for the same inputs (recorded in data/, report_cases.py); the report
reads back as its typed record, and a file that is not one is refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.unit.merge.report_cases import CASES, DATA, outcome, record, recorded

from draftdata.errors import FormatVersionError, InputError
from draftdata.store.merge_report import dump_report, read_report


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_report_is_the_recorded_one(name: str, tmp_path: Path) -> None:
    now = outcome(name, tmp_path)
    if os.environ.get("DRAFTDATA_WRITE_MERGE_FIXTURES"):
        record(name, now)
    want = recorded(name)
    assert sorted(now) == sorted(want)
    for key, text in want.items():
        assert now[key] == text, f"{name}.{key}"


@pytest.mark.parametrize("path", sorted(DATA.glob("*.merge_report.json")), ids=lambda p: p.name)
def test_a_recorded_report_reads_as_the_record_and_writes_back_the_same(path: Path) -> None:
    raw = path.read_bytes()
    report = read_report(raw, str(path))
    # the same values in the same order (a setting given as 0 through the API reads as 0.0)
    assert list(json.loads(dump_report(report))) == list(json.loads(raw))
    assert json.loads(dump_report(report)) == json.loads(raw)


@pytest.mark.parametrize(
    ("raw", "error", "said"),
    [
        (b"[1]", InputError, "expected a JSON object"),
        (b"{", InputError, "not valid JSON"),
        (b'{"format": "draftdata.forecast/1"}', FormatVersionError, "draftdata.merge-report"),
        (b'{"format": "draftdata.merge-report", "version": 1}', InputError, "merge's report"),
    ],
)
def test_a_file_that_is_not_a_merge_report_is_one_line(
    raw: bytes, error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=said) as info:
        read_report(raw, "x/merge_report.json")
    assert "\n" not in str(info.value) and "x/merge_report.json" in str(info.value)
