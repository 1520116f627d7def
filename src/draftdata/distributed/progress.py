"""Progress of a distributed generate: the board partitions report to, and the driver's view.

``Board`` is a plain class that ``ray_generate`` runs as a zero-CPU Ray actor. Every partition
attempt reports ``started`` (node, pid, writer id), then ``update`` every few seconds with what
it has *committed* so far (records and output tokens read from its own shards' footers and
usage column, so the numbers are durable facts, never in-flight guesses), then ``finished`` or
``crashed``. A killed attempt keeps the counts it committed (the driver recounts its shards
once its retry starts); the retry reports as a new attempt.

``Tracker`` is the driver side: it folds successive board snapshots into totals, per-node
rates over a sliding window (the clock is injectable) and an ETA; ``render`` draws a rich table
and ``plain_line`` the one-line log used when stdout is not a TTY.

Nothing here talks to Ray or to inference servers; ``committed_by_writer`` reads the store.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Group
from rich.table import Table
from rich.text import Text

from draftdata.shared.formats import COMPLETION_FORMAT
from draftdata.store.base import Store
from draftdata.store.read import COMPLETIONS_PREFIX, FAILURES_PREFIX, read_shard

STATES = ("queued", "running", "done", "failed")
LOST = "worker lost"  # the error of an attempt whose worker died (Ray retried the partition)


class Attempt(msgspec.Struct, kw_only=True):
    """One run of one partition on one node."""

    node: str
    pid: int
    writer: str
    started: float
    ended: float | None = None
    committed: int = 0
    failed: int = 0
    tokens: int = 0
    error: str | None = None


class PartitionState(msgspec.Struct, kw_only=True):
    """A partition's attempts, its state and (when done) the engine's summary."""

    index: int
    total: int | None = None
    state: str = "queued"
    attempts: list[Attempt] = msgspec.field(default_factory=list)
    summary: dict[str, Any] | None = None

    @property
    def committed(self) -> int:
        """Records committed by every attempt of this run of the command."""
        return sum(a.committed for a in self.attempts)

    @property
    def node(self) -> str:
        """The node of the latest attempt ("" while queued)."""
        return self.attempts[-1].node if self.attempts else ""


class Board:
    """The progress board (a Ray actor in a run; a plain object in unit tests)."""

    def __init__(self, totals: list[int | None], clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.parts = [PartitionState(index=i, total=t) for i, t in enumerate(totals)]

    def reset(self, totals: list[int | None]) -> None:
        """Start over for a new command (the driver keeps one board actor per Ray session)."""
        self.parts = [PartitionState(index=i, total=t) for i, t in enumerate(totals)]

    def started(self, index: int, node: str, pid: int, writer: str) -> None:
        """Record a new attempt of partition ``index`` (by its writer id). Earlier attempts
        that never reported an end died with their worker: they are marked lost, and the
        driver recounts their shards once (their last commits came after their last update).
        Tasks call this without waiting: a task blocked in ``ray.get`` lends its CPU to the
        next queued partition, which would run more engines per node than asked."""
        part = self.parts[index]
        for a in part.attempts:
            if a.ended is None:
                a.ended = self._clock()
                a.error = a.error or LOST
        part.attempts.append(Attempt(node=node, pid=pid, writer=writer, started=self._clock()))
        part.state = "running"

    def _attempt(self, index: int, writer: str) -> Attempt | None:
        return next((a for a in self.parts[index].attempts if a.writer == writer), None)

    def update(self, index: int, writer: str, committed: int, failed: int, tokens: int) -> None:
        """What the attempt with ``writer`` of partition ``index`` has committed so far."""
        a = self._attempt(index, writer)
        if a is not None:
            a.committed, a.failed, a.tokens = committed, failed, tokens

    def finished(self, index: int, writer: str, summary: dict[str, Any]) -> None:
        """The attempt returned normally with the engine's ``summary``."""
        part = self.parts[index]
        a = self._attempt(index, writer)
        if a is not None:
            a.ended = self._clock()
        part.state, part.summary = "done", summary

    def crashed(self, index: int, writer: str, error: str) -> None:
        """The attempt raised ``error`` (an application error: Ray does not retry it) or
        stopped early."""
        part = self.parts[index]
        a = self._attempt(index, writer)
        if a is not None:
            a.ended, a.error = self._clock(), error
        part.state = "failed"

    def snapshot(self) -> list[PartitionState]:
        """Every partition's state (copied by Ray on the way out)."""
        return self.parts

    def pids(self, index: int) -> list[int]:
        """The pids of partition ``index``'s attempts (tests kill one)."""
        return [a.pid for a in self.parts[index].attempts]


def committed_by_writer(
    store: Store, writer: str, seen: dict[str, tuple[int, int]]
) -> tuple[int, int, int]:
    """(completions, failures, output tokens) committed under ``writer``'s shard names.

    ``seen`` caches key -> (rows, tokens) between calls, so each shard's footer and usage
    column are read once.
    """
    comps = fails = tokens = 0
    for prefix in (COMPLETIONS_PREFIX, FAILURES_PREFIX):
        for key in store.list(f"{prefix}part-{writer}-"):
            if not key.endswith(".parquet"):
                continue
            if key not in seen:
                seen[key] = _shard_counts(store, key, prefix == COMPLETIONS_PREFIX)
            rows, toks = seen[key]
            if prefix == COMPLETIONS_PREFIX:
                comps += rows
                tokens += toks
            else:
                fails += rows
    return comps, fails, tokens


