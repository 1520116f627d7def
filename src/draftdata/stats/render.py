"""Terminal rendering of a stats dict (from ``compute_stats``) as rich tables.

Only presentation: the numbers all come from ``compute.py``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from draftdata.shared.tokens import ESTIMATE_ERROR
from draftdata.stats.runfigures import RunFigures
from draftdata.support import tables


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _n(x: Any) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.1f}"
    return str(x)


def _tokens(x: Any, estimated: bool) -> str:
    """A token count, short, with ``~`` when it is an estimate."""
    return tables.compact(x, estimated) if isinstance(x, int | float) else "-"


def token_note(stats: dict[str, Any]) -> str:
    """How the token counts were made, in a few words (empty for stats without them)."""
    method = stats.get("token_method")
    if method == "exact":
        return "tokens exact (tokenized)"
    if method == "tokenizer":
        return f"~ tokens counted with the tokenizer in {stats.get('tokenizer')}"
    if method == "estimate":
        return (
            f"~ tokens estimated from the text: {ESTIMATE_ERROR}; --tokenizer DIR counts them "
            "with the target's"
        )
    return ""


def _cut_share(finish: dict[str, int]) -> float | None:
    turns = sum(finish.values())
    return finish.get("length", 0) / turns if turns else None


def stats_renderable(stats: dict[str, Any]) -> Group:
    """The tables for one dataset: headline, domains, sources, finish reasons, failures."""
    parts: list[Any] = []
    primary = stats["primary"]
    head = Text()
    head.append(f"{stats['dataset']}", style="bold")
    head.append(f"  ({stats['kind']}, {stats['files']} files)\n")
    head.append(f"rows {_n(stats['rows'])}")
    rej = stats["rejected"]["count"]
    if rej:
        head.append(f"   rejected {_n(rej)}", style="yellow")
    dup = (stats.get("duplicates") or {}).get("rows", 0)
    if dup:  # a copied shard: the rows of a pair an earlier shard holds are not counted
        head.append(f"   duplicates not counted {_n(dup)}", style="yellow")
    if stats.get("reasoning") is not None:
        head.append(f"   with reasoning {_pct(stats['reasoning']['share'])}")
    if "truncated" in stats:
        head.append(f"   truncated {_pct(stats['truncated']['share'])}")
    tokens = "loss_tokens" in stats
    estimated = bool(stats.get("tokens_estimated", True))
    if tokens:
        head.append(
            f"   tokens {_tokens(stats['tokens'], estimated)}"
            f"   loss tokens {_tokens(stats['loss_tokens'], estimated)}"
        )
    labels = stats.get("domain_labels") or {}
    if labels.get("classified"):
        head.append(f"   domains classified for {_n(labels['classified'])} rows", style="dim")
    if tokens:
        head.append(f"\n{token_note(stats)}", style="dim")
    parts.append(head)

    dom = Table(title=f"domains (lengths: {primary.replace('_', ' ')})", title_justify="left")
    cols = ["domain", "rows", "share"]
    if tokens:
        cols += ["tokens", "loss tokens", "loss share"]
    for col in (*cols, "mean", "p50", "p95", "max"):
        dom.add_column(col, justify="left" if col == "domain" else "right")
    if stats.get("reasoning") is not None:
        dom.add_column("reasoning", justify="right")
    cut = bool(stats.get("finish_reasons"))
    if cut:
        dom.add_column("cut", justify="right")  # completions with a turn cut by max tokens
    for name, d in stats["domains"].items():
        ln = d["lengths"].get(primary, {})
        row = [name, _n(d["rows"]), _pct(d["share"])]
        if tokens:
            row += [_tokens(d.get("tokens"), estimated), _tokens(d.get("loss_tokens"), estimated)]
            row.append(_pct(d.get("loss_token_share")))
        row += [_n(ln.get("mean", "-")), _n(ln.get("p50", "-")), _n(ln.get("p95", "-"))]
        row.append(_n(ln.get("max", "-")))
        if stats.get("reasoning") is not None:
            row.append(_pct(d.get("reasoning_share")))
        if cut:
            row.append(_pct(_cut_share(d.get("finish_reasons") or {})))
        dom.add_row(*row)
    overall = stats["lengths"].get(primary, {})
    if overall:
        dom.add_section()
        row = ["all", _n(stats["rows"]), "100.0%"]
        if tokens:
            row += [_tokens(stats["tokens"], estimated), _tokens(stats["loss_tokens"], estimated)]
            row.append("100.0%")
        row.append(_n(overall.get("mean", "-")))
        row += [_n(overall.get("p50", "-")), _n(overall.get("p95", "-"))]
        row.append(_n(overall.get("max", "-")))
        if stats.get("reasoning") is not None:
            row.append(_pct(stats["reasoning"]["share"]))
        if cut:
            row.append(_pct(_cut_share(stats["finish_reasons"])))
        dom.add_row(*row, style="bold")
    parts.append(dom)

    lens = Table(title="length percentiles", title_justify="left")
    lens.add_column("measure")
    for col in ("p5", "p25", "p50", "p75", "p95", "p99", "total"):
        lens.add_column(col, justify="right")
    for measure, s in stats["lengths"].items():
        lens.add_row(
            measure,
            *[_n(s.get(c, "-")) for c in ("p5", "p25", "p50", "p75", "p95")],
            _n(s.get("p99", "-")),
            _n(s.get("total", "-")),
        )
    if stats["lengths"]:
        parts.append(lens)

    sources = list(stats["sources"].items())
    if sources:
        src = Table(title="sources", title_justify="left")
        src.add_column("source")
        src.add_column("rows", justify="right")
        src.add_column("share", justify="right")
        for name, s in sources[:30]:
            src.add_row(name, _n(s["rows"]), _pct(s["share"]))
        if len(sources) > 30:
            src.add_row(f"... {len(sources) - 30} more", "", "")
        parts.append(src)

    for key, title, unit in (
        ("finish_reasons", "finish reasons per completion", "completions"),
        ("stopped", "conversations stopped early", "conversations"),
    ):
        if stats.get(key):
            t = Table(title=title, title_justify="left")
            t.add_column("reason")
            t.add_column(unit, justify="right")
            for k, v in stats[key].items():
                t.add_row(k, _n(v))
            parts.append(t)
    failures = stats.get("failures")
    if failures and failures["total"]:
        t = Table(title=f"failures ({_n(failures['total'])})", title_justify="left")
        t.add_column("reason")
        t.add_column("prompts", justify="right")
        for k, v in failures["by_reason"].items():
            t.add_row(k, _n(v))
        parts.append(t)
    if stats.get("output_tokens_estimated"):
        how = (
            f"counted with the tokenizer in {stats.get('tokenizer')}"
            if stats.get("token_method") == "tokenizer"
            else ESTIMATE_ERROR
        )
        parts.append(
            Text(
                f"~ output tokens of {_n(stats['output_tokens_estimated'])} answers are "
                f"counted from their text (their servers counted none): {how}",
                style="yellow",
            )
        )
    run = stats.get("run")
    metrics = stats.get("metrics")
    if run:
        parts.append(Text("\n".join(_run_lines(run))))
    elif metrics:
        line = Text(
            f"run: completed {_n(metrics['completed'])}, failed {_n(metrics['failed'])}, "
            f"output tokens {_n(metrics['output_tokens'])}, wall {metrics['wall_s']:.0f} s"
        )
        if metrics.get("output_tokens_per_s"):
            line.append(f", {metrics['output_tokens_per_s']:,.0f} tok/s")
        parts.append(line)
    for ex in stats["rejected"]["examples"][:5]:
        parts.append(Text(f"rejected: {ex}", style="yellow"))
    return Group(*parts)


def _run_lines(run: dict[str, Any]) -> list[str]:
    """The whole run's figures (``RunFigures.lines``) from their JSON form."""

    fields = set(RunFigures.__struct_fields__)
    data = {k: v for k, v in run.items() if k in fields}
    data["wasted"] = {k: v for k, v in run["wasted"].items() if k != "failed_requests"}
    return msgspec.convert(data, RunFigures).lines()


