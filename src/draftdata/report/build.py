"""``build_report(inputs..., out)``: collect the numbers, draw the figures, write the page.

Sections, in order: headline numbers; domain mix in rows and in loss tokens (before/target/after
from a merge output's ``merge_report.json``, else the domain shares of the subject and of every
compared input; loss tokens are estimated for chat rows and runs, see ``stats``);
output length per domain; tokens per domain; finish reasons; failures by class; throughput over
time per endpoint (from the run's metrics snapshots); a pilot's forecast against the actual run
(``forecast.py``); each hidden-state set (samples, tokens, bytes, layers, dtype,
verification); the inputs read. A section without data
says why in one line instead of drawing an empty chart.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftdata.errors import InputError, disk_errors
from draftdata.report import page, plots
from draftdata.report.collect import ReportData, collect
from draftdata.report.forecast import forecast_section
from draftdata.stats import DatasetStats
from draftdata.store.merge_report import Splits
from draftdata.support import tables

_MEASURES = {
    "output_tokens": "output tokens",
    "output_chars": "output characters",
    "tokens": "tokens",
    "chars": "characters",
}


def _name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1] or url


def _shares(counts: Mapping[str, Any]) -> dict[str, float]:
    nums = {k: float(v) for k, v in counts.items() if isinstance(v, int | float)}
    total = sum(nums.values())
    return {k: v / total for k, v in nums.items()} if total else {}


def _mix_series(data: ReportData) -> tuple[dict[str, dict[str, float]], str]:
    """Named domain-share series for the mix chart, and where they come from."""
    for m in data.merged:
        r = m.report
        if r is None:
            continue
        series: dict[str, dict[str, float]] = {}
        for url, st in data.compare:  # e.g. step 0's stats of the live set (before.json)
            if st.kind != "run":
                series[f"{_name(url)} ({st.kind})"] = st.domain_shares()
        for role, label in (("existing", "existing set"), ("add", "added")):
            counts: dict[str, float] = {}
            for i in r.inputs:
                if i.role == role:
                    for d, n in i.by_domain.items():
                        counts[d] = counts.get(d, 0) + n
            if counts:
                series[f"{label} (merge input)"] = _shares(counts)
        series |= _merge_series(r.before, r.target, r.after)
        series = {k: v for k, v in series.items() if v}
        if series:
            return series, f"from {m.url}/merge_report.json"
    series = {}
    own: list[tuple[str, DatasetStats]] = [(r.url, r.stats) for r in data.runs]
    own += [(m.url, m.stats) for m in data.merged] + data.tokenized + data.prompts + data.datasets
    for url, s in own + data.compare:
        series[f"{_name(url)} ({s.kind})"] = s.domain_shares()
    how = "domain shares of each input" + (" (compared)" if data.compare else "")
    return {k: v for k, v in series.items() if v}, how


def _merge_series(
    before: Mapping[str, int], target: Mapping[str, float] | None, after: Splits
) -> dict[str, dict[str, float]]:
    """A merge report's before / target / after (train, eval) as named share series; counts
    become shares, the target is already one; empty parts (an older merge's report that
    lacks them) are left out by the caller."""
    series: dict[str, dict[str, float]] = {"before (merge inputs)": _shares(before)}
    if target is not None:
        series["target"] = {k: float(v) for k, v in target.items()}
    series["after: train"] = _shares(after.train)
    series["after: eval"] = _shares(after.eval)
    return series


def _token_mix_series(data: ReportData) -> tuple[dict[str, dict[str, float]], str]:
    """Named series of each domain's share of the loss tokens, and where they come from: a
    merge report's token counts, else each input's stats (saved stats without token counts
    give none)."""
    for m in data.merged:
        r = m.report
        if r is None or not (r.tokens.before or r.tokens.after.train or r.tokens.after.eval):
            continue  # no report, or an older merge's without token counts
        tok = r.tokens
        series: dict[str, dict[str, float]] = {}
        for url, st in data.compare:
            if st.kind != "run":
                series[f"{_name(url)} ({st.kind})"] = st.domain_loss_token_shares()
        target = r.target if r.mix_by == "loss_tokens" else None
        series |= _merge_series(tok.before, target, tok.after)
        series = {k: v for k, v in series.items() if v}
        if series:
            return series, f"from {m.url}/merge_report.json ({tok.method or 'estimate'})"
    series = {}
    own: list[tuple[str, DatasetStats]] = [(r.url, r.stats) for r in data.runs]
    own += [(m.url, m.stats) for m in data.merged] + data.tokenized + data.prompts + data.datasets
    for url, st in own + data.compare:
        series[f"{_name(url)} ({st.kind})"] = st.domain_loss_token_shares()
    return {k: v for k, v in series.items() if v}, "loss tokens of each input (~ estimated "
    "for chat rows and runs, exact for tokenized sets)"


def _ordered(series: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """The same series with domains in one order: by their largest share, descending."""
    best: dict[str, float] = {}
    for values in series.values():
        for d, v in values.items():
            best[d] = max(best.get(d, 0.0), v)
    order = sorted(best, key=lambda d: (-best[d], d))
    return {name: {d: values.get(d, 0.0) for d in order} for name, values in series.items()}


def _mix_section(data: ReportData) -> page.Section:
    series, how = _mix_series(data)
    series = _ordered(series)
    palette = plots.Palette()  # a series keeps its colour in the row and the token chart
    plot = plots.grouped_bars(
        "domain-mix", "Domain mix", series, "share of rows (%)", how, percent=True,
        palette=palette,
    )  # fmt: skip
    domains = list(next(iter(series.values()), {}))
    rows = [[d, *(f"{100 * v.get(d, 0.0):.1f}%" for v in series.values())] for d in domains]
    tables = [page.table(["domain", *series], rows)] if rows else []
    figures = [plot] if plot else []
    tseries, thow = _token_mix_series(data)
    tseries = _ordered(tseries)
    tplot = plots.grouped_bars(
        "domain-mix-tokens",
        "Domain mix in loss tokens (what a drafter trains on)",
        tseries,
        "share of loss tokens (%)",
        thow,
        percent=True,
        palette=palette,
    )
    if tplot:
        figures.append(tplot)
        tdomains = list(next(iter(tseries.values()), {}))
        trows = [[d, *(f"{100 * v.get(d, 0.0):.1f}%" for v in tseries.values())] for d in tdomains]
        tables.append(page.table(["domain (loss tokens)", *tseries], trows))
    return page.Section("Domain mix", figures, "no domain counts", tables)


def _subject_token_shares(data: ReportData) -> tuple[str, dict[str, float]]:
    """The report's subject (its first input) as shares of loss tokens, and its name: the
    training set it holds (a merge output's result, else tokenized samples), else its run or
    dataset; ("", {}) when the subject has no token counts."""
    main = data.parts[0] if data.parts else None
    if main is None:
        return "", {}
    for m in data.merged:
        if m.url not in main.merged:
            continue
        after: dict[str, float] = {}
        if m.report is not None:
            for split in (m.report.tokens.after.train, m.report.tokens.after.eval):
                for d, n in split.items():
                    after[d] = after.get(d, 0.0) + float(n)
        shares = _shares(after) or m.stats.domain_loss_token_shares()
        if shares:
            return f"{_name(m.url)} (merged)", shares
    own = [(u, s) for u, s in data.tokenized if u in main.tokenized]
    own += [(r.url, r.stats) for r in data.runs if r.url in main.runs]
    own += data.datasets + [(u, s) for u, s in data.prompts if u in main.prompts]
    for url, st in own:
        shares = st.domain_loss_token_shares()
        if shares:
            return f"{_name(url)} ({st.kind})", shares
    return "", {}


def _acceptance_section(data: ReportData) -> page.Section | None:
    """The drafter's acceptance per domain, each measurement side by side, beside the subject's
    share of loss tokens (where the data to train on stands against where the drafter is weak)."""
    if not data.acceptance:
        return None
    names = [_name(u.rstrip("/").removesuffix("/acceptance.json")) for u, _ in data.acceptance]
    if len(set(names)) < len(names):
        names = [f"{n} ({i + 1})" for i, n in enumerate(names)]
    series = {
        n: {d: a.acceptance_rate for d, a in m.by_domain.items() if a.acceptance_rate is not None}
        for n, (_, m) in zip(names, data.acceptance, strict=True)
    }
    series = _ordered({k: {d: float(v) for d, v in vals.items()} for k, vals in series.items()})
    plot = plots.grouped_bars(
        "acceptance",
        "Draft acceptance per domain",
        series,
        "accepted / draft tokens (%)",
        "each measurement's acceptance rate per domain (draftdata acceptance)",
        percent=True,
    )
    mix_name, mix = _subject_token_shares(data)
    domains = list(next(iter(series.values()), {}))
    header = ["domain"]
    if mix:
        header.append(f"loss-token share: {mix_name}")
    for n in names:
        header += [f"acceptance: {n}", f"accept length: {n}"]
    rows = []
    for d in domains:
        row: list[Any] = [d]
        if mix:
            row.append(f"{100 * mix.get(d, 0.0):.1f}%")
        for _, m in data.acceptance:
            a = m.by_domain.get(d)
            rate = a.acceptance_rate if a is not None else None
            length = a.mean_accept_length if a is not None else None
            row += [
                "-" if rate is None else f"{100 * rate:.1f}%",
                "-" if length is None else f"{length:.2f}",
            ]
        rows.append(row)
    return page.Section(
        "Draft acceptance per domain",
        [plot] if plot else [],
        "no acceptance measured",
        [page.table(header, rows)] if rows else [],
    )


def _length_section(data: ReportData) -> page.Section:
    s = data.main_stats
    if s is None:
        return page.Section("Output length per domain", note="no dataset read")
    measure = str(s["primary"])
    if s.kind != "run" and s.kind != "tokenized":
        out = [d for d in s["domains"].values() if "output_chars" in d["lengths"]]
        measure = "output_chars" if out else measure
    summaries = {d: v["lengths"].get(measure, {}) for d, v in s["domains"].items()}
    label = _MEASURES.get(measure, measure)
    title = f"Output length per domain ({label})"
    plot = plots.length_boxes(
        "output-length",
        title,
        summaries,
        label,
        f"{_name(s['dataset'])}: box p25-p75, line median, whiskers p5-p95, triangle mean",
    )
    cols = ("count", "mean", "p50", "p95", "max")
    rows = [[d, *(v.get(c, "-") for c in cols)] for d, v in summaries.items() if v]
    tables = [page.table(["domain", "rows", "mean", "p50", "p95", "max"], rows)] if rows else []
    return page.Section(title, [plot] if plot else [], "no lengths measured", tables)


def _tokens_section(data: ReportData) -> page.Section:
    series: dict[str, dict[str, float]] = {}
    for r in data.runs:
        per = {d: v["lengths"].get("output_tokens", {}).get("total", 0) for d, v in _doms(r.stats)}
        if any(per.values()):
            series[f"output tokens: {_name(r.url)}"] = per
    for url, s in data.tokenized + [(m.url, m.stats) for m in data.merged] + data.datasets:
        if s.kind == "tokenized":
            series[f"training tokens: {_name(url)}"] = {
                d: v["lengths"].get("tokens", {}).get("total", 0) for d, v in _doms(s)
            }
    unit = "tokens"
    main = data.main_stats
    if not series and main is not None and "loss_tokens" in main:
        series[f"loss tokens (~ estimated): {_name(main['dataset'])}"] = {
            d: v.get("loss_tokens", 0) for d, v in _doms(main)
        }
        unit = "loss tokens (estimated from the text)"
    if not series and main is not None:
        m = "output_chars" if "output_chars" in main["lengths"] else "chars"
        series[f"{_MEASURES[m]}: {_name(main['dataset'])}"] = {
            d: v["lengths"].get(m, {}).get("total", 0) for d, v in _doms(main)
        }
        unit = "characters (no token counts in the inputs)"
    series = _ordered({k: {d: float(x) for d, x in v.items()} for k, v in series.items()})
    plot = plots.grouped_bars("tokens-per-domain", "Tokens per domain", series, unit)
    domains = list(next(iter(series.values()), {}))
    rows = [[d, *(int(v.get(d, 0)) for v in series.values())] for d in domains]
    tables = [page.table(["domain", *series], rows)] if rows else []
    return page.Section("Tokens per domain", [plot] if plot else [], "no token counts", tables)


def _doms(s: DatasetStats) -> list[tuple[str, dict[str, Any]]]:
    return list(s["domains"].items())


def _finish_section(data: ReportData) -> page.Section:
    title = "Finish reasons"
    if not data.runs:
        return page.Section(title, note="no generate run in the inputs")
    overall = data.finish_reasons()
    per = data.finish_by_domain()
    plot = plots.hbars(
        "finish-reasons",
        title,
        overall,
        "completions",
        "per completion: length = a turn was cut by max tokens, else the last turn's reason",
    )
    reasons = list(overall)
    rows = []
    for d, counts in [("all", overall), *per.items()]:
        n = sum(counts.values())
        rows.append([d, n, *(f"{100 * counts.get(k, 0) / n:.1f}%" for k in reasons)])
    tables = [page.table(["domain", "completions", *reasons], rows)] if rows and reasons else []
    stopped = data.stopped()
    if stopped:  # conversations the stop rule ended before their last request
        tables.append(
            page.table(["conversation stopped early by", "conversations"], list(stopped.items()))
        )
    return page.Section(title, [plot] if plot else [], "no completions", tables)


def _failures_section(data: ReportData) -> page.Section:
    if not data.runs:
        return page.Section("Failures by class", note="no generate run in the inputs")
    fails = data.failures_by_reason()
    plot = plots.hbars(
        "failures", "Failures by class", fails, "prompts", "failures still standing (not retried)"
    )
    return page.Section("Failures by class", [plot] if plot else [], "no failures")


def _throughput_section(data: ReportData) -> page.Section:
    title = "Throughput over time per endpoint"
    if not data.runs:
        return page.Section(title, note="no generate run in the inputs")
    gaps = data.runs[0].gaps() if len(data.runs) == 1 else []
    plot = plots.lines(
        "throughput",
        title,
        data.throughput(),
        "seconds since the run started",
        "output tokens/s",
        (
            "committed output tokens, each answer's spread over its request's life, in bins no "
            "narrower than a request"
            if all(r.figures and r.figures.get("throughput") for r in data.runs)
            else "from the run's metrics snapshots (metrics/*.json)"
        )
        + ("; shaded: gaps between the run's segments (not running)" if gaps else ""),
        gaps=gaps,
    )
    note = "the run has no metrics snapshots with per-endpoint figures"
    tables = []
    rows: list[list[Any]] = []
    for r in data.runs:
        f = r.figures
        if f is None:  # no committed figures: the snapshots' own
            for url, e in ((r.metrics or {}).get("endpoints") or {}).items():
                rows.append([url, e.get("completed", 0), e.get("output_tokens", 0), ""])
            continue
        for e in f["endpoints"]:
            rows.append([e["url"], e["completions"], e["output_tokens"], f"{e['share']:.1%}"])
    if rows:
        head = ["endpoint", "committed completions", "committed output tokens", "share"]
        tables.append(page.table(head, rows))
    wasted = [r.figures["wasted"] for r in data.runs if r.figures]
    if wasted:
        w = {k: sum(int(x[k]) for x in wasted) for k in ("output_tokens", "hedges", "hedges_won")}
        errors: dict[str, int] = {}
        for x in wasted:
            for k, v in x["errors"].items():
                errors[k] = errors.get(k, 0) + int(v)
        retries = sum(int(x["retries"]) for x in wasted)
        tables.append(
            page.table(
                ["wasted work (not committed)", "count"],
                [
                    ["output tokens returned but not committed", w["output_tokens"]],
                    ["hedged requests (one copy of each cancelled)", w["hedges"]],
                    ["of which the hedge copy won", w["hedges_won"]],
                    ["retried attempts", retries],
                    *[[f"failed requests: {k}", v] for k, v in sorted(errors.items())],
                ],
            )
        )
    if any(len(r.figures["segments"]) > 1 for r in data.runs if r.figures):
        seg_rows = []
        for r in data.runs:
            segs = (r.figures or {}).get("segments") or []
            origin = min((float(s["start"]) for s in segs), default=0.0)
            for s in segs:
                a, b = float(s["start"]) - origin, float(s["end"]) - origin
                seg_rows.append([r.url, s["writer"], f"{a:,.1f}", f"{b:,.1f}", f"{b - a:,.1f}"])
        tables.append(
            page.table(["run", "segment (writer)", "from s", "to s", "seconds"], seg_rows)
        )
    return page.Section(title, [plot] if plot else [], note, tables)


def _hidden_section(data: ReportData) -> page.Section | None:
    """Each hidden-state set: samples and tokens done of planned, bytes (per token, and the
    bill), layers, dtype and format, the target, and its verification."""
    if not data.hidden:
        return None
    rows: list[list[Any]] = []
    for url, h in data.hidden:
        size, v = h["bytes"], h.get("verification")
        layers = h["layers"]
        where = "before" if layers["last_norm"] == "pre_norm" else "after"
        if v:
            worst = max(v["layers"], key=lambda lc: lc["rms_rel"]) if v["layers"] else None
            check = ("passed" if v["passed"] else "FAILED") + f" ({v['samples']} samples"
            check += f", worst rms {worst['rms_rel']:.3%})" if worst else ")"
        else:
            check = "-"
        rows.append(
            [
                url,
                f"{h['samples']['done']:,} / {h['samples']['planned']:,}",
                f"{h['tokens']['done']:,}",
                tables.human_bytes(size["in_set"]) if size["in_set"] is not None else "-",
                f"{size['per_token']:,.0f}" if size["per_token"] else "-",
                f"{layers['aux']} + {layers['last']} ({where} norm)",
                f"{h['dtype']} / {h['trainer_format']}",
                f"{h['model']['name']} ({h['model']['num_layers']}x{h['model']['hidden_size']})",
                check,
            ]
        )
    header = [
        "set", "samples", "tokens", "bytes", "bytes/token", "layers", "dtype / format",
        "target", "verification",
    ]  # fmt: skip
    return page.Section("Hidden states", tables=[page.table(header, rows)])


def _inputs_section(data: ReportData) -> page.Section:
    rows: list[list[Any]] = []
    for r in data.runs:
        rows.append(["run", r.url, r.stats.rows, r.stats["rejected"]["count"]])
    for m in data.merged:
        rows.append(["merged", m.url, m.stats.rows, m.stats["rejected"]["count"]])
    for u, s in data.tokenized:
        rows.append(["tokenized", u, s.rows, s["rejected"]["count"]])
    for u, s in data.prompts:
        rows.append(["prompts", u, s.rows, s["rejected"]["count"]])
    for u, s in data.datasets:
        rows.append([s.kind, u, s.rows, s["rejected"]["count"]])
    for u, s in data.compare:
        rows.append([f"compared ({s.kind})", u, s.rows, s["rejected"]["count"]])
    for u, h in data.hidden:
        rows.append(["hidden states", u, h["samples"]["done"], 0])
    return page.Section(
        "Inputs", tables=[page.table(["part", "location", "rows", "rejected"], rows)]
    )


def render_report(data: ReportData, title: str | None = None) -> str:
    """The page for collected data."""
    accepted = _acceptance_section(data)
    hidden = _hidden_section(data)
    sections = [
        _mix_section(data),
        *([accepted] if accepted is not None else []),
        _length_section(data),
        _tokens_section(data),
        _finish_section(data),
        _failures_section(data),
        _throughput_section(data),
        forecast_section(data),
        *([hidden] if hidden is not None else []),
        _inputs_section(data),
    ]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    subject = data.inputs[0]
    return page.render(
        title or f"draftdata report: {_name(subject)}",
        f"{subject} · generated {when}",
        data.headline(),
        sections,
    )


def build_report(
    *inputs: str | os.PathLike[str],
    out: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Write the HTML report of ``inputs[0]`` (compared with ``inputs[1:]``) to ``out``.

    Inputs are local paths or ``s3://`` URLs: a run, a merge output, a dataset, or a folder
    holding several (see ``report.find``). ``out`` is a local file, replaced atomically.
    Returns its path.
    """
    if not inputs:
        raise InputError("report: give a run, a merged dataset or a demo output folder")
    target = str(out)
    if target.startswith("s3://"):
        raise InputError(f"{target}: --out is a local file (copy it to S3 afterwards)")
    path = Path(target).expanduser()
    if path.is_dir():
        raise InputError(
            f"--out {target}: is a folder; give a file name, e.g. --out {path / 'report.html'}"
        )
    data = collect([str(i) for i in inputs])
    text = render_report(data, title)
    with disk_errors(str(path), "choose another --out"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is an ordinary file
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path
