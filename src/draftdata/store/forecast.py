"""A run's forecasts: ``forecast.json``, then ``forecast-2.json``, ``forecast-3.json``, ...

``generate --pilot`` writes one forecast per pilot command into the run (``generate/plan/pilot.py``
computes it). The store has no overwrite, so a second pilot of the same run does not replace
the first: it is written create-only under the next free number, and readers take the newest
(the highest number). ``forecast.json`` is the first, so a run with one pilot has the plain
name a user looks for.

A forecast is one typed record, ``Forecast`` (frozen msgspec Structs, as ``RunSettings`` is a
run's settings), written and read through ``formats.FORECAST``: the file's keys are the record's
fields in their declared order, so the file reads as it always has (``format:
draftdata.forecast/1``); a field a file lacks takes its default. ``read_forecast`` refuses
anything else with one line saying what the file is not (``prepare --lengths`` reads a forecast
through it).

This module names, writes, finds and reads forecast files; it computes nothing
(``generate/plan/forecast.py`` does).
"""

from __future__ import annotations

import os
import re

import msgspec

from draftdata.errors import AlreadyExistsError, InputError
from draftdata.shared.formats import FORECAST
from draftdata.store.base import Store
from draftdata.store.opener import open_store

FORECAST_FORMAT = FORECAST.format
FORECAST_KEY = FORECAST.name
_NUMBERED = re.compile(r"^forecast(?:-(\d+))?\.json$")


class EndpointRate(msgspec.Struct, kw_only=True, frozen=True):
    """What one endpoint did during the pilot (``generate/plan/saturation.py``)."""

    url: str = ""
    gpus: int = 1
    output_tokens_per_s: float | None = None  # while full; None: never full
    saturated_s: float = 0.0  # how long it was full
    request_lifetimes: float = 0.0  # that time in mean request lives
    mean_life_s: float = 0.0
    mean_concurrency: float | None = None
    per_sequence_tokens_per_s: float | None = None
    answers: int = 0
    measured: bool = False


class FleetRate(msgspec.Struct, kw_only=True, frozen=True):
    """The fleet's saturated rate the time forecast divides by, and what else the pilot timed."""

    output_tokens_per_s: float | None = None
    source: str | None = None  # "measured", or the earlier forecast it was taken from
    drain_s: float = 0.0  # the end of the run: about one request life
    overhead_s: float = 0.0  # the command's start-up and closing
    pilot_engine_s: float = 0.0
    pilot_tail_s: float = 0.0  # the pilot's own: from nothing queued to its last answer
    endpoints: list[EndpointRate] = msgspec.field(default_factory=list)


class PilotFigures(msgspec.Struct, kw_only=True, frozen=True):
    """The pilot a forecast was computed from."""

    spec: str | None = None  # --pilot as given
    seed: int | None = None
    prompts: int = 0
    completions: int = 0
    failures: int = 0
    strata: int = 0  # (source, domain) strata in scope
    wall_s: float | None = None


class DomainForecast(msgspec.Struct, kw_only=True, frozen=True):
    """One domain of a forecast: the pilot's measurement and the run's expected tokens."""

    prompts: int = 0  # in scope
    pilot_prompts: int = 0
    pilot_completions: int = 0
    pilot_failures: int = 0
    mean_output_tokens: float | None = None  # None: no pilot completion
    p90_output_tokens: float | None = None
    cut_share: float | None = None  # of the pilot's completions, cut at the limit
    failure_share: float | None = None
    output_tokens: int = 0  # the whole run's: committed plus the rest
    remaining_output_tokens: int = 0
    output_tokens_per_prompt: float | None = None
    share: float | None = None  # of the whole run's output tokens
    measured: bool = True  # the pilot has a completion of the domain
    mean_output_tokens_90: list[float] | None = None  # 90% intervals (None: none given)
    output_tokens_90: list[float] | None = None


class Forecast(msgspec.Struct, kw_only=True, frozen=True):
    """A pilot's forecast of its run (``generate/plan/forecast.py`` says how each figure is made).
    Output tokens are the rest of the run's unless named ``run_``; wall time and GPU-hours
    are the rest's, None when the fleet's rate was not measured; a ``_90`` is a 90% interval
    [low, high], None where none is given."""

    format: str = FORECAST_FORMAT
    created: str | None = None  # ISO time, UTC
    run_id: str | None = None
    pilot: PilotFigures = msgspec.field(default_factory=PilotFigures)
    n: int = 1
    max_tokens: int | None = None
    prompts: int = 0  # in scope
    remaining_prompts: int = 0
    remaining_pairs: int = 0
    committed_output_tokens: int = 0  # what the run held when the forecast was made
    committed_active_s: float = 0.0
    output_tokens: int = 0
    output_tokens_90: list[float] | None = None
    run_output_tokens: int = 0
    run_output_tokens_90: list[float] | None = None
    endpoints: int = 0
    gpus: int = 0
    wall_s: float | None = None
    wall_s_90: list[float] | None = None
    gpu_hours: float | None = None
    gpu_hours_90: list[float] | None = None
    throughput: FleetRate | None = None
    by_domain: dict[str, DomainForecast]  # "(none)" is the empty domain
    warnings: list[str] = msgspec.field(default_factory=list)


def forecast_keys(store: Store) -> list[str]:
    """The run's forecast keys, oldest first (``forecast.json`` is number 1)."""
    found = [(k, _NUMBERED.match(k)) for k in store.list("forecast")]
    numbered = [(int(m.group(1) or 1), k) for k, m in found if m is not None]
    return [k for _, k in sorted(numbered)]


def write_forecast(store: Store, forecast: Forecast) -> str:
    """Write ``forecast`` as the run's next forecast (create-only); return its key."""
    body = FORECAST.dump(forecast)
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


def _decode(raw: bytes, where: str) -> Forecast:
    return FORECAST.read(raw, where, Forecast)


def latest_forecast(store: Store) -> tuple[str, Forecast] | None:
    """The newest forecast of the run in ``store`` as (url, data); None when it has none."""
    keys = forecast_keys(store)
    if not keys:
        return None
    key = keys[-1]
    return store.key_url(key), _decode(store.read(key), store.key_url(key))


def read_forecast(location: str) -> tuple[str, Forecast]:
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
