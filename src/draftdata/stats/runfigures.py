"""The figures of a whole generate run, however many commands (segments) it took.

A run is usually written by several commands: one is interrupted, the next resumes it. Each
command's own counters (its metrics snapshots, its end summary) cover only its segment, and they
count work that was never committed (the losing copy of a hedged request, requests cancelled at
an interrupt, retried attempts). ``run_figures(store)`` counts instead from what the run holds:

- the committed completions shards (one row per committed (id, sample); a row whose pair an
  earlier shard holds too, a copied shard, is counted as a duplicate and nothing else; shards
  set aside as unreadable are left out and counted): completions, distinct
  prompts, tokens, finish reasons *per completion* (the reason its conversation ended: ``length``
  when any turn was cut by max tokens, else its last turn's reason), and each endpoint's committed
  completions and output tokens, so the endpoint shares sum to 100%;
- the standing failures (one per (id, sample) not later completed), by class;
- the metrics snapshots for time: each segment is one writer process (a writer id plus its
  start time), spanning from its start to its last snapshot; the committed answers' requests
  (start and answer times) extend a segment past its last snapshot, and are a segment of their
  own where no snapshot covers them (a command killed before its first snapshot: bounded by its
  first request and last answer); the run's active time is the union of the segments (parallel
  writers overlap, sequential commands add up) and the gaps between them are listed; tokens/s
  is committed output tokens over active time;
- wasted work, as its own figure: output tokens the endpoints returned beyond those committed
  (from each segment's newest snapshot), hedged copies (and how many won), retried attempts and
  failed requests by class;
- per domain, the output tokens the scheduler expected of each answer when it sent it (and the
  estimate's standard error) beside what the answer took (each segment's newest snapshot
  holds its command's sums): how well the longest-first order knew the lengths.

It reads only small columns (on S3 only those column chunks): 1.1 s for 193,000 completions in
97 local shards on the 2-core box. It never writes.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftdata.shared.formats import COMPLETION_FORMAT
from draftdata.shared.tokens import ESTIMATE_ERROR, TokenCounter
from draftdata.stats.runmetrics import (
    SAME_START_S,
    Answers,
    Segment,
    answer_throughput,
    segments_of,
    snapshot_elapsed,
    snapshot_endpoints,
    snapshot_time,
    summary_of,
    union,
    with_commits,
    writer_of,
)
from draftdata.store.base import Store
from draftdata.store.doneset import DoneSet, hash_pairs
from draftdata.store.quarantine import quarantined
from draftdata.store.read import (
    COMPLETIONS_PREFIX,
    iter_failures,
    output_tokens,
    read_metrics,
    read_shards_parallel,
    shard_keys,
    turn_finish_reasons,
)
from draftdata.store.shards import shard_writer

_COLUMNS = [
    "id",
    "sample",
    "domain",
    "endpoint",
    "usage",
    "created",
    "latency_s",
    "turns.list.element.finish_reason",
]


def stopped_lines(stopped: dict[str, int]) -> list[str]:
    """The summary line of the conversations that stopped before their last turn, by reason
    (generate's summary and the run figures print it alike); none when none stopped."""
    if not stopped:
        return []
    return [
        "  conversations stopped early: "
        + ", ".join(f"{k} {v}" for k, v in sorted(stopped.items()))
    ]


class EndpointFigures(msgspec.Struct, kw_only=True):
    """One endpoint's committed part of the run."""

    url: str
    completions: int = 0
    output_tokens: int = 0
    share: float = 0.0  # of the run's committed output tokens; the shares sum to 1


class DomainFigures(msgspec.Struct, kw_only=True):
    """One domain's committed part of the run; with the lengths the scheduler expected of its
    answers when it sent them (from the segments' metrics: ``expected_*`` sum over the
    ``expected_answers`` it recorded, beside what those answers took)."""

    completions: int = 0
    failures: int = 0
    output_tokens: int = 0
    cut: int = 0
    expected_answers: int = 0
    expected_tokens: float = 0.0
    expected_se: float = 0.0  # sum of the estimates' standard errors
    expected_measured: int = 0  # output tokens of those answers

    def lengths_line(self) -> str:
        """``output tokens per answer: expected E (± SE) when sent, measured M`` (empty
        without recorded expectations)."""
        n = self.expected_answers
        if not n:
            return ""
        return (
            f"; output tokens per answer: expected {self.expected_tokens / n:,.0f} "
            f"(± {self.expected_se / n:,.0f}) when sent, measured "
            f"{self.expected_measured / n:,.0f} ({n:,} answers)"
        )


class Wasted(msgspec.Struct, kw_only=True):
    """Work the endpoints did that is not in the run (summed over segments)."""

    output_tokens: int = 0  # returned by the endpoints beyond the committed ones
    hedges: int = 0  # duplicate copies sent at the tail (each hedged prompt wastes one copy)
    hedges_won: int = 0
    retries: int = 0  # attempts after the first
    errors: dict[str, int] = msgspec.field(default_factory=dict)  # failed requests by class

    @property
    def failed_requests(self) -> int:
        """Requests that ended in an error (retried or not)."""
        return sum(self.errors.values())


class RunFigures(msgspec.Struct, kw_only=True):
    """Committed figures of the whole run (module docstring)."""

    completions: int = 0  # committed (id, sample) pairs
    duplicates: int = 0  # rows of a pair an earlier shard holds too (a copied shard): not counted
    set_aside: int = 0  # shards set aside as unreadable (quarantine/, `draftdata run check`)
    prompts: int = 0  # distinct prompt ids completed or standing failed
    failed: dict[str, int] = msgspec.field(default_factory=dict)  # standing failures by class
    finish_reasons: dict[str, int] = msgspec.field(default_factory=dict)  # per completion
    turns: int = 0
    cut: int = 0  # completions with a turn cut by max tokens
    # conversations that stopped before their last request, by reason (conversation.STOP_*)
    stopped: dict[str, int] = msgspec.field(default_factory=dict)
    prompt_tokens: int = 0
    output_tokens: int = 0
    # completions whose servers counted no output tokens (no usage, or 0): estimated from their
    # text (draftdata.shared.tokens.turns_tokens), and those estimated tokens, part of output_tokens
    estimated_answers: int = 0
    estimated_tokens: int = 0
    estimated_with: str | None = None  # the tokenizer folder that counted them (None: estimate)
    cached_tokens: int = 0
    endpoints: list[EndpointFigures] = msgspec.field(default_factory=list)
    domains: dict[str, DomainFigures] = msgspec.field(default_factory=dict)
    segments: list[Segment] = msgspec.field(default_factory=list)
    gaps: list[tuple[float, float]] = msgspec.field(default_factory=list)  # (start, end), epoch
    active_s: float = 0.0  # union of the segments
    span_s: float = 0.0  # first start to last end, gaps included
    wasted: Wasted = msgspec.field(default_factory=Wasted)
    # committed output tokens/s per endpoint over time: (seconds since the first segment
    # started, tok/s), each answer's tokens spread over its request's life (runmetrics)
    throughput: dict[str, list[tuple[float, float]]] = msgspec.field(default_factory=dict)

    @property
    def failures(self) -> int:
        """Standing failures."""
        return sum(self.failed.values())

    @property
    def output_tokens_per_s(self) -> float | None:
        """Committed output tokens per second of active time (None without time)."""
        return self.output_tokens / self.active_s if self.active_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data, with the derived figures."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        data["failures"] = self.failures
        rate = self.output_tokens_per_s
        data["output_tokens_per_s"] = round(rate, 2) if rate is not None else None
        data["wasted"]["failed_requests"] = self.wasted.failed_requests
        return data

    def estimate_line(self) -> str:
        """What part of the output tokens is an estimate, why, and how far off it can be."""
        how = (
            f"counted with the tokenizer in {self.estimated_with}"
            if self.estimated_with
            else ESTIMATE_ERROR
        )
        return (
            f"  ~{self.estimated_tokens:,} of the output tokens are counted from the text of "
            f"{self.estimated_answers:,} answers the servers counted none for (no usage, or "
            f"0): {how}"
        )

    def when(self) -> str:
        """``active S s`` plus, for several segments, how many and the span with the gaps."""
        seg = len(self.segments)
        return f"active {self.active_s:,.1f} s" + (
            f" in {seg} segments ({self.span_s:,.1f} s with the gaps)" if seg > 1 else ""
        )

    def lines(self) -> list[str]:
        """The figures as the CLI prints them (``stats`` and generate's end summary)."""
        fails = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        finish = ", ".join(f"{k} {v}" for k, v in sorted(self.finish_reasons.items())) or "-"
        rate = self.output_tokens_per_s
        w = self.wasted
        out = [
            f"whole run: {self.prompts:,} prompts, {self.completions:,} completions, "
            f"{self.failures:,} failures ({fails}); {self.when()}",
            *(
                [
                    f"  not counted: {self.duplicates:,} duplicate completions (an (id, sample) "
                    "that an earlier shard holds too: a copied shard); readers keep the first"
                ]
                if self.duplicates
                else []
            ),
            *(
                [
                    f"  {self.set_aside:,} unreadable shard(s) set aside (quarantine/); the "
                    "same generate command generates their prompts again"
                ]
                if self.set_aside
                else []
            ),
            f"  tokens: {self.prompt_tokens:,} prompt ({self.cached_tokens:,} cached), "
            f"{'~' if self.estimated_answers else ''}{self.output_tokens:,} output"
            + (f" ({rate:,.0f} output tok/s over the active time)" if rate is not None else ""),
            *([self.estimate_line()] if self.estimated_answers else []),
            f"  finish reasons per completion: {finish}; cut by max tokens: {self.cut:,}",
            *stopped_lines(self.stopped),
            f"  wasted (not committed): {w.output_tokens:,} output tokens, "
            f"{w.hedges:,} hedged requests (one copy of each cancelled; the hedge won "
            f"{w.hedges_won:,}), {w.retries:,} retried attempts, "
            f"{w.failed_requests:,} failed requests"
            + (
                " (" + ", ".join(f"{k} {v}" for k, v in sorted(w.errors.items())) + ")"
                if w.errors
                else ""
            ),
        ]
        for e in self.endpoints:
            out.append(
                f"  {e.url}: {e.share:.1%} of committed output tokens, "
                f"{e.completions:,} completions"
            )
        if len(self.domains) > 1 or (self.domains and "" not in self.domains):
            for name, d in self.domains.items():
                out.append(
                    f"  domain {name or '(none)'}: {d.completions:,} completions, "
                    f"{d.failures:,} failures, {d.output_tokens:,} output tokens, "
                    f"cut by max tokens {d.cut:,}" + d.lengths_line()
                )
        return out


def _domain(fig: RunFigures, name: str | None) -> DomainFigures:
    key = name or ""
    d = fig.domains.get(key)
    if d is None:
        d = fig.domains[key] = DomainFigures()
    return d


def completion_reason(reasons: list[str | None]) -> str:
    """The finish reason of one completion: ``length`` when a turn was cut, else the last
    turn's reason (``unknown`` when none is recorded)."""
    if not reasons:
        return "unknown"
    if "length" in reasons:
        return "length"
    return reasons[-1] or "unknown"


def _newest_per_segment(
    snapshots: list[dict[str, Any]], segments: list[Segment]
) -> list[dict[str, Any]]:
    """The last snapshot of each segment (snapshots without a time: the last of each writer)."""
    newest: dict[tuple[str, int], dict[str, Any]] = {}
    for snap in snapshots:
        w = writer_of(snap)
        t = snapshot_time(snap)
        idx = -1
        if t is not None:
            start = t - (snapshot_elapsed(snap) or 0.0)
            for i, s in enumerate(segments):
                if s.writer == w and (
                    abs(s.start - start) < SAME_START_S or s.start <= start < s.end
                ):
                    idx = i
                    break
        newest[(w, idx)] = snap  # key order is each writer's sequence
    return list(newest.values())


def _wasted(snapshots: list[dict[str, Any]], segments: list[Segment], committed: int) -> Wasted:
    w = Wasted()
    generated = 0
    errors: Counter[str] = Counter()
    for snap in _newest_per_segment(snapshots, segments):
        s = summary_of(snap)
        for key in ("hedges", "hedges_won", "retries"):
            v = s.get(key, snap.get(key))
            if isinstance(v, int) and not isinstance(v, bool):
                setattr(w, key, getattr(w, key) + v)
        for row in snapshot_endpoints(snap).values():
            # a summary row: generated_tokens (output_tokens is what it committed); a progress
            # row: output_tokens is every answer returned
            tokens = row.get("generated_tokens", row.get("output_tokens"))
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                generated += tokens
            errs = row.get("errors")
            if isinstance(errs, dict):
                errors.update({str(k): int(v) for k, v in errs.items() if isinstance(v, int)})
    w.output_tokens = max(0, generated - committed)
    w.errors = dict(sorted(errors.items()))
    return w


def _lengths(fig: RunFigures, snapshots: list[dict[str, Any]], segments: list[Segment]) -> None:
    """Each domain's expected and measured lengths, summed over the segments' newest
    snapshots (each holds its command's running sums)."""
    for snap in _newest_per_segment(snapshots, segments):
        rows = summary_of(snap).get("lengths", snap.get("lengths"))
        if not isinstance(rows, dict):
            continue
        for name, row in rows.items():
            if not isinstance(row, dict):
                continue
            values = [row.get(k) for k in ("answers", "expected", "expected_se", "measured")]
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                continue
            d = _domain(fig, str(name))
            d.expected_answers += int(values[0])  # type: ignore[arg-type]
            d.expected_tokens += float(values[1])  # type: ignore[arg-type]
            d.expected_se += float(values[2])  # type: ignore[arg-type]
            d.expected_measured += int(values[3])  # type: ignore[arg-type]


def run_figures(
    store: Store, snapshots: list[dict[str, Any]] | None = None, count: TokenCounter | None = None
) -> RunFigures:
    """The whole run's figures (module docstring); ``snapshots`` default to the run's
    ``metrics/*.json``; ``count`` counts the text of answers their servers counted no tokens
    for (default: the estimate)."""

    fig = RunFigures()
    if count is not None and count.tokenizer:
        fig.estimated_with = count.tokenizer
    ids: set[str] = set()
    finish: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    per_ep: dict[str, list[int]] = {}  # url -> [completions, output tokens]
    # each committed answer in time: request start, answer, tokens, endpoint (per shard)
    starts: list[np.ndarray[Any, Any]] = []
    ends: list[np.ndarray[Any, Any]] = []
    toks: list[np.ndarray[Any, Any]] = []
    eps: list[np.ndarray[Any, Any]] = []
    wrs: list[np.ndarray[Any, Any]] = []
    urls: dict[str, int] = {}
    writers: dict[str, int] = {}  # a shard's writer id -> its index in Answers.writers
    keys = shard_keys(store, COMPLETIONS_PREFIX)
    fig.set_aside = len(quarantined(store))
    seen = DoneSet()  # the first copy of an (id, sample) counts, as every reader keeps it
    tables = read_shards_parallel(
        store, keys, COMPLETION_FORMAT, _COLUMNS, optional=["stop_reason"]
    )
    for key, table in zip(keys, tables, strict=True):
        out_tokens, estimated = output_tokens(store, key, table, count)
        pairs = hash_pairs(table.column("id").to_pylist(), table.column("sample").to_pylist())
        first = seen.first_seen(pairs)
        if not first.all():
            fig.duplicates += int((~first).sum())
            table = table.filter(pa.array(first))
            keep = first.tolist()
            out_tokens = [n for n, k in zip(out_tokens, keep, strict=True) if k]
            estimated = [e for e, k in zip(estimated, keep, strict=True) if k]
        ids.update(table.column("id").to_pylist())
        if "stop_reason" in table.column_names:
            stopped.update(r for r in table.column("stop_reason").to_pylist() if r)
        usage = table.column("usage")

        def field(name: str, usage: Any = usage) -> list[int]:
            return [int(x or 0) for x in pc.struct_field(usage, name).to_pylist()]

        fig.completions += table.num_rows
        endpoints = table.column("endpoint").to_pylist()
        created = table.column("created").fill_null(0.0).to_numpy().astype(np.float64)
        latency = table.column("latency_s").fill_null(0.0).to_numpy().astype(np.float64)
        timed = created > 0  # the answer's request, in time
        where = [urls.setdefault(u or "(unknown)", len(urls)) for u in endpoints]
        starts.append((created - latency)[timed])
        ends.append(created[timed])
        toks.append(np.asarray(out_tokens, dtype=np.float64)[timed])
        eps.append(np.asarray(where, dtype=np.int64)[timed])
        name = shard_writer(key)
        code = -1 if name is None else writers.setdefault(name, len(writers))
        wrs.append(np.full(int(timed.sum()), code, dtype=np.int64))
        domains = table.column("domain").to_pylist()
        fig.output_tokens += sum(out_tokens)
        fig.estimated_answers += sum(estimated)
        fig.estimated_tokens += sum(n for n, e in zip(out_tokens, estimated, strict=True) if e)
        fig.prompt_tokens += sum(field("prompt_tokens"))
        fig.cached_tokens += sum(field("cached_tokens"))
        rows = zip(turn_finish_reasons(table.column("turns")), domains, out_tokens, strict=True)
        for reasons, domain, tokens in rows:
            fig.turns += len(reasons)
            finish[completion_reason(reasons)] += 1
            cut = "length" in reasons
            fig.cut += cut
            d = _domain(fig, domain)
            d.completions += 1
            d.output_tokens += tokens
            d.cut += cut
        for url, tokens in zip(endpoints, out_tokens, strict=True):
            acc = per_ep.setdefault(url or "(unknown)", [0, 0])
            acc[0] += 1
            acc[1] += tokens
    failed: Counter[str] = Counter()
    for f in iter_failures(store):
        failed[f.reason] += 1
        ids.add(f.id)
        _domain(fig, f.domain).failures += 1
    fig.prompts = len(ids)
    fig.failed = dict(sorted(failed.items()))
    fig.finish_reasons = dict(finish.most_common())
    fig.stopped = dict(sorted(stopped.items()))
    fig.domains = dict(sorted(fig.domains.items()))
    total = fig.output_tokens
    fig.endpoints = [
        EndpointFigures(
            url=url,
            completions=n,
            output_tokens=t,
            share=round(t / total, 6) if total else (n / fig.completions if fig.completions else 0),
        )
        for url, (n, t) in sorted(per_ep.items())
    ]
    snaps = read_metrics(store) if snapshots is None else snapshots
    logged = segments_of(snaps)
    # a command killed before its first snapshot (or after its last) shows in its answers
    answers = Answers(
        start=np.concatenate(starts) if starts else np.zeros(0),
        end=np.concatenate(ends) if ends else np.zeros(0),
        tokens=np.concatenate(toks) if toks else np.zeros(0),
        endpoint=np.concatenate(eps) if eps else np.zeros(0, np.int64),
        urls=sorted(urls, key=urls.__getitem__),
        writer=np.concatenate(wrs) if wrs else np.zeros(0, np.int64),
        writers=sorted(writers, key=writers.__getitem__),
    )
    fig.segments = with_commits(logged, answers)
    fig.active_s, fig.gaps = union(fig.segments)
    fig.active_s = round(fig.active_s, 3)
    if fig.segments:
        fig.span_s = round(max(s.end for s in fig.segments) - fig.segments[0].start, 3)
        fig.throughput = answer_throughput(answers, fig.segments[0].start)
    fig.wasted = _wasted(snaps, logged, fig.output_tokens)
    _lengths(fig, snaps, logged)
    fig.domains = dict(sorted(fig.domains.items()))
    return fig
