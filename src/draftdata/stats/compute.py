"""``compute_stats(url)``: the domain mix and shape of any dataset draftdata understands.

One streaming pass over the rows (``readers.py``) fills bounded accumulators: counts per domain
and per source, length sketches (``sketch.py``) per domain, the share of rows with reasoning, and
for runs the finish reasons, failures by class and the metrics summary. Rows without a domain
label are classified with prepare's ``classify_domain`` (tokenized rows without a label count as
``unknown``: there is no text to classify). The result is a JSON-ready dict (``draftdata.stats/1``).

Lengths are characters for chat rows and tokens where tokens exist (tokenized samples; a run's
``usage``); ``primary`` names the measure the table and the report show first.

Tokens per domain, for every kind: ``tokens`` (the whole conversation) and ``loss_tokens`` (what
the assistant wrote: what a drafter trains on), with ``token_share`` and ``loss_token_share``.
They are exact for tokenized samples (their ``num_tokens`` / ``num_loss_tokens``) and counted
with ``draftdata.shared.tokens`` for chat rows and runs: the target's tokenizer when one is given,
else estimated from the text (``token_method`` says which; ``tokens_estimated`` is true unless
exact). A run's rows are counted from their text like any chat rows, so a run and the merge of
it count the same way; the servers' own output token counts stay under ``lengths``.
This module does not print; ``render.py`` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from draftdata.errors import DraftdataError
from draftdata.records import Completion
from draftdata.shared.domains import classify_domain
from draftdata.shared.formats import PREPARE_REPORT
from draftdata.shared.readers.base import batches
from draftdata.shared.tokens import TokenCounter, completion_tokens, conversation_tokens, counter
from draftdata.stats.conversations import completion_to_conversation
from draftdata.stats.readers import (
    SUMMARY_COLUMNS,
    Dataset,
    iter_conversations,
    iter_run_completions,
    iter_sample_summaries,
    open_dataset,
    read_json_file,
    refuse_unreadable,
)
from draftdata.stats.runfigures import completion_reason, run_figures
from draftdata.stats.runmetrics import headline
from draftdata.stats.sketch import Sketch
from draftdata.store.base import Store
from draftdata.store.doneset import DoneSet
from draftdata.store.read import iter_failures, read_metrics

T = TypeVar("T")
STATS_FORMAT = "draftdata.stats/1"
MAX_EXAMPLES = 20
_CHUNK = 1024  # chat rows counted per call of the token counter


class DatasetStats(dict[str, Any]):
    """The statistics of one dataset: a JSON-ready dict (``draftdata.stats/1``) with accessors.

    Keys: format, dataset, kind, files, rows, rejected, domain_labels, primary, lengths,
    reasoning, domains, sources, tokens, loss_tokens, token_method, tokens_estimated; plus
    truncated (tokenized), finish_reasons, failures and metrics (runs) and prepare_report
    (prompts). Each domain: rows, share, tokens, loss_tokens, token_share, loss_token_share,
    lengths. ``json.dumps`` takes it as is. Stats saved before tokens were counted have no
    token keys; the accessors then return ``{}``.
    """

    @property
    def rows(self) -> int:
        """Rows read (rejected rows excluded)."""
        return int(self["rows"])

    @property
    def kind(self) -> str:
        """run, prompts, tokenized or conversations."""
        return str(self["kind"])

    def domain_counts(self) -> dict[str, int]:
        """Rows per domain, largest first."""
        return {d: int(v["rows"]) for d, v in self["domains"].items()}

    def domain_shares(self) -> dict[str, float]:
        """Share of rows per domain, largest first."""
        return {d: float(v["share"]) for d, v in self["domains"].items()}

    def domain_loss_tokens(self) -> dict[str, int]:
        """Loss tokens per domain (``{}`` for stats saved without token counts)."""
        return {d: int(v["loss_tokens"]) for d, v in self["domains"].items() if "loss_tokens" in v}

    def domain_loss_token_shares(self) -> dict[str, float]:
        """Share of loss tokens per domain (``{}`` for stats saved without token counts)."""
        return {
            d: float(v["loss_token_share"])
            for d, v in self["domains"].items()
            if "loss_token_share" in v
        }

    @property
    def tokens_estimated(self) -> bool:
        """Whether the token counts are estimates (chat rows, runs) rather than exact."""
        return bool(self.get("tokens_estimated", True))

    def length(self, domain: str | None = None, measure: str | None = None) -> dict[str, Any]:
        """The length summary (count, mean, min, p5..p99, max, total) of ``measure``
        (default: ``primary``) over all rows or one domain; ``{}`` when not measured."""
        m = measure or str(self["primary"])
        lengths = self["lengths"] if domain is None else self["domains"][domain]["lengths"]
        return dict(lengths.get(m, {}))


class Rejects:
    """Malformed rows seen while reading: a count per reason and the first few, located."""

    def __init__(self, limit: int = MAX_EXAMPLES) -> None:
        self.count = 0
        self.examples: list[str] = []
        self._limit = limit

    def __call__(self, where: str, reason: str) -> None:
        self.count += 1
        if len(self.examples) < self._limit:
            self.examples.append(f"{where}: {reason}")

    def to_dict(self) -> dict[str, Any]:
        """``{"count", "examples"}``."""
        return {"count": self.count, "examples": list(self.examples)}


class _Group:
    """Accumulators of one slice of the rows (all rows, or one domain)."""

    def __init__(self) -> None:
        self.rows = 0
        self.tokens = 0
        self.loss_tokens = 0
        self.reasoning = 0
        self.truncated = 0
        self.lengths: dict[str, Sketch] = {}
        self.finish: Counter[str] = Counter()

    def sketch(self, measure: str) -> Sketch:
        s = self.lengths.get(measure)
        if s is None:
            s = self.lengths[measure] = Sketch()
        return s

    def to_dict(self, all_rows: _Group, reasoning_known: bool) -> dict[str, Any]:
        def share(part: int, whole: int) -> float:
            return round(part / whole, 6) if whole else 0.0

        out: dict[str, Any] = {
            "rows": self.rows,
            "share": share(self.rows, all_rows.rows),
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "token_share": share(self.tokens, all_rows.tokens),
            "loss_token_share": share(self.loss_tokens, all_rows.loss_tokens),
            "lengths": {k: s.summary() for k, s in sorted(self.lengths.items()) if s.count},
        }
        if reasoning_known:
            out["reasoning_share"] = round(self.reasoning / self.rows, 6) if self.rows else 0.0
        if self.finish:
            out["finish_reasons"] = dict(self.finish.most_common())
        return out


class StatsBuilder:
    """Collects rows one at a time (chat rows) or a batch at a time (tokenized samples)."""

    def __init__(self, ds: Dataset, count: TokenCounter | None = None) -> None:
        self.ds = ds
        self.count = count or TokenCounter()
        self.all = _Group()
        self.domains: dict[str, _Group] = {}
        self.sources: Counter[str] = Counter()
        self.labels: Counter[str] = Counter()
        self.stopped: Counter[str] = Counter()  # run: conversations stopped early, by reason
        self.duplicates = 0  # run: rows of an (id, sample) an earlier shard holds (not counted)
        self.output_estimated = 0  # run: answers whose servers counted no output tokens
        self.rejects = Rejects()

    def _domain(self, name: str) -> _Group:
        g = self.domains.get(name)
        if g is None:
            g = self.domains[name] = _Group()
        return g

    def add_row(
        self,
        domain: str,
        source: str,
        measures: dict[str, float],
        reasoning: bool = False,
        finish: Counter[str] | None = None,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        """Count one row of ``domain``/``source`` with its length ``measures``, its (tokens,
        loss tokens) and, for a completion, its finish reason per completion."""
        for g in (self.all, self._domain(domain)):
            g.rows += 1
            g.tokens += tokens[0]
            g.loss_tokens += tokens[1]
            g.reasoning += reasoning
            for name, value in measures.items():
                g.sketch(name).add(value)
            if finish:
                g.finish.update(finish)
        self.sources[source or "(none)"] += 1

    def add_samples(self, domains: list[str], sources: list[str], cols: dict[str, Any]) -> None:
        """Count a batch of tokenized rows (``cols``: num_tokens, num_loss_tokens, truncated)."""
        tokens = np.asarray(cols["num_tokens"], dtype=np.int64)
        loss = np.asarray(cols["num_loss_tokens"], dtype=np.int64)
        trunc = np.asarray(cols["truncated"], dtype=bool)
        labels = np.array([d or "unknown" for d in domains], dtype=object)
        self.labels["given"] += int(sum(1 for d in domains if d))
        self.labels["unknown"] += int(sum(1 for d in domains if not d))
        names, inverse = np.unique(labels, return_inverse=True)
        groups = [(self.all, np.ones(len(labels), dtype=bool))]
        groups += [(self._domain(str(n)), inverse == i) for i, n in enumerate(names)]
        for g, m in groups:
            g.rows += int(m.sum())
            g.tokens += int(tokens[m].sum())
            g.loss_tokens += int(loss[m].sum())
            g.truncated += int(trunc[m].sum())
            g.sketch("tokens").add_many(tokens[m])
            g.sketch("loss_tokens").add_many(loss[m])
        self.sources.update(s or "(none)" for s in sources)


def _classifier() -> Callable[..., str]:

    return classify_domain


def _label(b: StatsBuilder, given: str) -> str:
    """The row's own domain label, counted as given; empty ones count as to be classified."""
    b.labels["given" if given else "classified"] += 1
    return given


