"""``draftdata generate --ray``: one engine per fleet node, prompts partitioned by id hash.

The driver (the machine where the command is typed):

1. connects to Ray (``cluster.connect``) and probes every candidate node's fleet;
2. reserves one placement-group bundle per fleet node (``tasks_per_node`` partition slots);
3. submits P partition tasks into "any bundle": a node that finishes a partition pulls the
   next one, so fast nodes do more (Ray schedules; there is no scheduler of ours);
4. shows aggregate progress and per-node throughput from the progress board, then a summary.

Each partition task (``partition_task.run_partition``, in a Ray worker on a fleet node)
resolves that node's fleet, opens the one shared run store with a writer id of its own
(``p0003-<host>-<pid>-<rnd>``) and runs the normal generate engine restricted to its
partition. Exactly-once comes from the store: every attempt re-opens the run and skips what
is committed, so a task Ray retries after its worker was killed regenerates only the
uncommitted tail, and rerunning the same command (even with another P) resumes every
partition.

This module does not generate anything itself (the engine does) and does not start servers.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
from rich.console import Console
from rich.live import Live

from draftdata.distributed import cluster
from draftdata.distributed.partition_task import RayOptions as RayOptions
from draftdata.distributed.partition_task import run_partition
from draftdata.distributed.progress import (
    LOST,
    Board,
    PartitionState,
    Tracker,
    committed_by_writer,
    plain_line,
    render,
)
from draftdata.errors import ConfigError, DraftdataError, Interrupted
from draftdata.generate.config import GenerateConfig, validate
from draftdata.generate.prompts.partition import Partition, count_by_partition
from draftdata.generate.prompts.source import prompt_files
from draftdata.store.opener import open_store
from draftdata.support.progress import REFRESH_PER_SECOND

DEFAULT_PARTITIONS_PER_NODE = 4


class PartitionOutcome(msgspec.Struct, kw_only=True):
    """A partition's end state as the driver saw it."""

    index: int
    state: str
    nodes: list[str]
    attempts: int
    committed: int
    failed: int
    tokens: int
    error: str | None = None
    summary: dict[str, Any] | None = None


class RayGenerateResult(msgspec.Struct, kw_only=True):
    """What a distributed generate did: per partition, per node, totals and wall time."""

    out: str
    partitions: int
    outcomes: list[PartitionOutcome]
    nodes: dict[str, dict[str, float]]  # node -> committed, tokens, partitions
    committed: int
    tokens: int
    wall_s: float
    interrupted: bool = False
    signal: int = 0  # the signal that interrupted it (SIGINT, SIGTERM), if one did

    @property
    def failed_partitions(self) -> list[int]:
        """Indexes of partitions that did not finish."""
        return [o.index for o in self.outcomes if o.state != "done"]


# -- the driver ---------------------------------------------------------------------------------


def _check(config: GenerateConfig, opts: RayOptions) -> None:

    if opts.fleet_per_node and (config.fleet or config.endpoints):
        raise ConfigError("--fleet-per-node: give it instead of --fleet/--endpoint, not with them")
    validate(msgspec.structs.replace(config, fleet=opts.fleet_per_node or config.fleet))
    if opts.partitions is not None and opts.partitions < 1:
        raise ConfigError(f"--partitions: {opts.partitions}; must be at least 1")
    if opts.max_retries < 0:
        raise ConfigError(f"--max-retries: {opts.max_retries}; must be >= 0")
    if not opts.cpus_per_task > 0:
        raise ConfigError(f"--cpus-per-task: {opts.cpus_per_task}; must be > 0")


def _absolute(config: GenerateConfig, opts: RayOptions) -> tuple[GenerateConfig, RayOptions]:
    """Relative local paths made absolute on the driver: workers run in other directories
    (on other nodes the same absolute path must exist, e.g. a shared filesystem)."""

    def absolute(path: str | None) -> str | None:
        if path is None or "://" in path:
            return path
        return os.path.abspath(os.path.expanduser(path))

    changes: dict[str, Any] = {
        "prompts": absolute(config.prompts) or config.prompts,
        "out": absolute(config.out) or config.out,
        "fleet": absolute(config.fleet),
    }
    config = msgspec.structs.replace(config, **changes)
    return config, msgspec.structs.replace(opts, fleet_per_node=absolute(opts.fleet_per_node))


def _totals(config: GenerateConfig, count: int) -> list[int | None]:
    """Records each partition will commit (prompts x n), when the driver can see the prompts."""

    if config.limit is not None:
        return [None] * count
    try:
        files = prompt_files(config.prompts)
        return [c * config.n for c in count_by_partition(files, count)]
    except DraftdataError:  # a path only the workers see: progress without a total
        return [None] * count


