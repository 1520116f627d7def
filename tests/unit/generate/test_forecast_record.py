"""The forecast as a typed record (``store/forecast.py``): the file it writes is the file the
dict-building code wrote (``data/forecast-*.json`` and the printed lines were captured from it,
commit df87645), a file of that code reads back field for field, and any pilot's forecast
survives its own file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.generate.plan.forecast import Outcome, forecast, forecast_lines
from draftdata.generate.plan.pilot_sample import PilotSample, PilotSpec
from draftdata.generate.plan.saturation import Throughput
from draftdata.shared.formats import FORECAST
from draftdata.store.forecast import Forecast, read_forecast, write_forecast
from draftdata.store.opener import open_store

from .forecast_cases import CASES

DATA = Path(__file__).parent / "data"
CREATED = "2026-12-07T06:30:00+00:00"  # the captured files' time


def _computed(name: str) -> Forecast:
    kw = CASES[name]()
    args = (kw.pop("sample"), kw.pop("outcome"), kw.pop("left"), kw.pop("left_prompts"))
    return msgspec.structs.replace(forecast(*args, **kw), created=CREATED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_file_and_the_lines_are_the_ones_written_before(name: str, tmp_path: Path) -> None:
    fc = _computed(name)
    store = open_store(str(tmp_path))
    key = write_forecast(store, fc)
    assert store.read(key) == (DATA / f"forecast-{name}.json").read_bytes()
    shown = "\n".join(forecast_lines(fc, "run/forecast.json")) + "\n"
    assert shown == (DATA / f"forecast-{name}.lines.txt").read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_file_written_before_reads_field_for_field(name: str) -> None:
    path = DATA / f"forecast-{name}.json"
    url, fc = read_forecast(str(path))
    assert url.endswith(path.name)
    assert fc == _computed(name)
    old: dict[str, Any] = json.loads(path.read_bytes())
    assert msgspec.to_builtins(fc) == old  # every key, every value, in the file's order
    assert list(msgspec.to_builtins(fc)) == list(old)
    assert FORECAST.dump(fc) == path.read_bytes()


_domains = st.sampled_from(["", "code", "math", "tool"])
_sources = st.sampled_from(["", "a", "b"])


@st.composite
def _pilots(draw: st.DrawFn) -> dict[str, Any]:
    strata = draw(st.dictionaries(st.tuples(_sources, _domains), st.integers(1, 500), max_size=6))
    out = Outcome()
    drawn: dict[tuple[str, str], list[str]] = {}
    left: dict[tuple[str, str], int] = {}
    for i, (s, k) in enumerate(sorted(strata.items())):
        took = draw(st.integers(0, min(k, 40)))
        drawn[s] = [f"{i}-{j}" for j in range(took)]
        for _ in range(took):
            if draw(st.booleans()) or not took:
                out.fail(s)
            else:
                out.add(s, draw(st.integers(1, 5000)), draw(st.booleans()), draw(st.booleans()))
        left[s] = k - took
    if out.completions and out.estimated == out.completions:
        out.estimated = 0  # refused (test_forecast.py): not a forecast
    rate = draw(st.none() | st.floats(1.0, 1e5))
    tp = draw(st.none() | st.just(Throughput(rate, [], 3.0, 1.5, 20.0, ["a problem"])))
    ids = frozenset(i for v in drawn.values() for i in v)
    return {
        "sample": PilotSample(PilotSpec(count=len(ids) or 1), draw(st.integers(0, 9)), ids,
                              strata, drawn),
        "outcome": out,
        "left": left,
        "left_prompts": left,
        "committed": draw(st.dictionaries(_domains, st.integers(0, 10**6), max_size=3)),
        "committed_active_s": draw(st.floats(0, 1e4)),
        "throughput": tp,
        "gpus": draw(st.integers(1, 16)),
        "endpoints": 2,
        "n": draw(st.integers(1, 4)),
    }  # fmt: skip


_FULL = json.loads((DATA / "forecast-full.json").read_bytes())


@settings(max_examples=60, deadline=None)
@given(_pilots())
def test_any_forecast_reads_back_from_its_file_with_the_files_keys(kw: dict[str, Any]) -> None:
    args = (kw.pop("sample"), kw.pop("outcome"), kw.pop("left"), kw.pop("left_prompts"))
    fc = forecast(*args, **kw)
    raw = FORECAST.dump(fc)
    assert FORECAST.read(raw, "forecast.json", Forecast) == fc
    doc = json.loads(raw)
    assert list(doc) == list(_FULL)  # the keys the file has always had, in their order
    for row in doc["by_domain"].values():
        assert list(row) == list(_FULL["by_domain"]["code"])
    if doc["throughput"] is not None:
        assert list(doc["throughput"]) == list(_FULL["throughput"])