def _stats_chat(b: StatsBuilder) -> None:
    classify = _classifier()
    for chunk in batches(iter_conversations(b.ds, b.rejects), _CHUNK):
        tokens, loss = conversation_tokens([(c.messages, c.tools) for c in chunk], b.count)
        for conv, n, nl in zip(chunk, tokens.tolist(), loss.tolist(), strict=True):
            domain = _label(b, conv.domain) or classify(conv.messages, conv.tools)
            chars, out_chars = conv.char_counts()
            measures: dict[str, float] = {"chars": chars}
            if any(m.role == "assistant" for m in conv.messages):
                measures["output_chars"] = out_chars
            b.add_row(domain, conv.source, measures, conv.has_reasoning, tokens=(n, nl))


def _stats_run(b: StatsBuilder) -> None:

    classify = _classifier()
    seen = DoneSet()  # the first copy of an (id, sample) counts, as export and tokenize keep it

    def unique() -> Iterator[Completion]:
        for c in iter_run_completions(b.ds, b.rejects):
            if seen.add(c.id, c.sample):
                yield c
            else:
                b.duplicates += 1

    for chunk in batches(unique(), _CHUNK):
        convs = [completion_to_conversation(c) for c in chunk]
        tokens, loss = conversation_tokens([(v.messages, v.tools) for v in convs], b.count)
        for c, conv, n, nl in zip(chunk, convs, tokens.tolist(), loss.tolist(), strict=True):
            domain = _label(b, c.domain) or classify(conv.messages, c.tools)
            out_chars = sum(len(t.content or "") + len(t.reasoning or "") for t in c.turns)
            # usage, else token ids, else the text
            out_tokens, estimated = completion_tokens(c.usage.completion_tokens, c.turns, b.count)
            b.output_estimated += estimated
            measures: dict[str, float] = {"output_chars": out_chars}
            if out_tokens:
                measures["output_tokens"] = out_tokens
            reasoning = any(t.reasoning or "<think>" in (t.content or "") for t in c.turns)
            # per completion (the reason its conversation ended), not per turn
            reasons = Counter([completion_reason([t.finish_reason for t in c.turns])])
            if c.stop_reason:
                b.stopped[c.stop_reason] += 1
            b.add_row(domain, c.source, measures, reasoning, reasons, tokens=(n, nl))


