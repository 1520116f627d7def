"""``draftdata hidden-states --ray``: one hidden-state set computed over a Ray cluster.

The samples are partitioned by id hash (generate's rule, ``generate/prompts/partition.py``) into P
partitions, and each partition is one Ray task that runs the normal stage
(``hidden/stage.py``) restricted to its partition (``HiddenConfig.partition``) into the one
``--out`` set: the same plan, manifest and index in every task (created once, compared by the
others), each sample's file committed create-only, each partition under its own lease.

- **Workers.** ``--engine transformers``: one task per GPU (``num_gpus`` = ``gpus_per_task``,
  1 by default): Ray gives each its GPU (``CUDA_VISIBLE_DEVICES``), the stage runs one worker
  on it, and a node with 8 GPUs runs 8 partitions at once. ``gpus_per_task`` 0 runs CPU
  workers (``cpus_per_task`` each: tests, small targets). ``--engine vllm``: a task per fleet
  node at a time (``tasks_per_node``), placed as ``generate --ray`` places its partitions
  (``cluster.discover`` / ``reserve``: each node's fleet, ``--fleet-per-node``), each driving
  that node's fleet; the fleet's hidden-states folder must be visible on its node.
- **Exactly once, resumable per partition.** A partition's done-set is the listing of its
  sample files, so a task Ray retries after its worker died (``max_retries``) computes only
  what its last attempt did not commit, waiting for a zombie of that attempt to release the
  partition's lease (up to 10 lease TTLs). A partition that fails (its error is a
  DraftdataError: Ray does not retry it) is listed, the others' work stands, and the same
  command (with any P) resumes every partition.
- The driver does not read samples or write files: it submits, waits and reports (one line per
  finished partition, a count of the set's files every ``log_interval`` seconds).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from draftdata.distributed import cluster
from draftdata.errors import ConfigError, DraftdataError, Interrupted
from draftdata.generate.prompts.partition import Partition
from draftdata.hidden.config import HiddenConfig

DEFAULT_PARTITIONS_PER_WORKER = 2


class RayHiddenOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How ``hidden-states --ray`` spreads the work (everything else is the HiddenConfig)."""

    address: str | None = None  # None: $RAY_ADDRESS, this machine's cluster, or a local one
    partitions: int | None = None  # None: DEFAULT_PARTITIONS_PER_WORKER per worker
    only: list[int] | None = None  # run just these partition indexes
    gpus_per_task: float = 1.0  # transformers: GPUs per partition task (0: CPU workers)
    cpus_per_task: float = 1.0
    fleet_per_node: str | None = None  # vllm: each node's fleet.yaml, resolved on that node
    tasks_per_node: int = 1  # vllm: partitions one fleet node runs at once
    max_retries: int = 3  # Ray retries of a partition whose worker or node died
    forward_env: list[str] = msgspec.field(default_factory=list)
    log_interval: float = 30.0


class PartitionResult(msgspec.Struct, kw_only=True):
    """One partition as the driver saw it end: ``done`` or ``failed`` (with the error)."""

    index: int
    state: str
    node: str | None = None
    written: int = 0
    tokens_written: int = 0
    seconds: float = 0.0
    error: str | None = None


class RayHiddenResult(msgspec.Struct, kw_only=True):
    """What a distributed hidden-states command did."""

    out: str
    partitions: int
    workers: int
    results: list[PartitionResult]
    files: int  # sample files in the set at the end
    planned: int | None  # samples the set plans (None: no partition reported it)
    wall_s: float
    interrupted: bool = False
    signal: int = 0  # the signal that interrupted it (SIGINT, SIGTERM), if one did

    @property
    def failed_partitions(self) -> list[int]:
        """Indexes of the partitions that did not finish."""
        return [r.index for r in self.results if r.state != "done"]

    @property
    def complete(self) -> bool:
        """Whether every planned sample's file is in the set."""
        return self.planned is not None and self.files >= self.planned


def run_hidden_partition(config: HiddenConfig, part: Partition, gpus: str) -> dict[str, Any]:
    """The body of one partition task (in a Ray worker): the stage on ``part`` of the samples,
    on ``gpus`` (``auto``: the GPU Ray assigned; ``cpu``), with the fleet this node sees for
    ``--engine vllm``. Returns the stage's summary as a dict, with the node's name."""
    from draftdata.hidden.stage import hidden_states

    hostname, _ip, _node = cluster.here()
    # a Ray retry may start beside a zombie of the last attempt still holding the partition's
    # lease: wait for it to finish or expire instead of failing at once
    wait = max(config.lease_wait, 10 * config.lease_ttl)
    options = dict(config.options)
    if config.engine == "vllm":
        fleet, _urls, _ = cluster.resolve_fleet(
            options.get("fleet"), [], options.pop("fleet_per_node", None)
        )
        options["fleet"] = fleet
    part_config = msgspec.structs.replace(
        config,
        partition=str(part),
        gpus=gpus,
        progress=False,
        lease_wait=wait,
        options=options,
    )
    t0 = time.monotonic()
    summary = hidden_states(part_config, log=None)
    out: dict[str, Any] = msgspec.to_builtins(summary)
    out.update(node=hostname, seconds=round(time.monotonic() - t0, 3))
    return out


