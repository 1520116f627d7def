"""The report page: one self-contained HTML document (inline CSS, PNGs as data: URIs).

No script, no external URL (no fonts, no CDN): the page renders the same offline, from S3, or
attached to an e-mail. Every figure is an ``<img class="plot" id="plot-...">`` (its
``data-text-px`` is the size of its smallest text in its own pixels) with its legend under it as
HTML; a section with nothing to draw shows a short note instead. It reads at a laptop's width
and at a phone's (390 px): figures shrink to fit, legends wrap, wide tables scroll inside their
own box, long paths break, so the page never scrolls sideways. Numbers carry thousands
separators. This module only formats; ``build.py`` decides what goes in.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftdata.report.plots import Plot

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2rem auto;
max-width:1000px;color:#222;padding:0 1rem;overflow-wrap:break-word}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}
.sub{color:#666;font-size:.85rem;overflow-wrap:anywhere}
.cards{display:flex;flex-wrap:wrap;gap:.6rem;margin:1rem 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.5rem .8rem;min-width:7.5rem}
.card .v{font-size:1.25rem;font-weight:600}.card .k{font-size:.75rem;color:#666}
figure{margin:1rem 0}figure img{display:block;max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.8rem;color:#555}
.legend{display:flex;flex-wrap:wrap;gap:.25rem 1.1rem;list-style:none;padding:0;margin:.4rem 0;
font-size:.85rem}
.legend li{overflow-wrap:anywhere}
.legend i{display:inline-block;width:.8rem;height:.8rem;margin-right:.35rem;vertical-align:-.1rem;
border-radius:2px}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0}
th,td{border-bottom:1px solid #eee;padding:.2rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}
.note{color:#777;font-style:italic}
code{font-size:.85em}
"""

_LABELS = {
    "prompts": "prompts",
    "completions": "completions",
    "failures": "failures",
    "output_tokens": "output tokens",
    "wall_s": "wall time (active)",
    "output_tokens_per_s": "output tokens/s (active time)",
    "segments": "segments (commands)",
    "wasted_output_tokens": "wasted output tokens (not committed)",
    "endpoints": "endpoints",
    "train_rows": "train rows",
    "eval_rows": "eval rows",
    "dropped": "dropped in merge",
    "merged_rows": "merged rows",
    "tokenized_samples": "tokenized samples",
    "training_tokens": "training tokens",
    "prepared_prompts": "prepared prompts",
    "rows": "rows",
}


@dataclass(frozen=True)
class Section:
    """A titled block: figures, a note when it has none, and optional tables (HTML)."""

    title: str
    plots: Sequence[Plot] = ()
    note: str = ""
    tables: Sequence[str] = ()


def _fmt(key: str, value: Any) -> str:
    if key == "wall_s" and isinstance(value, int | float):
        v = float(value)
        return f"{v:.1f} s" if v < 120 else f"{v / 60:.1f} min" if v < 7200 else f"{v / 3600:.1f} h"
    if isinstance(
        value, float
    ):  # a rate: a decimal only where it says something (7.5, not 53,997.0)
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


def cards(headline: dict[str, Any]) -> str:
    """The headline numbers as cards."""
    items = []
    for k, v in headline.items():
        label = _LABELS.get(k, k.replace("_", " "))
        items.append(
            f'<div class="card" id="headline-{html.escape(k)}"><div class="v">{_fmt(k, v)}</div>'
            f'<div class="k">{html.escape(label)}</div></div>'
        )
    return f'<div class="cards">{"".join(items)}</div>'


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> str:
    """A small HTML table (cells escaped; ints with thousands separators)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{_fmt('', c)}</td>" for c in row) + "</tr>" for row in rows
    )
    cap = f"<caption class='sub'>{html.escape(caption)}</caption>" if caption else ""
    return (
        f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _legend(p: Plot) -> str:
    if not p.legend:
        return ""
    items = "".join(
        f'<li><i style="background:{html.escape(colour)}"></i>{html.escape(label)}</li>'
        for label, colour in p.legend
    )
    return f'<ul class="legend" id="legend-{html.escape(p.id)}">{items}</ul>'


def _figure(p: Plot) -> str:
    data = base64.b64encode(p.png).decode("ascii")
    cap = f"<figcaption>{html.escape(p.caption)}</figcaption>" if p.caption else ""
    return (
        f'<figure><img class="plot" id="plot-{html.escape(p.id)}" alt="{html.escape(p.title)}" '
        f'data-text-px="{p.text_px:.1f}" src="data:image/png;base64,{data}">'
        f"{_legend(p)}{cap}</figure>"
    )


def render(title: str, subtitle: str, headline: dict[str, Any], sections: Sequence[Section]) -> str:
    """The whole page."""
    body = [f"<h1>{html.escape(title)}</h1>", f'<div class="sub">{html.escape(subtitle)}</div>']
    body.append(cards(headline) if headline else '<p class="note">no headline numbers</p>')
    for s in sections:
        body.append(f"<h2>{html.escape(s.title)}</h2>")
        body.extend(_figure(p) for p in s.plots)
        if not s.plots and s.note:
            body.append(f'<p class="note">{html.escape(s.note)}</p>')
        body.extend(s.tables)
    n = sum(len(s.plots) for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="draftdata-plots" content="{n}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