def _stats_samples(b: StatsBuilder) -> None:
    for _, table in iter_sample_summaries(b.ds):
        data = {c: table.column(c).to_numpy(zero_copy_only=False) for c in SUMMARY_COLUMNS[2:]}
        b.add_samples(table.column("domain").to_pylist(), table.column("source").to_pylist(), data)


def _failures(ds: Dataset) -> dict[str, Any]:

    by_reason: Counter[str] = Counter()
    by_domain: Counter[str] = Counter()
    for f in iter_failures(ds.store):
        by_reason[f.reason] += 1
        by_domain[f.domain or "unknown"] += 1
    return {
        "total": sum(by_reason.values()),
        "by_reason": dict(by_reason.most_common()),
        "by_domain": dict(sorted(by_domain.items())),
    }


def _run_figures(
    ds: Dataset, snaps: list[dict[str, Any]], count: TokenCounter
) -> dict[str, Any] | None:
    """The whole run's committed figures (``runfigures``), None when they cannot be read."""

    try:
        return run_figures(ds.store, snaps, count).to_dict()
    except DraftdataError:
        return None


def run_metrics(ds_or_store: Dataset | Store) -> list[dict[str, Any]]:
    """Every metrics snapshot of a run, in key order (``[]`` when there are none)."""

    store = ds_or_store.store if isinstance(ds_or_store, Dataset) else ds_or_store
    try:
        return read_metrics(store)
    except DraftdataError:
        return []