def _outcomes(parts: list[PartitionState], errors: dict[int, str]) -> list[PartitionOutcome]:
    out = []
    for p in parts:
        if not p.attempts and p.index not in errors:
            continue  # not part of this command (--only)
        out.append(
            PartitionOutcome(
                index=p.index,
                state=p.state if p.index not in errors else "failed",
                nodes=[a.node for a in p.attempts],
                attempts=len(p.attempts),
                committed=p.committed,
                failed=sum(a.failed for a in p.attempts),
                tokens=sum(a.tokens for a in p.attempts),
                error=errors.get(p.index) or next((a.error for a in p.attempts if a.error), None),
                summary=p.summary,
            )
        )
    return out


def _node_totals(parts: list[PartitionState]) -> Any:
    nodes: dict[str, dict[str, float]] = {}
    for p in parts:
        for a in p.attempts:
            row = nodes.setdefault(a.node, {"committed": 0, "tokens": 0, "partitions": 0})
            row["committed"] += a.committed
            row["tokens"] += a.tokens
        if p.state == "done" and p.attempts:
            nodes[p.node]["partitions"] += 1
    return dict(sorted(nodes.items()))


def _error_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def run(
    config: GenerateConfig,
    opts: RayOptions | None = None,
    *,
    log: Callable[[str], None] | None = None,
    on_progress: Callable[[Tracker], None] | None = None,
    live: bool | None = None,
) -> RayGenerateResult:
    """Run generate over a Ray cluster: partition the prompts, one engine per fleet node, all
    writing into ``config.out``; returns per-partition and per-node outcomes.

    ``log`` receives the start-up lines and the plain progress lines (default: stderr);
    ``on_progress`` is called with the tracker at every tick (tests use it to kill a worker);
    ``live`` forces (True) or disables (False) the rich display (default: when stderr is a
    TTY). Rerunning with the same config resumes every partition; failed partitions are
    listed in the result rather than raised, so the others' work is never discarded.
    """
    opts = opts or RayOptions()
    emit = log or (lambda line: print(line, file=sys.stderr, flush=True))
    ray = cluster.require_ray()
    _check(config, opts)
    config, opts = _absolute(config, opts)
    forward = tuple(dict.fromkeys([*cluster.DEFAULT_FORWARD_ENV, *opts.forward_env]))
    started_ray = cluster.connect(opts.address, forward_env=forward)
    t0 = time.monotonic()
    reservation = None
    try:
        board = _board(ray)  # its worker starts while the nodes are probed
        found = cluster.discover(
            config.fleet, config.endpoints, opts.fleet_per_node, timeout=opts.probe_timeout_s
        )
        labels = cluster.node_labels([f.node for f in found])
        for f in found:
            what = f.error or f"{len(f.reachable)}/{len(f.urls)} endpoints answer"
            emit(f"ray node {labels[f.node.node_id]} ({f.node.ip}): {f.source}: {what}")
        nodes = cluster.fleet_nodes(found)
        count = opts.partitions or DEFAULT_PARTITIONS_PER_NODE * len(nodes)
        wanted = sorted(set(opts.only)) if opts.only else list(range(count))
        if any(not 0 <= i < count for i in wanted):
            raise ConfigError(f"--partition: indexes must lie in 0..{count - 1}")
        totals = _totals(config, count)
        board = _reset_board(ray, board, totals)
        reservation = cluster.reserve(
            [f.node for f in nodes],
            tasks_per_node=opts.tasks_per_node,
            cpus_per_task=opts.cpus_per_task,
        )
        emit(
            f"ray generate: {len(wanted)} of {count} partitions over {len(nodes)} fleet node(s), "
            f"{opts.tasks_per_node} at a time per node, into {config.out}"
        )
        task = ray.remote(run_partition)
        refs = {
            task.options(
                num_cpus=opts.cpus_per_task,
                scheduling_strategy=reservation.strategy(),
                max_retries=opts.max_retries,
                retry_exceptions=False,
            ).remote(config, Partition(i, count), opts, board, labels): i
            for i in wanted
        }
        known = [t for i, t in enumerate(totals) if i in set(wanted)]
        total = None if any(t is None for t in known) else sum(t or 0 for t in known)
        tracker = Tracker(total)
        errors, stopped_by = _monitor(
            ray, refs, board, tracker, emit, on_progress, live, config.log_interval, config.out
        )
        parts: list[PartitionState] = ray.get(board.snapshot.remote())
        recounted: set[str] = set()
        _recount_lost(parts, config.out, board, recounted)
        if recounted:
            parts = ray.get(board.snapshot.remote())
        tracker.observe(parts)
        outcomes = _outcomes(parts, errors)
        return RayGenerateResult(
            out=config.out,
            partitions=count,
            outcomes=outcomes,
            nodes=_node_totals(parts),
            committed=tracker.committed,
            tokens=tracker.tokens,
            wall_s=time.monotonic() - t0,
            interrupted=bool(stopped_by),
            signal=stopped_by,
        )
    finally:
        if reservation is not None:
            reservation.release()
        if started_ray:
            _BOARDS.clear()
            ray.shutdown()


