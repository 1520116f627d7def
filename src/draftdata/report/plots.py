"""The report's figures, drawn with matplotlib's Agg backend into PNG bytes.

Every function takes plain numbers (already computed by ``collect.py``) and returns a ``Plot``,
or None when there is nothing to draw (the page then says so in words instead of showing an
empty chart). Figures are built with ``matplotlib.figure.Figure`` directly, never pyplot, so no
global state or GUI backend is involved.

Sized for the widths a reader sees the page at. Every figure is ``WIDTH`` inches wide whatever
it holds (bars get thinner, never the figure wider), so a browser never shrinks one more than
another; text is ``FONT`` points (about 17 px in the PNG), so a figure shown at half size on a
390 px phone still has 9 px text. Legends are not drawn into the PNG: ``Plot.legend`` holds
(label, colour) pairs that the page writes as HTML under the figure, readable and wrapping at
any width. Numbers carry thousands separators (``65,293``). The PNG is cut around what was drawn
(``bbox_inches="tight"``), so no label is clipped at its edge. A ``Palette`` shared by a page's
charts gives each named series one colour in all of them (the row mix and the token mix draw
``target`` alike, whichever series each chart has).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter

_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3"]
_GAP_COLOUR = "#bfbfbf"
_DPI = 100
WIDTH = 6.4  # inches (640 px): the width of every figure
FONT = 12.0  # points: the size of every text in a figure
MAX_BAR_LABELS = 8  # more bars than this: no value labels (the table under the chart has them)


@dataclass(frozen=True)
class Plot:
    """One figure: a stable id (the ``<img>`` id), a title, a caption and the PNG bytes.

    ``legend`` is (label, colour) per series, shown by the page in HTML; ``text_px`` the size
    of the smallest text in the PNG, in its pixels; ``texts`` every text drawn (axis and bar
    labels, title), so what a figure says can be checked without reading pixels.
    """

    id: str
    title: str
    png: bytes
    caption: str = ""
    legend: tuple[tuple[str, str], ...] = ()
    text_px: float = 0.0
    texts: tuple[str, ...] = ()


class Palette:
    """One colour per series name, the same in every chart that draws with it: a name takes
    the next colour the first time it is asked for."""

    def __init__(self) -> None:
        self.colours: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self.colours:
            self.colours[name] = _COLOURS[len(self.colours) % len(_COLOURS)]
        return self.colours[name]


def number(value: float) -> str:
    """A count with thousands separators (``65,293``); one decimal when it has a fraction."""
    v = float(value)
    return f"{v:,.0f}" if v.is_integer() or abs(v) >= 100 else f"{v:,.1f}"


def _figure(width: float = WIDTH, height: float = 3.6, left_in: float = 0.75) -> Figure:
    """A figure with fixed margins (inches): a layout engine would draw everything twice; the
    tight bounding box at save time takes in whatever reaches past them."""
    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(
        left=left_in / width, right=1 - 0.2 / width, bottom=0.75 / height, top=1 - 0.45 / height
    )
    return fig


def _axes(fig: Figure, title: str, xlabel: str = "", ylabel: str = "") -> Any:
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=FONT + 1)
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=FONT)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.spines[["top", "right"]].set_visible(False)
    return ax


def _counts_axis(axis: Any, percent: bool = False) -> None:
    if percent:
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}%"))
    else:
        axis.set_major_formatter(FuncFormatter(lambda v, _: number(v)))


def _plot(
    pid: str,
    title: str,
    fig: Figure,
    caption: str,
    legend: Sequence[tuple[str, str]] = (),
) -> Plot:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight", pad_inches=0.15)
    drawn = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    sizes = [float(t.get_fontsize()) for t in drawn]
    return Plot(
        pid,
        title,
        buf.getvalue(),
        caption,
        legend=tuple(legend),
        text_px=min(sizes) * _DPI / 72 if sizes else 0.0,
        texts=tuple(t.get_text() for t in drawn),
    )


def _short(label: str, n: int = 40) -> str:
    return label if len(label) <= n else "…" + label[-(n - 1) :]


def grouped_bars(
    pid: str,
    title: str,
    series: Mapping[str, Mapping[str, float]],
    ylabel: str,
    caption: str = "",
    percent: bool = False,
    palette: Palette | None = None,
) -> Plot | None:
    """Bars per category (x) for each named series (one colour each, named in the legend;
    from ``palette`` when given, so a series keeps its colour across the page's charts)."""
    cats: list[str] = []
    for values in series.values():
        for c in values:
            if c not in cats:
                cats.append(c)
    if not cats or not series:
        return None
    fig = _figure(height=3.8)
    ax = _axes(fig, title, ylabel=ylabel)
    width = 0.8 / len(series)
    labelled = len(cats) * len(series) <= MAX_BAR_LABELS
    legend = []
    colour_of = palette or Palette()
    for i, (name, values) in enumerate(series.items()):
        colour = colour_of(name)
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cats))]
        ys = [float(values.get(c, 0.0)) * (100 if percent else 1) for c in cats]
        bars = ax.bar(xs, ys, width, color=colour)
        legend.append((_short(name, 80), colour))
        if labelled:
            fmt = (lambda v: f"{v:.0f}%") if percent else number
            ax.bar_label(bars, fmt=fmt, fontsize=FONT, padding=2)
    ax.set_xticks(range(len(cats)), cats)
    if len(cats) > 5:
        ax.tick_params(axis="x", labelrotation=30)
    _counts_axis(ax.yaxis, percent)
    if labelled:
        ax.margins(y=0.12)  # room for the value labels above the highest bar
    return _plot(pid, title, fig, caption, legend if len(series) > 1 else ())


def hbars(
    pid: str, title: str, values: Mapping[str, float], xlabel: str, caption: str = ""
) -> Plot | None:
    """Horizontal bars, largest at the top, each labelled with its value."""
    items = sorted(values.items(), key=lambda kv: kv[1])
    if not items:
        return None
    fig = _figure(height=max(2.2, 0.5 * len(items) + 1.2), left_in=1.5)
    ax = _axes(fig, title, xlabel=xlabel)
    bars = ax.barh([_short(k) or "(none)" for k, _ in items], [v for _, v in items])
    for b in bars:
        b.set_color(_COLOURS[0])
    ax.bar_label(bars, fmt=number, fontsize=FONT, padding=3)
    _counts_axis(ax.xaxis)
    ax.margins(x=0.15)  # room for the value labels right of the longest bar
    return _plot(pid, title, fig, caption)


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
    fig = _figure(height=4.0)
    ax = _axes(fig, title, ylabel=ylabel)
    ax.bxp(stats, showmeans=True, showfliers=False, patch_artist=True)
    for patch in ax.patches:
        patch.set_facecolor("#c7d5ea")
    if len(stats) > 5:
        ax.tick_params(axis="x", labelrotation=30)
    _counts_axis(ax.yaxis)
    return _plot(pid, title, fig, caption)


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
    fig = _figure(height=3.8)
    ax = _axes(fig, title, xlabel=xlabel, ylabel=ylabel)
    legend = []
    for i, (name, points) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        ax.plot(
            [p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, color=colour
        )
        legend.append((_short(name, 80), colour))
    for x0, x1 in gaps:
        ax.axvspan(x0, x1, color=_GAP_COLOUR, alpha=0.6)
    if gaps:
        legend.append(("gap between segments", _GAP_COLOUR))
    ax.set_ylim(bottom=0)
    _counts_axis(ax.xaxis)
    _counts_axis(ax.yaxis)
    return _plot(pid, title, fig, caption, legend)
