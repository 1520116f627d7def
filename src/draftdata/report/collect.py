"""Gather the report's numbers: stats of every part found, the merge report, run metrics.

``collect(inputs)`` reads each input once (``find_parts`` says what it holds; ``compute_stats``
streams it) and returns a ``ReportData`` holding only small summaries, so the report's memory
does not grow with the data. The first input is the subject of the report; further inputs are
compared with it (their domain mix is shown next to its, and when no merge report is found they
stand for the "before" side of the mix). A compared run or merge output joins the page as a
part (its throughput, failures and merge report are shown, whichever order the inputs come in),
and a saved ``draftdata stats --json`` output is compared as the dataset it measured. An
acceptance measurement (``acceptance.json``, or a folder holding one) joins the page's
acceptance section, beside the mix; several are shown side by side in the order given. A
hidden-state set (``hidden_manifest.json``, subject or compared) joins the page's hidden-states
section, beside the dataset it was made from (``stats.hiddenset``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from draftdata.errors import DraftdataError, InputError
from draftdata.report.find import Parts, find_parts
from draftdata.shared.formats import MERGE_REPORT
from draftdata.shared.speculation import Acceptance
from draftdata.stats import DatasetStats, compute_stats
from draftdata.stats.compute import STATS_FORMAT, run_metrics
from draftdata.stats.hiddenset import hidden_set_stats
from draftdata.stats.readers import acceptance_json, refuse_unreadable
from draftdata.stats.runmetrics import headline, latest, summary_of, throughput_series
from draftdata.store.forecast import Forecast, latest_forecast
from draftdata.store.merge_report import MergeReport, read_any_report
from draftdata.store.opener import open_store
from draftdata.store.read import read_manifest


@dataclass
class RunPart:
    """One generate run: its stats, manifest, metrics headline and throughput series."""

    url: str
    stats: DatasetStats
    manifest: dict[str, Any]
    metrics: dict[str, Any] | None
    throughput: dict[str, list[tuple[float, float]]]
    total: int | None = None
    forecast: Forecast | None = None  # the newest pilot forecast (store/forecast.py)
    forecast_url: str | None = None

    @property
    def figures(self) -> dict[str, Any] | None:
        """The whole run's committed figures (``stats.runfigures``), when readable."""
        run = self.stats.get("run")
        return run if isinstance(run, dict) else None

    def gaps(self) -> list[tuple[float, float]]:
        """The gaps between the run's segments, in seconds since its first segment started
        (the throughput chart's time axis)."""
        f = self.figures
        if not f or not f["segments"]:
            return []
        origin = min(float(s["start"]) for s in f["segments"])
        return [(float(a) - origin, float(b) - origin) for a, b in f["gaps"]]


@dataclass
class MergedPart:
    """One merge output: its stats and ``merge_report.json`` (None when unreadable)."""

    url: str
    stats: DatasetStats
    report: MergeReport | None  # read as any merge's (older ones' missing keys: blanks)


