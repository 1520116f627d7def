"""The report's "Forecast against actual" section: a pilot's forecast beside what the run did.

A run that had a pilot (``generate --pilot``) holds a forecast (``store/forecast.py``); the
report shows the newest. Once the run is finished (every prompt in the forecast's scope settled)
it compares: the rest of the run's output tokens, wall time and GPU-hours (the run's figures
less what it held when the forecast was made), the whole run's output tokens, and per domain
the mean output length, the share cut at the limit and the token mix. Before that it shows
the forecast alone and says how far the run is. It reads the collected figures; it computes no
statistics of its own.
"""

from __future__ import annotations

from typing import Any

from draftdata.report import page
from draftdata.report.collect import ReportData, RunPart
from draftdata.store.forecast import Forecast

TITLE = "Forecast against actual"
DOMAIN_HEADER = [
    "domain",
    "prompts",
    "mean out (forecast)",
    "mean out (actual)",
    "cut (forecast)",
    "cut (actual)",
    "run tokens (forecast)",
    "run tokens (actual)",
    "token share (forecast)",
    "token share (actual)",
]


def _ratio(forecast: Any, actual: float) -> str:
    if not isinstance(forecast, int | float) or not actual:
        return "-"
    return f"{forecast / actual:.3f}"


def _iv(iv: Any, digits: int = 0) -> str:
    if not iv:
        return "-"
    return f"{iv[0]:,.{digits}f} - {iv[1]:,.{digits}f}"


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{100 * x:.1f}%"


def _num(x: Any, digits: int = 0) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:,.{digits}f}"


def _totals(r: RunPart, fc: Forecast, done: bool) -> list[list[Any]]:
    f = r.figures or {}
    rest_tokens = int(f.get("output_tokens", 0)) - fc.committed_output_tokens
    rest_wall = float(f.get("active_s", 0.0)) - fc.committed_active_s
    gpus = fc.gpus
    rows: list[list[Any]] = [
        [
            "output tokens, the rest of the run",
            _num(fc.output_tokens),
            _iv(fc.output_tokens_90),
            _num(rest_tokens) if done else "-",
            _ratio(fc.output_tokens, rest_tokens) if done else "-",
        ],
        [
            "output tokens, the whole run",
            _num(fc.run_output_tokens),
            _iv(fc.run_output_tokens_90),
            _num(f.get("output_tokens")) if done else "-",
            _ratio(fc.run_output_tokens, float(f.get("output_tokens", 0))) if done else "-",
        ],
        [
            "wall seconds, the rest (active time)",
            _num(fc.wall_s, 1),
            _iv(fc.wall_s_90, 1),
            _num(rest_wall, 1) if done and rest_wall > 0 else "-",
            _ratio(fc.wall_s, rest_wall) if done and rest_wall > 0 else "-",
        ],
        [
            f"GPU-hours, the rest ({gpus} GPUs)",
            _num(fc.gpu_hours, 3),
            _iv(fc.gpu_hours_90, 3),
            _num(gpus * rest_wall / 3600, 3) if done and rest_wall > 0 else "-",
            _ratio(fc.gpu_hours, gpus * rest_wall / 3600) if done and rest_wall > 0 else "-",
        ],
    ]
    return rows


def _domains(r: RunPart, fc: Forecast, done: bool) -> list[list[Any]]:
    f = r.figures or {}
    actual = f.get("domains") or {}
    total = float(f.get("output_tokens", 0)) or 0.0
    rows = []
    for name, d in fc.by_domain.items():
        a = actual.get("" if name == "(none)" else name) or {}
        comp = int(a.get("completions", 0))
        tokens = int(a.get("output_tokens", 0))
        mean = tokens / comp if comp else None
        rows.append(
            [
                name,
                _num(d.prompts),
                _num(d.mean_output_tokens, 1),
                _num(mean, 1) if done else "-",
                _pct(d.cut_share),
                _pct(int(a.get("cut", 0)) / comp) if done and comp else "-",
                _num(d.output_tokens),
                _num(tokens) if done else "-",
                _pct(d.share),
                _pct(tokens / total) if done and total else "-",
            ]
        )
    return rows


def forecast_section(data: ReportData) -> page.Section:
    """The section (a note when no run in the inputs had a pilot)."""
    runs = [r for r in data.runs if r.forecast is not None]
    if not runs:
        return page.Section(TITLE, note="no pilot forecast in the run (generate --pilot)")
    tables = []
    notes = []
    for r in runs:
        fc = r.forecast
        if fc is None:
            continue
        f = r.figures or {}
        settled = int(f.get("prompts", 0))
        scope = fc.prompts
        done = bool(f) and settled >= scope
        p = fc.pilot
        caption = (
            f"{r.forecast_url}: pilot of {p.prompts:,} prompts ({p.spec}, seed {p.seed}) "
            f"of {scope:,}"
        )
        if not done:
            notes.append(
                f"{r.url}: the run is not finished ({settled:,} of {scope:,} prompts settled); "
                "the actual figures come when it is"
            )
        tables.append(
            page.table(
                ["figure", "forecast", "90% interval", "actual", "forecast / actual"],
                _totals(r, fc, done),
                caption,
            )
        )
        tables.append(page.table(DOMAIN_HEADER, _domains(r, fc, done)))
    return page.Section(TITLE, note="; ".join(notes), tables=tables)
