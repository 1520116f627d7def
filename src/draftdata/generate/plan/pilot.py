"""``generate --pilot``: run a stratified sample into the run, then forecast the whole run.

A pilot answers a small sample of the run's prompts (``pilot_sample.py``) on the real fleet before
the whole fleet is booked, watching how full the endpoints ran (``saturation.py``), and then
forecasts the rest (``forecast.py``). Its completions go into the run itself: committed like any
others, they count, and the same command without ``--pilot`` resumes the whole run and skips
them. ``--pilot`` is not a setting of the run (the manifest's hash does not see it, as it does
not see ``--limit``), so the full command never refuses the run as started "with other
settings".

The forecast is written into the run through its store, create-only (``store/forecast.py``):
``forecast.json`` the first time, ``forecast-2.json``... for later pilots; readers take the
newest. A second pilot with the same size and seed draws the same sample: it finishes an
interrupted one, or, when the sample is all answered, recomputes the forecast from it (with
the throughput of the newest earlier forecast when this command ran too little to measure one).
A larger size or another ``--pilot-seed`` adds new prompts to the sample.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from draftdata.errors import ConfigError, InputError
from draftdata.generate.config import GenerateConfig, validate
from draftdata.generate.engine.loop import Log, stderr_log
from draftdata.generate.plan.forecast import (
    forecast,
    forecast_lines,
    gpu_count,
    pilot_outcome,
    remaining_pairs,
)
from draftdata.generate.plan.pilot_sample import PilotSample, PilotSpec, draw
from draftdata.generate.plan.saturation import Saturation, Throughput
from draftdata.generate.prompts.partition import parse_partition
from draftdata.generate.prompts.source import prompt_files
from draftdata.generate.stage import generate
from draftdata.generate.summary import GenerateSummary
from draftdata.shared.endpoints import base_url
from draftdata.shared.fleetspec import read_fleet
from draftdata.stats.runfigures import run_figures
from draftdata.store.forecast import Forecast, latest_forecast, write_forecast
from draftdata.store.opener import open_store
from draftdata.support.redact import redact_url


@dataclass
class PilotResult:
    """The pilot command's summary, its sample, and the forecast (None when interrupted)."""

    summary: GenerateSummary
    sample: PilotSample
    forecast: Forecast | None = None
    forecast_url: str | None = None

    def lines(self) -> list[str]:
        """The forecast as printed (nothing when the pilot was interrupted)."""
        if self.forecast is None:
            return []
        return forecast_lines(self.forecast, self.forecast_url)

    def forecast_json(self) -> dict[str, Any] | None:
        """The forecast as ``forecast.json`` holds it (None when the pilot was interrupted)."""
        return None if self.forecast is None else msgspec.to_builtins(self.forecast)


def fleet_gpus(config: GenerateConfig) -> dict[str, int]:
    """Endpoint URL -> its GPUs (fleet.yaml's ``gpu``: "0,1" is two; else one each). The URL
    in the form the engine's endpoints carry and forecasts record: a password masked."""
    if config.fleet is None:
        return {redact_url(base_url(u)): 1 for u in config.endpoints}

    eps = read_fleet(config.fleet).endpoints
    counts = gpu_count(e.gpu for e in eps)
    return {redact_url(base_url(e.url)): g for e, g in zip(eps, counts, strict=True)}


def run_pilot(
    config: GenerateConfig,
    spec: PilotSpec,
    *,
    seed: int = 0,
    log: Log | None = None,
    live: bool | None = None,
    handle_signals: bool = True,
) -> PilotResult:
    """Draw the sample, run it into ``config.out``, write and return the forecast.

    Raises what ``generate`` raises; an empty scope is an InputError. When the pilot is
    interrupted the result has no forecast (the same command resumes the pilot).
    """
    if spec.count is None and spec.fraction is None:
        raise ConfigError("--pilot: give a fraction or a count")
    config = validate(config)
    emit = log or stderr_log
    files = prompt_files(config.prompts)
    part = parse_partition(config.partition) if config.partition else None
    t0 = time.monotonic()
    sample = draw(files, spec, seed=seed, limit=config.limit, partition=part)
    if not sample.ids:
        raise InputError(f"--pilot: {config.prompts} holds no prompt in scope to draw a pilot from")
    emit(
        f"generate: pilot of {len(sample.ids):,} of {sample.in_scope:,} prompts "
        f"({len(sample.strata)} source/domain strata, seed {seed}; drawn in "
        f"{time.monotonic() - t0:.1f} s)"
    )
    gpus = fleet_gpus(config)
    watch = Saturation()
    summary = generate(
        # every server full while work is queued, the slow ones too, and every request answered
        # where it started: the rates are measured from whole requests (saturation.py)
        msgspec.structs.replace(config, tail_plan=False, hedge=False),
        log=log,
        live=live,
        handle_signals=handle_signals,
        on_engine=lambda engine: watch.attach(engine, gpus),
        only=sample.ids,
    )
    finished = watch.clock()
    result = PilotResult(summary=summary, sample=sample)
    if summary.interrupted:
        return result
    measured = watch.result(finished)
    store = open_store(config.out, protect=config.protect)
    throughput = _with_earlier(store, measured, sorted(gpus))
    outcome = pilot_outcome(store, sample)
    left, left_prompts = remaining_pairs(
        store, files, n=config.n, limit=config.limit, partition=part,
        retry_failed=config.retry_failed,
    )  # fmt: skip
    figures = summary.run
    if figures is None:
        figures = run_figures(store)
    data = forecast(
        sample,
        outcome,
        left,
        left_prompts,
        committed={d: f.output_tokens for d, f in figures.domains.items()},
        committed_active_s=figures.active_s,
        throughput=throughput,
        gpus=sum(gpus.values()) or len(gpus),
        endpoints=len(gpus),
        n=config.n,
        max_tokens=config.max_tokens,
        run_id=summary.run_id,
        pilot_wall_s=summary.wall_s,
    )
    key = write_forecast(store, data)
    result.forecast, result.forecast_url = data, store.key_url(key)
    return result


def _with_earlier(store: Any, measured: Throughput, urls: list[str]) -> Throughput:
    """``measured``, or, when it measured no rate, the newest earlier forecast's rate for the
    same endpoints (this command's own overhead kept)."""
    if measured.output_tokens_per_s is not None:
        return measured
    try:
        found = latest_forecast(store)
    except InputError:
        found = None
    if found is None:
        return measured
    url, data = found
    earlier = data.throughput
    if earlier is None or earlier.output_tokens_per_s is None:
        return measured
    if sorted(e.url for e in earlier.endpoints) != urls:
        return measured
    return Throughput(
        output_tokens_per_s=earlier.output_tokens_per_s,
        endpoints=[msgspec.to_builtins(e) for e in earlier.endpoints],
        drain_s=earlier.drain_s,
        overhead_s=measured.overhead_s,
        engine_s=measured.engine_s,
        problems=[
            f"the fleet's rate is the one measured by {url} (this pilot ran too little to "
            "measure it)"
        ],
        source=url,
    )
