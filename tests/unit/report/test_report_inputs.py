"""report's inputs: a saved `stats --json`, either order of run and merge output, symlinked
folders, and the one-line refusals (a JSON file of another kind, nothing readable, --out DIR)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.unit.report.fixtures import merged_dir
from tests.unit.stats import builders as b

from draftdata.cli import main
from draftdata.errors import InputError
from draftdata.report import build_report
from draftdata.report.build import _mix_series
from draftdata.report.collect import collect
from draftdata.report.find import find_parts
from draftdata.stats import compute_stats

EXISTING_REPORT = {
    "format": "draftdata.merge-report",
    "version": 1,
    "target": {"code": 0.35, "math": 0.35, "general": 0.3},
    "before": {"code": 80, "math": 12, "general": 8},
    "after": {"train": {"code": 3, "math": 3, "general": 2}, "eval": {"code": 1}},
    "inputs": [
        {"path": "live/", "role": "existing", "by_domain": {"code": 77, "math": 8, "general": 15}},
        {"path": "run/", "role": "add", "by_domain": {"code": 3, "math": 4, "general": 1}},
    ],
    "dropped": {},
}


def test_stats_json_is_a_valid_input_to_compare(tmp_path: Path) -> None:
    live = b.write_jsonl(tmp_path / "live.jsonl", b.specforge_rows())
    saved = tmp_path / "before.json"
    saved.write_text(json.dumps(compute_stats(str(live))))
    merged = merged_dir(tmp_path / "merged", EXISTING_REPORT)
    data = collect([str(merged), str(saved)])
    assert [u for u, _ in data.compare] == [str(saved)]
    assert data.compare[0][1].rows == compute_stats(str(live)).rows
    series, _ = _mix_series(data)
    assert list(series) == [
        "before.json (conversations)",
        "existing set (merge input)",
        "added (merge input)",
        "before (merge inputs)",
        "target",
        "after: train",
        "after: eval",
    ]
    assert series["existing set (merge input)"]["code"] == pytest.approx(0.77)
    # as the subject, too
    alone = collect([str(saved)])
    assert [u for u, _ in alone.datasets] == [str(saved)] and alone.headline()["rows"] > 0
    # several datasets saved by one `stats --json A B` come as a list
    saved.write_text(json.dumps([compute_stats(str(live)), compute_stats(str(live))]))
    assert len(collect([str(merged), str(saved)]).compare) == 2


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI as the console script does; it must exit 1 with one line on stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_other_json_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    merged = merged_dir(tmp_path / "merged", EXISTING_REPORT)
    other = tmp_path / "prepare_report.json"
    other.write_text(json.dumps({"format": "draftdata.prepare_report/1", "sources": []}))
    with pytest.raises(InputError, match=r"a draftdata.prepare_report/1 file, not a dataset"):
        collect([str(merged), str(other)])
    junk = b.write_jsonl(tmp_path / "junk.jsonl", [{"nothing": i} for i in range(5)])
    with pytest.raises(InputError) as err:
        collect([str(merged), str(junk)])
    assert "no readable rows (5 rejected" in str(err.value) and "\n" not in str(err.value)
    _one_line_error(["report", str(merged), "--compare", str(other)], capsys)


@pytest.mark.parametrize("order", ["run first", "merge first"])
def test_run_and_merge_output_in_either_order_show_everything(tmp_path: Path, order: str) -> None:
    run = b.run_dir(tmp_path / "run")
    merged = merged_dir(tmp_path / "merged", EXISTING_REPORT)
    inputs = [str(run), str(merged)] if order == "run first" else [str(merged), str(run)]
    data = collect(inputs)
    assert [r.url for r in data.runs] == [str(run)]
    assert [m.url for m in data.merged] == [str(merged)]
    series, how = _mix_series(data)
    assert "target" in series and "after: train" in series and "merge_report.json" in how
    assert data.throughput() and data.headline()["completions"] == compute_stats(str(run)).rows


def test_symlinked_folders_are_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    b.run_dir(real / "runs" / "v1")
    merged_dir(real / "merged", EXISTING_REPORT)
    top = tmp_path / "top"
    top.mkdir()
    os.symlink(real / "runs" / "v1", top / "latest")
    os.symlink(real / "merged", top / "train_v2")
    os.symlink(top, top / "loop")  # a link loop ends
    parts = find_parts(str(top))
    assert parts.runs == (str(top / "latest"),)
    assert parts.merged == (str(top / "train_v2"),)


def test_out_an_existing_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    merged = merged_dir(tmp_path / "merged", EXISTING_REPORT)
    with pytest.raises(InputError, match="is a folder; give a file name"):
        build_report(merged, out=tmp_path)
    _one_line_error(["report", str(merged), "--out", str(tmp_path)], capsys)
