"""The partition task of ``generate --ray`` and the options it shares with the driver.

``run_partition`` runs in a Ray worker on a fleet node: it resolves that node's fleet, opens
the one shared run through the normal generate engine restricted to its partition, with a
writer id of its own (``p0003-<host>-<pid>-<rnd>``), and reports what it has committed to the
driver's progress board. Exactly-once comes from the store: every attempt re-opens the run and
skips what is committed, so a task Ray retries after its worker was killed regenerates only the
uncommitted tail. Each partition holds its own run lease (``store/lease.py``); a retry waits
(up to 10 lease TTLs) for a zombie of the previous attempt to finish or expire.

It does not schedule (``ray_generate`` submits the tasks) and generates nothing by itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import msgspec

from draftdata.distributed import cluster
from draftdata.distributed.progress import committed_by_writer
from draftdata.errors import DraftdataError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.prompts.partition import Partition
from draftdata.generate.stage import generate
from draftdata.store.opener import open_store
from draftdata.store.shards import default_writer_id


class RayOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How ``generate --ray`` spreads the work (everything else is the GenerateConfig)."""

    address: str | None = None  # None: $RAY_ADDRESS, this machine's cluster, or a local one
    partitions: int | None = None  # None: DEFAULT_PARTITIONS_PER_NODE per fleet node
    only: list[int] | None = None  # run just these partition indexes
    fleet_per_node: str | None = None  # e.g. /shared/fleet-{node}.yaml
    tasks_per_node: int = 1
    cpus_per_task: float = 1.0
    max_retries: int = 3  # Ray retries of a partition whose worker or node died
    report_s: float = 5.0  # how often a partition reports its committed counts
    probe_timeout_s: float = 5.0
    forward_env: list[str] = msgspec.field(default_factory=list)


def _partition_config(
    config: GenerateConfig, part: Partition, writer: str, fleet: str | None, urls: list[str]
) -> tuple[GenerateConfig, dict[str, Any]]:
    """The partition's config (this node's fleet, no live display) and the keyword arguments
    that carry the partition and writer id when the config has no field for them."""
    # a Ray retry may start beside a zombie of the partition's last attempt that still holds
    # the partition's run lease: wait for it to finish or expire instead of failing at once
    wait = max(config.lease_wait, 10 * config.lease_ttl)
    changes: dict[str, Any] = {"progress": "off", "lease_wait": wait}
    if fleet is not None:
        changes.update(fleet=fleet, endpoints=[])
    else:
        changes.update(fleet=None, endpoints=urls)
    extra = {"partition": str(part), "writer_id": writer}
    fields = set(GenerateConfig.__struct_fields__)
    changes.update({k: v for k, v in extra.items() if k in fields})
    kwargs = {k: v for k, v in extra.items() if k not in fields}
    return msgspec.structs.replace(config, **changes), kwargs


def run_partition(
    config: GenerateConfig,
    part: Partition,
    opts: RayOptions,
    board: Any,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The body of one partition task: resolve this node's fleet, run the engine on the
    partition with a fresh writer id, report committed counts to ``board``, return the
    engine's summary. Raises the engine's DraftdataError (Ray does not retry those).
    ``labels`` maps node ids to the names the driver shows (default: the hostname)."""
    import ray

    hostname, _ip, node_id = cluster.here()
    hostname = (labels or {}).get(node_id, hostname)
    writer = f"p{part.index:04d}-{default_writer_id()}"
    # Never ray.get before the engine ends: a blocked task lends its CPU to the next partition.
    board.started.remote(part.index, hostname, os.getpid(), writer)
    stop = threading.Event()
    seen: dict[str, tuple[int, int]] = {}

    def report() -> None:
        try:
            store = open_store(config.out)
            c, f, t = committed_by_writer(store, writer, seen)
        except DraftdataError:
            return  # the run may not exist yet; the engine reports real store errors
        board.update.remote(part.index, writer, c, f, t)

    def reporter() -> None:
        while not stop.wait(opts.report_s):
            report()

    thread = threading.Thread(target=reporter, name="draftdata-report", daemon=True)
    thread.start()
    try:
        fleet, urls, _ = cluster.resolve_fleet(config.fleet, config.endpoints, opts.fleet_per_node)
        part_config, kwargs = _partition_config(config, part, writer, fleet, urls)
        summary = generate(part_config, **kwargs).to_dict()
    except BaseException as exc:
        stop.set()
        report()
        ray.get(board.crashed.remote(part.index, writer, f"{type(exc).__name__}: {exc}"))
        raise
    stop.set()
    thread.join(timeout=opts.report_s + 5)
    report()
    summary = {**summary, "node": hostname, "writer": writer}
    left = summary.get("remaining")
    if summary.get("interrupted") or (isinstance(left, int) and left > 0):
        # The engine stopped early (SIGINT/SIGTERM on that node, or a cancel): committed work
        # stays, the partition is listed as unfinished and a rerun resumes it.
        why = f"stopped early with {left if left is not None else '?'} left"
        ray.get(board.crashed.remote(part.index, writer, why))
    else:
        ray.get(board.finished.remote(part.index, writer, summary))
    return summary