def _absolute(config: HiddenConfig) -> HiddenConfig:
    """Local paths made absolute on the driver: workers run in other directories (on other
    nodes the same absolute path must exist, e.g. a shared file system)."""

    def absolute(path: str | None) -> str | None:
        if path is None or "://" in path:
            return path
        return os.path.abspath(os.path.expanduser(path))

    options = dict(config.options)
    if options.get("fleet"):
        options["fleet"] = absolute(options["fleet"])
    return msgspec.structs.replace(
        config,
        tokenized=absolute(config.tokenized) or config.tokenized,
        model=absolute(config.model) or config.model,
        out=absolute(config.out) or config.out,
        options=options,
    )


def _check(config: HiddenConfig, opts: RayHiddenOptions) -> None:
    config.validate()
    if config.partition is not None:
        raise ConfigError("--ray runs every partition (--partitions P); give no --partition I/P")
    if config.pilot is not None:
        raise ConfigError("--pilot measures one machine's rate: run it without --ray")
    if opts.partitions is not None and opts.partitions < 1:
        raise ConfigError(f"--partitions {opts.partitions}: must be at least 1")
    if opts.gpus_per_task < 0 or not opts.cpus_per_task > 0:
        raise ConfigError("--gpus-per-task must be >= 0 and --cpus-per-task > 0")
    if opts.max_retries < 0:
        raise ConfigError(f"--max-retries {opts.max_retries}: must be >= 0")


