"""A run's forecasts: ``forecast.json``, then ``forecast-2.json``, ``forecast-3.json``, ...

``generate --pilot`` writes one forecast per pilot command into the run (``generate/pilot.py``
computes it). The store has no overwrite, so a second pilot of the same run does not replace
the first: it is written create-only under the next free number, and readers take the newest
(the highest number). ``forecast.json`` is the first, so a run with one pilot has the plain
name a user looks for.

This module names, writes, finds and checks forecast files; it computes nothing. A forecast is
JSON with ``format: draftdata.forecast/1``; ``read_forecast`` refuses anything else with one
line saying what the file is not (``prepare --lengths`` reads a forecast through it).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from draftdata.errors import AlreadyExistsError, FormatVersionError, InputError
from draftdata.store.base import Store
from draftdata.store.opener import open_store

FORECAST_FORMAT = "draftdata.forecast/1"
FORECAST_KEY = "forecast.json"
_NUMBERED = re.compile(r"^forecast(?:-(\d+))?\.json$")


def forecast_keys(store: Store) -> list[str]:
    """The run's forecast keys, oldest first (``forecast.json`` is number 1)."""
    found = [(k, _NUMBERED.match(k)) for k in store.list("forecast")]
    numbered = [(int(m.group(1) or 1), k) for k, m in found if m is not None]
    return [k for _, k in sorted(numbered)]


def write_forecast(store: Store, data: dict[str, Any]) -> str:
    """Write ``data`` as the run's next forecast (create-only); return its key."""
    body = (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode()
    keys = forecast_keys(store)
    n = len(keys) + 1
    for _ in range(100):  # a concurrent pilot took the number: take the next one
        key = FORECAST_KEY if n == 1 else f"forecast-{n}.json"
        try:
            store.put_new(key, body)
        except AlreadyExistsError:
            n += 1
            continue
        return key
    raise AlreadyExistsError(f"{store.url}: could not find a free forecast name")


def check_forecast(data: Any, where: str) -> dict[str, Any]:
    """``data`` if it is a forecast this draftdata reads; else a one-line error naming it."""
    if not isinstance(data, dict) or "format" not in data:
        raise InputError(
            f"{where}: not a forecast (a JSON object with format {FORECAST_FORMAT!r}, written by "
            "`draftdata generate --pilot`); give a run's forecast.json"
        )
    if data["format"] != FORECAST_FORMAT:
        raise FormatVersionError(
            f"{where}: format {data['format']!r}, not a forecast this draftdata reads "
            f"({FORECAST_FORMAT}); give a forecast.json written by `generate --pilot`"
        )
    if not isinstance(data.get("by_domain"), dict):
        raise InputError(f"{where}: forecast without by_domain; it is damaged, rerun the pilot")
    return data


def _decode(raw: bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InputError(
            f"{where}: not JSON, so not a forecast; give the forecast.json a pilot wrote "
            "(`draftdata generate --pilot`)"
        ) from None
    return check_forecast(data, where)


def latest_forecast(store: Store) -> tuple[str, dict[str, Any]] | None:
    """The newest forecast of the run in ``store`` as (url, data); None when it has none."""
    keys = forecast_keys(store)
    if not keys:
        return None
    key = keys[-1]
    return store.key_url(key), _decode(store.read(key), store.key_url(key))


def read_forecast(location: str) -> tuple[str, dict[str, Any]]:
    """A forecast from ``location``: a forecast file (local or s3://) or a run (its newest
    forecast). InputError (one line) when there is none or the file is no forecast."""
    base = location.rstrip("/")
    parent, _, name = base.rpartition("/")
    is_file = os.path.isfile(base) if "://" not in base else name.endswith(".json")
    if is_file:
        store = open_store(parent or ".")
        if not store.exists(name):
            raise InputError(f"{location}: no such file")
        return store.key_url(name), _decode(store.read(name), location)
    if "://" not in base and not os.path.isdir(base):
        raise InputError(f"{location}: no such file or run folder")
    found = latest_forecast(open_store(base))
    if found is None:
        raise InputError(
            f"{location}: no forecast.json there; run a pilot first "
            "(`draftdata generate ... --pilot 0.01`) or give the forecast file"
        )
    return found
