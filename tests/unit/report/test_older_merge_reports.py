"""``report`` and ``stats`` read ``merge_report.json`` through its typed record (``MergeReport``,
``read_any_report``), and stay tolerant of older merges' files: a key an older merge did not
write, or wrote in another shape, reads as its field's blank; what the file does hold is shown.

A generator over the recorded reports (``tests/unit/merge/data``): keys taken out and values
put in another shape at any depth (never ``format``). Before, both read the file as a plain dict
and a field of another shape (an input that is no object, token counts as a list) ended the
page with an AttributeError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.report.fixtures import merged_dir

from draftdata.report import build_report
from draftdata.report.collect import collect
from draftdata.stats.models import dataset_models
from draftdata.stats.readers import open_dataset
from draftdata.store.merge_report import MergeReport, read_any_report, read_report

RECORDED = sorted((Path(__file__).parents[1] / "merge" / "data").glob("*.merge_report.json"))
OTHER_SHAPES = [None, 1, 2.5, "x", [], [1, "a"], {}, {"a": "b"}, True]

Path_ = tuple[str | int, ...]


def _paths(doc: Any, at: Path_ = ()) -> list[Path_]:
    """Every key and list index inside ``doc``, parents before their children."""
    out: list[Path_] = []
    items: Any = ()
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    for k, v in items:
        out.append((*at, k))
        out += _paths(v, (*at, k))
    return out


def _apply(doc: Any, path: Path_, new: Any, drop: bool) -> bool:
    """Take out (``drop``) or replace the value at ``path``; False when it is gone already."""
    for k in path[:-1]:
        inside = isinstance(doc, list) and isinstance(k, int) and k < len(doc)
        if inside or (isinstance(doc, dict) and k in doc):
            doc = doc[k]
        else:
            return False
    last = path[-1]
    if isinstance(doc, dict) and last in doc:
        if drop:
            del doc[last]
        else:
            doc[last] = new
        return True
    if isinstance(doc, list) and isinstance(last, int) and last < len(doc):
        doc[last] = new  # an element is replaced, not taken out: indexes stay
        return True
    return False


@st.composite
def older_reports(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """(the recorded report, the report changed, the top-level keys whose values changed)."""
    recorded = json.loads(draw(st.sampled_from(RECORDED)).read_text())
    doc = json.loads(json.dumps(recorded))
    paths = [p for p in _paths(doc) if p != ("format",)]
    touched: set[str] = set()
    for path in draw(st.lists(st.sampled_from(paths), max_size=8, unique=True)):
        drop = draw(st.booleans())
        if _apply(doc, path, draw(st.sampled_from(OTHER_SHAPES)), drop):
            touched.add(str(path[0]))
    return recorded, doc, touched


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=older_reports())
def test_an_older_or_odd_merge_report_is_read_as_the_record_and_shown(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[dict[str, Any], dict[str, Any], set[str]]
) -> None:
    recorded, doc, touched = case
    root = tmp_path_factory.mktemp("older")
    merged = merged_dir(root / "merged", report=doc)
    part = collect([str(merged)]).merged[0]
    assert isinstance(part.report, MergeReport)
    strict = read_report(json.dumps(recorded).encode(), "recorded")
    got, want = msgspec.to_builtins(part.report), msgspec.to_builtins(strict)
    for key in set(want) - touched:  # what the file still holds reads as it was written
        assert got.get(key) == want[key], key
    build_report(merged, out=root / "r.html")  # the page is made, whatever is missing
    models = dataset_models(open_dataset(str(merged)))
    if "models" not in touched:
        assert models == (sorted(recorded["models"]) or None)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_a_whole_report_reads_the_same_through_both_readers(path: Path) -> None:
    raw = path.read_bytes()
    assert read_any_report(raw, str(path)) == read_report(raw, str(path))


def test_the_oldest_shape_reads_with_blanks(tmp_path: Path) -> None:
    """A report of only the first agreed keys (format, version, target, before, after,
    inputs, dropped): the rest are blanks, and the page shows its mix from the report."""
    doc = {
        "format": "draftdata.merge-report",
        "version": 1,
        "target": {"code": 0.5, "math": 0.5},
        "before": {"code": 10, "math": 10},
        "after": {"train": {"code": 4, "math": 4}, "eval": {"code": 1}},
        "inputs": [{"url": "existing"}],
        "dropped": {"duplicate": 2},
    }
    merged = merged_dir(tmp_path / "merged", report=doc)
    report = collect([str(merged)]).merged[0].report
    assert report is not None
    assert report.after.train == {"code": 4, "math": 4} and report.dropped == {"duplicate": 2}
    assert report.models == [] and report.tokens.before == {} and report.plan.unit == ""
    assert report.inputs[0].path == "" and report.jsonl_left_out is None
    page = build_report(merged, out=tmp_path / "r.html").read_text()
    assert "merge_report.json" in page
    assert dataset_models(open_dataset(str(merged))) is None