def _workers(ray: Any, config: HiddenConfig, opts: RayHiddenOptions) -> tuple[int, dict[str, Any]]:
    """How many partitions run at once, and the task options that place them."""
    if config.engine == "vllm":
        found = cluster.discover(config.options.get("fleet"), [], opts.fleet_per_node, timeout=5.0)
        nodes = cluster.fleet_nodes(found)
        reservation = cluster.reserve(
            [f.node for f in nodes],
            tasks_per_node=opts.tasks_per_node,
            cpus_per_task=opts.cpus_per_task,
        )
        place = {"num_cpus": opts.cpus_per_task, "scheduling_strategy": reservation.strategy()}
        return len(nodes) * opts.tasks_per_node, {**place, "_reservation": reservation}
    resources = ray.cluster_resources()
    if opts.gpus_per_task > 0:
        gpus = float(resources.get("GPU", 0))
        if gpus < opts.gpus_per_task:
            raise ConfigError(
                f"hidden-states --ray: the cluster has {gpus:g} GPUs; --gpus-per-task 0 runs "
                "CPU workers instead"
            )
        cluster.check_fits("hidden-states --ray", cpus=opts.cpus_per_task, gpus=opts.gpus_per_task)
        n = int(gpus // opts.gpus_per_task)
        return n, {"num_gpus": opts.gpus_per_task, "num_cpus": opts.cpus_per_task}
    cluster.check_fits("hidden-states --ray", cpus=opts.cpus_per_task)
    n = max(1, int(float(resources.get("CPU", 1)) // opts.cpus_per_task))
    return n, {"num_gpus": 0, "num_cpus": opts.cpus_per_task}


def _count_files(out: str) -> int:
    """Sample files in the set now (the done-set's listing, as the stage reads it)."""
    from draftdata.hidden.writer import HIDDEN_FOLDER
    from draftdata.store.opener import open_store

    try:
        return sum(
            1
            for k in open_store(out).list(HIDDEN_FOLDER)
            if not k.rpartition("/")[2].startswith(".")
        )
    except DraftdataError:
        return 0


def run(
    config: HiddenConfig,
    opts: RayHiddenOptions | None = None,
    *,
    log: Callable[[str], None] | None = None,
) -> RayHiddenResult:
    """Compute ``config``'s set over a Ray cluster (module docstring); failed partitions are
    listed in the result, not raised, so the others' work is never discarded."""
    opts = opts or RayHiddenOptions()
    emit = log or (lambda line: print(line, file=sys.stderr, flush=True))
    ray = cluster.require_ray()
    _check(config, opts)
    config = _absolute(config)
    if opts.fleet_per_node:
        config = msgspec.structs.replace(
            config, options={**config.options, "fleet_per_node": opts.fleet_per_node}
        )
    forward = tuple(dict.fromkeys([*cluster.DEFAULT_FORWARD_ENV, *opts.forward_env]))
    started_ray = cluster.connect(opts.address, forward_env=forward)
    t0 = time.monotonic()
    reservation = None
    interrupted = 0  # the signal that interrupted it
    try:
        workers, place = _workers(ray, config, opts)
        reservation = place.pop("_reservation", None)
        count = opts.partitions or DEFAULT_PARTITIONS_PER_WORKER * max(1, workers)
        wanted = sorted(set(opts.only)) if opts.only else list(range(count))
        if any(not 0 <= i < count for i in wanted):
            raise ConfigError(f"--partition: indexes must lie in 0..{count - 1}")
        gpus = "auto" if place.get("num_gpus", 0) > 0 else "cpu"
        emit(
            f"ray hidden-states: {len(wanted)} of {count} partitions, {workers} at a time "
            f"({config.engine} on {'one GPU' if gpus == 'auto' else 'the CPU'} each"
            f"{', one fleet node each' if config.engine == 'vllm' else ''}), into {config.out}"
        )
        task = ray.remote(run_hidden_partition)
        refs = {
            task.options(**place, max_retries=opts.max_retries, retry_exceptions=False).remote(
                config, Partition(i, count), "auto" if config.engine == "vllm" else gpus
            ): i
            for i in wanted
        }
        results: dict[int, PartitionResult] = {}
        planned: int | None = None
        pending = list(refs)
        last = time.monotonic()
        while pending:
            try:
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            except (KeyboardInterrupt, Interrupted) as exc:  # the command line's handler too
                if interrupted:
                    raise
                interrupted = getattr(exc, "signum", signal.SIGINT)
                emit(
                    "ray hidden-states: interrupted; stopping partitions (committed files are "
                    "kept; run the same command again to resume; Ctrl-C again to leave now)"
                )
                for ref in pending:
                    ray.cancel(ref)
                continue
            for ref in done:
                i = refs[ref]
                try:
                    s = ray.get(ref)
                except Exception as exc:  # the task's DraftdataError, or a lost worker
                    cause = getattr(exc, "cause", None) or exc
                    text = str(cause).strip().splitlines()
                    err = f"{type(cause).__name__}: {text[-1] if text else ''}"
                    results[i] = PartitionResult(index=i, state="failed", error=err)
                    emit(f"ray hidden-states: partition {i} failed: {err}")
                    continue
                planned = int(s["planned"])
                results[i] = PartitionResult(
                    index=i,
                    state="done",
                    node=s.get("node"),
                    written=int(s["written"]),
                    tokens_written=int(s["tokens_written"]),
                    seconds=float(s.get("seconds", 0.0)),
                )
                emit(
                    f"ray hidden-states: partition {i} done on {s.get('node')}: "
                    f"{s['written']:,} samples written, {s['tokens_written']:,} tokens"
                )
            if time.monotonic() - last >= opts.log_interval:
                last = time.monotonic()
                emit(
                    f"ray hidden-states: {_count_files(config.out):,} sample files in the set; "
                    f"{len(pending)} partition(s) running or queued"
                )
        return RayHiddenResult(
            out=config.out,
            partitions=count,
            workers=workers,
            results=[results[i] for i in sorted(results)],
            files=_count_files(config.out),
            planned=planned,
            wall_s=round(time.monotonic() - t0, 3),
            interrupted=bool(interrupted),
            signal=interrupted,
        )
    finally:
        if reservation is not None:
            reservation.release()
        if started_ray:
            ray.shutdown()


def summary_lines(result: RayHiddenResult) -> list[str]:
    """The final lines: the set's state, per node, and the partitions that need attention."""
    written = sum(r.written for r in result.results)
    tokens = sum(r.tokens_written for r in result.results)
    state = "complete" if result.complete else "not complete"
    of = f"{result.planned:,}" if result.planned is not None else "?"
    lines = [
        f"ray hidden-states: {written:,} samples written ({tokens:,} tokens) by "
        f"{len(result.results)} partition(s) in {result.wall_s:.1f} s; the set holds "
        f"{result.files:,} of {of} sample files ({state}): {result.out}"
    ]
    nodes: dict[str, list[int]] = {}
    for r in result.results:
        if r.node is not None:
            row = nodes.setdefault(r.node, [0, 0, 0])
            row[0] += 1
            row[1] += r.written
            row[2] += r.tokens_written
    for node, (parts, n, t) in sorted(nodes.items()):
        lines.append(f"  node {node}: {parts} partition(s), {n:,} samples, {t:,} tokens")
    for r in result.results:
        if r.state != "done":
            lines.append(f"  partition {r.index}: {r.state}: {r.error}")
    if result.failed_partitions or result.interrupted:
        lines.append(
            "  to resume: run the same command again (files in the set are skipped); "
            f"partitions not finished: {','.join(map(str, result.failed_partitions)) or '-'}"
        )
    return lines
