"""The report's figures, drawn with matplotlib's Agg backend into PNG bytes.

Every function takes plain numbers (already computed by ``collect.py``) and returns a ``Plot``,
or None when there is nothing to draw (the page then says so in words instead of showing an
empty chart). Figures are built with ``matplotlib.figure.Figure`` directly, never pyplot, so no
global state or GUI backend is involved.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3"]
_DPI = 100


@dataclass(frozen=True)
class Plot:
    """One figure: a stable id (the ``<img>`` id), a title, a caption and the PNG bytes."""

    id: str
    title: str
    png: bytes
    caption: str = ""


def _figure(width: float = 7.5, height: float = 3.6, left_in: float = 0.75) -> Figure:
    """A figure with fixed margins (inches): a layout engine would draw everything twice."""
    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(
        left=left_in / width, right=1 - 0.2 / width, bottom=0.75 / height, top=1 - 0.45 / height
    )
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def _short(label: str, n: int = 40) -> str:
    text = label if len(label) <= n else "…" + label[-(n - 1) :]
    # matplotlib hides legend labels that start with "_"
    return " " + text if text.startswith("_") else text


def grouped_bars(
    pid: str,
    title: str,
    series: Mapping[str, Mapping[str, float]],
    ylabel: str,
    caption: str = "",
    percent: bool = False,
) -> Plot | None:
    """Bars per category (x) for each named series (one colour each)."""
    cats: list[str] = []
    for values in series.values():
        for c in values:
            if c not in cats:
                cats.append(c)
    if not cats or not series:
        return None
    fig = _figure(max(6.0, 1.1 * len(cats) * max(1, len(series)) ** 0.5 + 2), 3.8)
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cats))]
        ys = [float(values.get(c, 0.0)) * (100 if percent else 1) for c in cats]
        bars = ax.bar(xs, ys, width, label=_short(name), color=_COLOURS[i % len(_COLOURS)])
        if len(cats) * len(series) <= 24:
            fmt = "%.0f%%" if percent else "%g"
            ax.bar_label(bars, fmt=fmt, fontsize=7, padding=1)
    ax.set_xticks(range(len(cats)), cats)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return Plot(pid, title, _png(fig), caption)


def hbars(
    pid: str, title: str, values: Mapping[str, float], xlabel: str, caption: str = ""
) -> Plot | None:
    """Horizontal bars, largest at the top."""
    items = sorted(values.items(), key=lambda kv: kv[1])
    if not items:
        return None
    longest = max(len(_short(k)) for k, _ in items)
    fig = _figure(7.0, max(2.2, 0.45 * len(items) + 1.2), left_in=0.3 + 0.075 * longest)
    ax = fig.add_subplot()
    bars = ax.barh([_short(k) for k, _ in items], [v for _, v in items], color=_COLOURS[0])
    ax.bar_label(bars, fmt="%g", fontsize=8, padding=2)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.spines[["top", "right"]].set_visible(False)
    return Plot(pid, title, _png(fig), caption)


def length_boxes(
    pid: str, title: str, summaries: Mapping[str, Mapping[str, Any]], ylabel: str, caption: str = ""
) -> Plot | None:
    """Box plots from percentile summaries: box p25-p75, line p50, whiskers p5-p95, dot mean."""
    stats = []
    for name, s in summaries.items():
        if not s.get("count"):
            continue
        stats.append(
            {
                "label": f"{name}\n(n={s['count']:,})",
                "whislo": s["p5"],
                "q1": s["p25"],
                "med": s["p50"],
                "q3": s["p75"],
                "whishi": s["p95"],
                "mean": s["mean"],
                "fliers": [],
            }
        )
    if not stats:
        return None
    fig = _figure(max(6.0, 1.2 * len(stats) + 2), 3.8)
    ax = fig.add_subplot()
    ax.bxp(stats, showmeans=True, showfliers=False, patch_artist=True)
    for patch in ax.patches:
        patch.set_facecolor("#c7d5ea")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.spines[["top", "right"]].set_visible(False)
    return Plot(pid, title, _png(fig), caption)


def lines(
    pid: str,
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    xlabel: str,
    ylabel: str,
    caption: str = "",
    gaps: Sequence[tuple[float, float]] = (),
) -> Plot | None:
    """One line per series of (x, y) points; ``gaps`` (x0, x1) are shaded grey."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig = _figure(7.5, 3.8)
    ax = fig.add_subplot()
    for i, (name, points) in enumerate(series.items()):
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        ax.plot(xs, ys, marker="o", markersize=3, label=_short(name), color=_COLOURS[i % 7])
    for k, (x0, x1) in enumerate(gaps):
        ax.axvspan(
            x0, x1, color="#999999", alpha=0.25, label="gap between segments" if not k else None
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return Plot(pid, title, _png(fig), caption)