@dataclass
class ReportData:
    """Everything the page shows, as small JSON-ready summaries."""

    inputs: list[str]
    parts: list[Parts]
    runs: list[RunPart] = field(default_factory=list)
    merged: list[MergedPart] = field(default_factory=list)
    tokenized: list[tuple[str, DatasetStats]] = field(default_factory=list)
    prompts: list[tuple[str, DatasetStats]] = field(default_factory=list)
    datasets: list[tuple[str, DatasetStats]] = field(default_factory=list)
    compare: list[tuple[str, DatasetStats]] = field(default_factory=list)
    acceptance: list[tuple[str, Acceptance]] = field(default_factory=list)
    hidden: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # stats.hiddenset

    @property
    def main_stats(self) -> DatasetStats | None:
        """The stats the length plot uses: the run's, else the merged set's, else the data's."""
        for s in [r.stats for r in self.runs] + [m.stats for m in self.merged]:
            return s
        for _, s in self.tokenized + self.datasets + self.prompts:
            return s
        return None

    def headline(self) -> dict[str, Any]:
        """prompts, completions, failures, output tokens, wall time, tokens/s (runs summed);
        rows of merged sets and datasets. Keys absent when the inputs do not say."""
        out: dict[str, Any] = {}
        if self.runs and all(r.figures for r in self.runs):
            out.update(self._run_headline())
        elif self.runs:
            completions = sum(r.stats.rows for r in self.runs)
            failures = sum(int((r.stats.get("failures") or {}).get("total", 0)) for r in self.runs)
            tokens = 0
            for r in self.runs:
                tokens += int(r.stats["lengths"].get("output_tokens", {}).get("total", 0))
            if not tokens:
                tokens = sum(int((r.metrics or {}).get("output_tokens", 0)) for r in self.runs)
            walls = [float(r.metrics["wall_s"]) for r in self.runs if r.metrics]
            totals = [r.total for r in self.runs]
            known = [t for t in totals if t is not None]
            out["prompts"] = sum(known) if len(known) == len(totals) else completions + failures
            out["completions"] = completions
            out["failures"] = failures
            out["output_tokens"] = tokens
            if walls and max(walls) > 0:
                out["wall_s"] = round(max(walls), 1)
                out["output_tokens_per_s"] = round(tokens / max(walls), 1)
            endpoints: set[str] = set()
            for r in self.runs:
                endpoints |= set(((r.metrics or {}).get("endpoints") or {}).keys())
            if endpoints:
                out["endpoints"] = len(endpoints)
        for m in self.merged:
            rep = m.report
            if rep is not None and (rep.after.train or rep.after.eval):
                for split, counts in (("train", rep.after.train), ("eval", rep.after.eval)):
                    out[f"{split}_rows"] = out.get(f"{split}_rows", 0) + _sum(counts)
            else:  # no report, or one without its split counts: the rows read
                out["merged_rows"] = out.get("merged_rows", 0) + m.stats.rows
            if rep is not None and rep.dropped:
                out["dropped"] = out.get("dropped", 0) + _sum(rep.dropped)
        for _, s in self.tokenized:
            out["tokenized_samples"] = out.get("tokenized_samples", 0) + s.rows
            out["training_tokens"] = out.get("training_tokens", 0) + int(
                s["lengths"].get("tokens", {}).get("total", 0)
            )
        for _, s in self.prompts:
            out["prepared_prompts"] = out.get("prepared_prompts", 0) + s.rows
        for _, s in self.datasets:
            out["rows"] = out.get("rows", 0) + s.rows
        for _, h in self.hidden:
            out["hidden_state_samples"] = out.get("hidden_state_samples", 0) + int(
                h["samples"]["done"]
            )
            if h["bytes"]["in_set"] is not None:
                out["hidden_state_bytes"] = out.get("hidden_state_bytes", 0) + int(
                    h["bytes"]["in_set"]
                )
        return out

    def _run_headline(self) -> dict[str, Any]:
        """The runs' committed figures over all their segments (``stats.runfigures``)."""
        figs = [r.figures or {} for r in self.runs]
        tokens = sum(int(f["output_tokens"]) for f in figs)
        active = sum(float(f["active_s"]) for f in figs)
        out: dict[str, Any] = {
            "prompts": sum(int(f["prompts"]) for f in figs),
            "completions": sum(int(f["completions"]) for f in figs),
            "failures": sum(int(f["failures"]) for f in figs),
            "output_tokens": tokens,
        }
        if active > 0:
            out["wall_s"] = round(active, 1)
            out["output_tokens_per_s"] = round(tokens / active, 1)
        segments = sum(len(f["segments"]) for f in figs)
        if segments > 1:
            out["segments"] = segments
        out["wasted_output_tokens"] = sum(int(f["wasted"]["output_tokens"]) for f in figs)
        urls = {e["url"] for f in figs for e in f["endpoints"]}
        if urls:
            out["endpoints"] = len(urls)
        return out

    def finish_reasons(self) -> dict[str, int]:
        """Finish reasons of every run's completions, summed."""
        c: Counter[str] = Counter()
        for r in self.runs:
            c.update(r.stats.get("finish_reasons") or {})
        return dict(c.most_common())

    def stopped(self) -> dict[str, int]:
        """Conversations that stopped before their last request, by reason, summed over runs."""
        c: Counter[str] = Counter()
        for r in self.runs:
            c.update(r.stats.get("stopped") or {})
        return dict(c.most_common())

    def finish_by_domain(self) -> dict[str, dict[str, int]]:
        """Finish reasons of every run's completions per domain: {domain: {reason: count}}."""
        out: dict[str, Counter[str]] = {}
        for r in self.runs:
            for d, v in r.stats["domains"].items():
                out.setdefault(d, Counter()).update(v.get("finish_reasons") or {})
        return {d: dict(c) for d, c in out.items() if c}

    def failures_by_reason(self) -> dict[str, int]:
        """Standing failures per class, summed over runs."""
        c: Counter[str] = Counter()
        for r in self.runs:
            c.update((r.stats.get("failures") or {}).get("by_reason") or {})
        return dict(c.most_common())

    def throughput(self) -> dict[str, list[tuple[float, float]]]:
        """Output tokens/s over time per endpoint (run-prefixed labels with several runs)."""
        out: dict[str, list[tuple[float, float]]] = {}
        for r in self.runs:
            for label, points in r.throughput.items():
                out[label if len(self.runs) == 1 else f"{r.url}: {label}"] = points
        return out


def _sum(counts: dict[str, Any]) -> int:
    return sum(int(v) for v in counts.values() if isinstance(v, int | float))


def _total(snaps: list[dict[str, Any]]) -> int | None:
    """(prompt, sample) pairs in scope, when every writer's newest snapshot says."""
    totals = [summary_of(s).get("total") for s in latest(snaps)]
    if not totals or not all(isinstance(t, int) for t in totals):
        return None
    return sum(int(t) for t in totals if isinstance(t, int))