def _primary(kind: str, lengths: dict[str, Any]) -> str:
    order = {
        "tokenized": ["tokens"],
        "run": ["output_tokens", "output_chars"],
    }.get(kind, ["chars"])
    for m in order:
        if m in lengths:
            return m
    return order[0]


def compute_stats(url: str, tokenizer: str | None = None) -> DatasetStats:
    """Stream the dataset at ``url`` once and return its statistics (``draftdata.stats/1``).

    Works on runs, prompts, tokenized samples and conversations (kind auto-detected, local or
    ``s3://``). Malformed rows are counted under ``rejected`` with their location, never fatal,
    unless no row at all could be read, or there is none (``readers.refuse_unreadable``: not a
    dataset, or an empty one; a run without completions still shows its failures).
    ``tokenizer`` (a folder) counts chat rows' tokens with the target's tokenizer instead of the
    estimate; tokenized samples are exact either way.
    """

    ds = open_dataset(url)
    count = counter(tokenizer) if tokenizer and ds.kind != "tokenized" else counter()
    b = StatsBuilder(ds, count)
    if ds.kind == "tokenized":
        _stats_samples(b)
    elif ds.kind == "run":
        _stats_run(b)
    else:
        _stats_chat(b)
    total = b.all.rows
    example = next(iter(b.rejects.examples), "")
    refuse_unreadable(url, total, b.rejects.count, example, empty_ok=ds.kind == "run")
    reasoning_known = ds.kind != "tokenized"
    lengths = {k: s.summary() for k, s in sorted(b.all.lengths.items()) if s.count}
    out = DatasetStats(
        {
            "format": STATS_FORMAT,
            "dataset": ds.url,
            "kind": ds.kind,
            "files": len(ds.keys),
            "rows": total,
            "rejected": b.rejects.to_dict(),
            "domain_labels": dict(sorted(b.labels.items())),
            "primary": _primary(ds.kind, lengths),
            "lengths": lengths,
            "reasoning": (
                {
                    "rows": b.all.reasoning,
                    "share": round(b.all.reasoning / total, 6) if total else 0.0,
                }
                if reasoning_known
                else None
            ),
            "tokens": b.all.tokens,
            "loss_tokens": b.all.loss_tokens,
            "token_method": "exact" if ds.kind == "tokenized" else count.method,
            "tokens_estimated": ds.kind != "tokenized",
            "tokenizer": count.tokenizer if ds.kind != "tokenized" else None,
            "domains": {
                d: g.to_dict(b.all, reasoning_known)
                for d, g in sorted(b.domains.items(), key=lambda kv: (-kv[1].rows, kv[0]))
            },
            "sources": {
                s: {"rows": n, "share": round(n / total, 6) if total else 0.0}
                for s, n in sorted(b.sources.items(), key=lambda kv: (-kv[1], kv[0]))
            },
        }
    )
    if ds.kind == "tokenized":
        out["truncated"] = {
            "rows": b.all.truncated,
            "share": round(b.all.truncated / total, 6) if total else 0.0,
        }
    if ds.kind == "run":
        out["duplicates"] = {
            "rows": b.duplicates,
            "why": "the same (id, sample) in two shards (a copied shard): the first is counted",
        }
        out["finish_reasons"] = dict(b.all.finish.most_common())
        out["stopped"] = dict(b.stopped.most_common())
        # lengths.output_tokens of answers their servers counted none for are estimated
        out["output_tokens_estimated"] = b.output_estimated
        if ds.is_run:
            out["failures"] = _failures(ds)
            snaps = run_metrics(ds)
            out["metrics"] = headline(snaps)
            out["run"] = _run_figures(ds, snaps, count)
    if ds.kind == "prompts":
        report = read_json_file(ds.store, PREPARE_REPORT)
        if report is not None:
            out["prepare_report"] = report
    return out
