"""A run's forecast files (``store/forecast.py``): numbered create-only writes, the newest
read, and one-line refusals of files that are not forecasts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftdata.errors import DraftdataError, FormatVersionError, InputError
from draftdata.store.forecast import (
    FORECAST_FORMAT,
    DomainForecast,
    Forecast,
    forecast_keys,
    latest_forecast,
    read_forecast,
    write_forecast,
)
from draftdata.store.opener import open_store


def _fc(n: int) -> Forecast:
    return Forecast(by_domain={"code": DomainForecast(output_tokens=n)}, n=n)


def test_each_pilot_writes_the_next_file_and_the_newest_is_read(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "run"))
    assert latest_forecast(store) is None
    keys = [write_forecast(store, _fc(i)) for i in range(1, 12)]
    assert keys[:3] == ["forecast.json", "forecast-2.json", "forecast-3.json"]
    assert forecast_keys(store) == keys  # numeric order: forecast-10 after forecast-9
    found = latest_forecast(store)
    assert found is not None
    url, data = found
    assert url.endswith("forecast-11.json") and data.n == 11
    # nothing is replaced: the first is as written
    assert json.loads((tmp_path / "run" / "forecast.json").read_text())["n"] == 1
    assert read_forecast(str(tmp_path / "run"))[1].n == 11
    assert read_forecast(str(tmp_path / "run" / "forecast-2.json"))[1].n == 2


def test_a_concurrent_writer_taking_the_number_gets_the_next(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    write_forecast(store, _fc(1))
    (tmp_path / "forecast-2.json").write_text(json.dumps({"format": FORECAST_FORMAT}))  # another
    assert write_forecast(store, _fc(3)) == "forecast-3.json"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json at all", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"format": "draftdata.prepare_report/1"}', "this draftdata reads draftdata.forecast/1"),
        (b'{"messages": []}', "format None, this draftdata reads draftdata.forecast/1"),
        (b'{"format": "draftdata.forecast/1"}', "missing required field `by_domain`"),
        (b'{"format": "draftdata.forecast/1", "by_domain": {"code": 3}}', "at `$.by_domain[...]`"),
        (b'{"format": "draftdata.forecast/1", "by_domain": {}, "n": "two"}', "`$.n`"),
        (b"\xff\xfe\x00", "not valid JSON"),
    ],
)
def test_a_file_that_is_not_a_forecast_is_one_line(tmp_path: Path, body: bytes, says: str) -> None:
    path = tmp_path / "lengths.json"
    path.write_bytes(body)
    with pytest.raises(DraftdataError) as info:
        read_forecast(str(path))
    assert isinstance(info.value, InputError | FormatVersionError)
    message = str(info.value)
    assert says in message and "\n" not in message and str(path) in message
    assert "a pilot's forecast, written by draftdata generate --pilot" in message


def test_missing_files_and_runs_without_a_forecast(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or run folder"):
        read_forecast(str(tmp_path / "nope.json"))
    (tmp_path / "run").mkdir()
    with pytest.raises(InputError, match=r"no forecast\.json there; run a pilot first"):
        read_forecast(str(tmp_path / "run"))