def print_stats(stats: dict[str, Any], console: Console | None = None) -> None:
    """Print the stats tables to the terminal (or ``console``)."""
    (console or tables.console()).print(stats_renderable(stats))


def hidden_set_renderable(s: dict[str, Any]) -> Group:
    """The table of one hidden-state set (``stats.hiddenset.hidden_set_stats``)."""
    layers = s["layers"]
    where = "before" if layers["last_norm"] == "pre_norm" else "after"
    samples, toks, size = s["samples"], s["tokens"], s["bytes"]
    state = "complete" if s["complete"] else f"{samples['planned'] - samples['done']:,} to do"
    rows = [
        ["samples", f"{samples['done']:,} / {samples['planned']:,} ({state})"],
        ["tokens", f"{toks['done']:,} / {toks['planned']:,}"],
        [
            "bytes",
            (tables.human_bytes(size["in_set"]) if size["in_set"] is not None else "-")
            + (f" ({size['per_token']:,.0f} B/token)" if size["per_token"] else "")
            + (f", bill {tables.human_bytes(size['bill'])}" if size["bill"] else ""),
        ],
        ["layers", f"{layers['aux']} + last ({layers['last']}, {where} the final norm)"],
        ["dtype / format", f"{s['dtype']} / {s['trainer_format']} ({s['compress']})"],
        [
            "target",
            f"{s['model']['name']} ({s['model']['num_layers']} layers x "
            f"{s['model']['hidden_size']})",
        ],
        ["dataset", f"{s['dataset']['url']} ({_n(s['dataset']['samples'])} samples)"],
    ]
    v = s.get("verification")
    if v:
        worst = max(v["layers"], key=lambda lc: lc["rms_rel"]) if v["layers"] else None
        verdict = "passed" if v["passed"] else "FAILED"
        detail = (
            f"; worst layer {worst['layer']} rms {worst['rms_rel']:.3%}, max abs "
            f"{worst['max_abs']:.3g}"
            if worst
            else ""
        )
        rows.append(
            [
                "verification",
                f"{verdict}: {v['samples']} samples one at a time, tolerance "
                f"{v['tolerance']:.1%} rms{detail}",
            ]
        )
    else:
        rows.append(["verification", "- (no command has finished the set yet)"])
    if s.get("engine"):
        rows.append(["engine", f"{s['engine']}, {_n(s.get('tokens_per_s'))} tok/s"])
    return Group(tables.table(f"hidden states: {s['url']}", ["", ""], rows))


def print_hidden_set(s: dict[str, Any], console: Console | None = None) -> None:
    """Print one hidden-state set's table."""
    (console or tables.console()).print(hidden_set_renderable(s))