# The board actor of this driver's Ray session (one entry): an actor is a fresh worker process,
# seconds to start, so successive commands in one process (tests, notebooks) reuse it.
_BOARDS: dict[str, Any] = {}


def _board(ray: Any) -> Any:
    """This session's progress board actor (created, without waiting, on first use)."""
    key = ray.get_runtime_context().get_job_id()
    if key not in _BOARDS:
        _BOARDS.clear()
        _BOARDS[key] = ray.remote(Board).options(num_cpus=0).remote([])
    return _BOARDS[key]


def _reset_board(ray: Any, board: Any, totals: list[int | None]) -> Any:
    """``board`` reset for this command, or a new board when that one is gone."""
    try:
        ray.get(board.reset.remote(totals), timeout=120)
        return board
    except Exception:  # the actor died (or its session ended): start a new one
        _BOARDS.clear()
        board = _board(ray)
        ray.get(board.reset.remote(totals))
        return board


def _recount_lost(parts: list[PartitionState], out: str, board: Any, done: set[str]) -> None:
    """Count once, from the store, what each lost attempt committed after its last report
    (the board receives it before the driver's next snapshot: calls from one caller keep
    their order). ``done`` holds the writers already recounted."""

    for p in parts:
        for a in p.attempts:
            if a.error != LOST or a.writer in done:
                continue
            done.add(a.writer)
            try:
                c, f, t = committed_by_writer(open_store(out), a.writer, {})
            except DraftdataError:
                continue  # the driver cannot read the store: the last report stands
            if (c, f, t) != (a.committed, a.failed, a.tokens):
                board.update.remote(p.index, a.writer, c, f, t)


def _monitor(
    ray: Any,
    refs: dict[Any, int],
    board: Any,
    tracker: Tracker,
    emit: Callable[[str], None],
    on_progress: Callable[[Tracker], None] | None,
    live: bool | None,
    log_interval: float,
    out: str,
) -> tuple[dict[int, str], int]:
    """Wait for the partition tasks, refreshing the display; returns (errors, the signal that
    interrupted it or 0)."""
    errors: dict[int, str] = {}
    recounted: set[str] = set()
    pending = list(refs)
    use_live = sys.stderr.isatty() if live is None else live
    display = None
    if use_live:
        display = Live(
            console=Console(stderr=True), refresh_per_second=REFRESH_PER_SECOND, transient=False
        )
        display.start()
    last_line = time.monotonic()
    interrupted = 0
    try:
        while pending:
            try:
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception as exc:  # the task's error, already on the board
                        errors[refs[ref]] = _error_line(exc)
                        emit(f"ray generate: partition {refs[ref]} failed: {errors[refs[ref]]}")
                parts = ray.get(board.snapshot.remote())
                _recount_lost(parts, out, board, recounted)
                tracker.observe(parts)
                if on_progress is not None:
                    on_progress(tracker)
                if display is not None:
                    display.update(render(tracker))
                elif time.monotonic() - last_line >= log_interval:
                    emit(plain_line(tracker))
                    last_line = time.monotonic()
            except (KeyboardInterrupt, Interrupted) as exc:  # the command line's handler too
                if interrupted:
                    raise
                interrupted = getattr(exc, "signum", signal.SIGINT)
                emit(
                    "ray generate: interrupted; stopping partitions (committed work is kept; "
                    "run the same command again to resume; Ctrl-C again to leave now)"
                )
                # A running engine gets KeyboardInterrupt (its graceful stop flushes what it
                # has); queued partitions never start.
                for ref in pending:
                    ray.cancel(ref)
    finally:
        if display is not None:
            display.stop()
    return errors, interrupted


def summary_lines(result: RayGenerateResult) -> list[str]:
    """The final summary: totals, one line per node, one per partition that needs attention."""
    lines = [
        f"ray generate: {result.committed} records committed ({result.tokens} output tokens) "
        f"by {len(result.outcomes)} partition(s) in {result.wall_s:.1f} s into {result.out}"
    ]
    for node, row in result.nodes.items():
        share = row["committed"] / result.committed if result.committed else 0.0
        rate = row["tokens"] / result.wall_s if result.wall_s > 0 else 0.0
        lines.append(
            f"  node {node}: {int(row['partitions'])} partition(s), {int(row['committed'])} "
            f"records ({share:.0%}), {rate:.0f} output tok/s"
        )
    for o in result.outcomes:
        if o.attempts > 1 or o.state != "done":
            where = " -> ".join(o.nodes) or "never started"
            lines.append(
                f"  partition {o.index}: {o.state} after {o.attempts} attempt(s) on {where}"
                + (f": {o.error}" if o.error and o.state != "done" else "")
            )
    if result.failed_partitions or result.interrupted:
        lines.append(
            "  to resume: run the same command again (committed work is skipped); "
            f"partitions not finished: {','.join(map(str, result.failed_partitions)) or '-'}"
        )
    return lines