def _run(url: str) -> RunPart:

    stats = compute_stats(url)
    store = open_store(url)
    snaps = run_metrics(store)
    try:
        manifest = read_manifest(store)
    except DraftdataError:
        manifest = {}
    run = stats.get("run")
    # committed answers over their requests' lives; the snapshots' counts for a run without
    throughput = (run or {}).get("throughput") or throughput_series(snaps)
    throughput = {u: [(float(x), float(y)) for x, y in pts] for u, pts in throughput.items()}
    part = RunPart(url, stats, manifest, headline(snaps), throughput, _total(snaps))
    try:
        found = latest_forecast(store)
    except DraftdataError:  # a damaged forecast does not stop the report
        found = None
    if found is not None:
        part.forecast_url, part.forecast = found
    return part


def _merged(url: str) -> MergedPart:
    return MergedPart(url, compute_stats(url), _merge_report(url))


def _merge_report(url: str) -> MergeReport | None:
    """The merge output's report as its record, whichever merge wrote it; None when it is
    absent or no merge report (damaged, another format): the page then shows the stats."""
    store = open_store(url)
    try:
        if not store.exists(MERGE_REPORT.name):
            return None
        return read_any_report(store.read(MERGE_REPORT.name), store.key_url(MERGE_REPORT.name))
    except DraftdataError:
        return None


def collect(inputs: list[str]) -> ReportData:
    """Find and read every input (the first is the subject; see the module docstring)."""
    if not inputs:
        raise InputError("report: give a run, a merged dataset or a demo output folder")
    measured = [(u, acceptance_json(u)) for u in inputs]
    found = [(u, a) for u, a in measured if a is not None]
    inputs = [u for u, a in measured if a is None]
    if not inputs:  # only acceptance measurements: a page of them alone
        data = ReportData(inputs=[u for u, _ in found], parts=[])
        data.acceptance = found
        return data
    first = stats_json(inputs[0])
    if first is not None:  # a saved `stats --json` as the subject: the datasets it measured
        data = ReportData(inputs=list(inputs), parts=[Parts(root=inputs[0])])
        data.datasets = [
            (inputs[0] if len(first) == 1 else f"{inputs[0]}#{i}", s) for i, s in enumerate(first)
        ]
    else:
        main = find_parts(inputs[0])
        data = ReportData(inputs=list(inputs), parts=[main])
        data.runs = [_run(u) for u in main.runs]
        data.merged = [_merged(u) for u in main.merged]
        data.tokenized = [(u, compute_stats(u)) for u in main.tokenized]
        data.prompts = [(u, compute_stats(u)) for u in main.prompts]
        data.datasets = [(u, compute_stats(u)) for u in main.datasets]
        data.hidden = [(u, hidden_set_stats(u)) for u in main.hidden]
    for other in inputs[1:]:
        saved = stats_json(other)
        if saved is not None:
            data.compare += [
                (other if len(saved) == 1 else f"{other}#{i}", s) for i, s in enumerate(saved)
            ]
            continue
        parts = find_parts(other)
        data.parts.append(parts)
        data.hidden += [(u, hidden_set_stats(u)) for u in parts.hidden]  # beside its dataset
        # a run or merge output named with --compare is part of the story: its throughput,
        # failures and merge report (existing set, target, result) join the page
        known = {r.url for r in data.runs} | {m.url for m in data.merged}
        data.runs += [_run(u) for u in parts.runs if u not in known]
        data.merged += [_merged(u) for u in parts.merged if u not in known]
        if parts.runs or parts.merged or (parts.hidden and not parts.datasets):
            continue
        urls = parts.datasets or parts.tokenized or parts.prompts
        data.compare += [(u, compute_stats(u)) for u in urls]
    for url, st in [(r.url, r.stats) for r in data.runs] + data.datasets + data.compare:
        _check_readable(url, st)
    data.acceptance = found
    return data


def stats_json(url: str) -> list[DatasetStats] | None:
    """The datasets of a saved ``draftdata stats --json`` output (one object or a list), or
    None when ``url`` is not one. A JSON file with another ``format`` is refused in one line."""
    if not url.endswith(".json") or url.startswith("s3://"):
        return None

    path = os.path.expanduser(url)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(f"{url}: not readable JSON ({exc})") from None
    items = doc if isinstance(doc, list) else [doc]
    if items and all(isinstance(d, dict) and d.get("format") == STATS_FORMAT for d in items):
        return [DatasetStats(d) for d in items]
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not isinstance(fmt, str):
        return None  # e.g. a JSON array of conversations: read as a dataset
    raise InputError(
        f"{url}: a {fmt} file, not a dataset; give a dataset, a run, a merge output or a "
        f"`draftdata stats --json` output ({STATS_FORMAT})"
    )


def _check_readable(url: str, st: DatasetStats) -> None:
    """Refuse an input of which nothing could be read (every row rejected) or that holds no
    row (a run without completions aside), in one line."""
    rejected = st["rejected"]
    example = (rejected.get("examples") or [""])[0]
    refuse_unreadable(url, st.rows, rejected["count"], example, empty_ok=st.kind == "run")