def _shard_counts(store: Store, key: str, completions: bool) -> tuple[int, int]:
    if not completions:
        path = store.local_path(key)
        pf = pq.ParquetFile(path if path is not None else store.open_input(key))
        return pf.metadata.num_rows, 0
    table = read_shard(store, key, COMPLETION_FORMAT, ["usage"])
    usage = table.column("usage")
    toks = pc.sum(pc.struct_field(usage, "completion_tokens")).as_py() or 0
    return table.num_rows, int(toks)


class NodeRow(msgspec.Struct, kw_only=True):
    """One node's line in the display."""

    node: str
    running: int = 0
    done: int = 0
    committed: int = 0
    tokens: int = 0
    rate: float = 0.0  # committed records/s over the window
    token_rate: float = 0.0


class Tracker:
    """Driver-side totals, per-node sliding-window rates and ETA from board snapshots."""

    def __init__(
        self, total: int | None, window_s: float = 60.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.total = total
        self.window_s = window_s
        self._clock = clock
        self.started = clock()
        self.parts: list[PartitionState] = []
        # node -> deque of (t, committed, tokens)
        self._history: dict[str, deque[tuple[float, int, int]]] = {}

    def observe(self, parts: list[PartitionState]) -> None:
        """Fold in a new board snapshot."""
        self.parts = parts
        now = self._clock()
        for row in self._node_totals().values():
            hist = self._history.setdefault(row.node, deque())
            hist.append((now, row.committed, row.tokens))
            while len(hist) > 2 and now - hist[1][0] >= self.window_s:
                hist.popleft()

    def _node_totals(self) -> dict[str, NodeRow]:
        rows: dict[str, NodeRow] = {}
        for p in self.parts:
            for a in p.attempts:
                row = rows.setdefault(a.node, NodeRow(node=a.node))
                row.committed += a.committed
                row.tokens += a.tokens
            if p.attempts:
                row = rows[p.node]
                if p.state == "running":
                    row.running += 1
                elif p.state == "done":
                    row.done += 1
        return rows

    def nodes(self) -> list[NodeRow]:
        """Per-node rows with rates over the window, sorted by node name."""
        rows = self._node_totals()
        for name, row in rows.items():
            hist = self._history.get(name)
            if hist and len(hist) >= 2 and hist[-1][0] > hist[0][0]:
                dt = hist[-1][0] - hist[0][0]
                row.rate = (hist[-1][1] - hist[0][1]) / dt
                row.token_rate = (hist[-1][2] - hist[0][2]) / dt
        return [rows[k] for k in sorted(rows)]

    @property
    def committed(self) -> int:
        """Records committed by this command so far (all partitions, all attempts)."""
        return sum(p.committed for p in self.parts)

    @property
    def tokens(self) -> int:
        """Output tokens committed by this command so far."""
        return sum(a.tokens for p in self.parts for a in p.attempts)

    def counts(self) -> dict[str, int]:
        """How many partitions are queued / running / done / failed."""
        out = dict.fromkeys(STATES, 0)
        for p in self.parts:
            out[p.state] += 1
        return out

    def eta_s(self) -> float | None:
        """Seconds left at the current aggregate rate (None without a total or a rate)."""
        rate = sum(r.rate for r in self.nodes())
        if self.total is None or rate <= 0:
            return None
        return max(0.0, self.total - self.committed) / rate


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _si(x: float) -> str:
    for unit, size in (("M", 1e6), ("K", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def headline(t: Tracker) -> str:
    """committed/total, aggregate rates, ETA and how many partitions are in each state."""
    nodes = t.nodes()
    rate = sum(r.rate for r in nodes)
    toks = sum(r.token_rate for r in nodes)
    total = f"/{t.total}" if t.total is not None else ""
    c = t.counts()
    return (
        f"ray generate: {t.committed}{total} committed, {rate:.1f}/s, {_si(toks)} tok/s, "
        f"ETA {_fmt_eta(t.eta_s())}; partitions {c['done']} done, {c['running']} running, "
        f"{c['queued']} queued, {c['failed']} failed"
    )


def plain_line(t: Tracker) -> str:
    """The headline plus each node's committed rate and tokens/s (the non-TTY log line)."""
    per_node = ", ".join(f"{r.node} {r.rate:.1f}/s {_si(r.token_rate)} tok/s" for r in t.nodes())
    return headline(t) + (f"; {per_node}" if per_node else "")


def render(t: Tracker) -> Any:
    """A rich renderable: the headline and one row per node."""

    nodes = t.nodes()
    table = Table(box=None, pad_edge=False)
    for col in ("node", "running", "done", "committed", "req/s", "tok/s"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for r in nodes:
        table.add_row(
            r.node,
            str(r.running),
            str(r.done),
            str(r.committed),
            f"{r.rate:.1f}",
            _si(r.token_rate),
        )
    return Group(Text(headline(t)), table)
