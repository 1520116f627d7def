"""A file that is not a dataset (a prepare config, a log, JSON of another shape) is refused in
one line by ``stats``, as by ``report`` and ``merge``: never an empty table and exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.cli import main
from draftdata.errors import InputError
from draftdata.stats import compute_stats

ROOT = Path(__file__).resolve().parents[3]

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
_lines = st.one_of(
    st.text(max_size=40).map(lambda t: t.replace("\n", " ")),  # yaml, logs, prose
    _json_values.map(json.dumps),  # JSON that is no conversation (or is one)
    st.binary(max_size=40).map(lambda b: b.decode("latin-1").replace("\n", " ")),
)


@pytest.mark.parametrize("name", ["quickstart.yaml", "expansion.yaml"])
def test_a_prepare_config_is_refused_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ROOT / "examples" / name
    with pytest.raises(SystemExit) as exit_:
        main(["stats", str(config)])
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "not a dataset" in lines[0], err


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(_lines, min_size=1, max_size=12), ext=st.sampled_from(["jsonl", "yaml"]))
def test_any_file_is_read_or_refused_never_silently_empty(
    lines: list[str], ext: str, tmp_path: Path
) -> None:
    path = tmp_path / f"data.{ext}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        stats = compute_stats(str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    assert stats.rows > 0 or stats["rejected"]["count"] == 0, stats["rejected"]
