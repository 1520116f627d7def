"""The Ray cluster as draftdata sees it: connect, find the fleet nodes, reserve one slot each.

- ``require_ray()`` imports Ray or raises a one-line ConfigError saying how to install it.
- ``connect(address)`` joins a cluster (or starts a local instance) unless Ray is already
  initialised in this process (tests share one ``ray.init`` per module).
- ``discover(...)`` runs a tiny probe task on every candidate node (node affinity, no CPU):
  it resolves that node's fleet (``--fleet-per-node`` template, ``--fleet`` or ``--endpoint``
  as seen *on that node*) and checks which endpoints answer. Nodes whose fleet answers are the
  fleet nodes; when any node advertises the custom resource ``draftdata_fleet`` only those are
  candidates (``ray start --resources '{"draftdata_fleet": 1}'`` on each GPU node).
- ``reserve(nodes, ...)`` creates a placement group with one bundle pinned to each fleet node,
  so partition tasks (scheduled into "any bundle") run ``tasks_per_node`` at a time per node and
  a node that finishes early pulls the next partition: Ray does the scheduling.

It starts no inference server and runs no engine (``ray_generate`` does that).
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.error
import urllib.request
from typing import Any

import msgspec

from draftdata.errors import ConfigError, DraftdataError, FleetError
from draftdata.shared.fleetspec import read_fleet
from draftdata.support.redact import redact_url

FLEET_RESOURCE = "draftdata_fleet"
INSTALL_HINT = "pip install 'draftdata[ray]' (or: pip install 'ray[data]>=2.9')"
# Environment variables forwarded from the driver to Ray workers when set (not secrets).
DEFAULT_FORWARD_ENV = ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE")


def require_ray(option: str = "--ray") -> Any:
    """The ``ray`` module, or ConfigError (one line: how to install it) when it is missing."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{option} needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def connect(address: str | None, *, forward_env: tuple[str, ...] = ()) -> bool:
    """Join the Ray cluster at ``address`` ("auto", "HOST:PORT", "ray://HOST:10001"; None:
    ``$RAY_ADDRESS``, else the cluster started on this machine, else a new local instance).

    Returns True when this call started or joined Ray (the caller shuts it down), False when
    Ray was already initialised in this process. Environment variables named in
    ``forward_env`` that are set here travel to every worker (runtime_env).
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    env = {name: os.environ[name] for name in forward_env if name in os.environ}
    kwargs: dict[str, Any] = {"log_to_driver": True}
    if env:
        kwargs["runtime_env"] = {"env_vars": env}
    target = None if address in (None, "", "local") else address
    if address == "local":
        kwargs["include_dashboard"] = False
    try:
        ray.init(address=target, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"--ray-address {address}: cannot connect to Ray ({str(exc).splitlines()[0]}); "
            "start the cluster with `ray start --head` and pass its address, or omit the "
            "address to start a local instance"
        ) from exc
    return True


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An alive Ray node: id, address, hostname and its resources."""

    node_id: str
    ip: str
    hostname: str
    resources: dict[str, float] = msgspec.field(default_factory=dict)


class NodeFleet(msgspec.Struct, frozen=True, kw_only=True):
    """What the probe task found on one node: its fleet and which endpoints answered."""

    node: NodeInfo
    source: str  # the fleet file read, or "--endpoint"
    urls: list[str] = msgspec.field(default_factory=list)
    reachable: list[str] = msgspec.field(default_factory=list)
    error: str | None = None

    @property
    def usable(self) -> bool:
        """Whether at least one endpoint of this node answered."""
        return self.error is None and bool(self.reachable)


def alive_nodes() -> list[NodeInfo]:
    """The alive nodes of the connected cluster."""
    ray = require_ray()
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        out.append(
            NodeInfo(
                node_id=str(n["NodeID"]),
                ip=str(n.get("NodeManagerAddress", "")),
                hostname=str(n.get("NodeManagerHostname", "")),
                resources={k: float(v) for k, v in (n.get("Resources") or {}).items()},
            )
        )
    return out


def check_fits(what: str, *, cpus: float, gpus: float = 0.0) -> None:
    """ConfigError when no alive node of the cluster can run one task asking ``cpus`` CPUs and
    ``gpus`` GPUs: Ray keeps such a task pending (it waits for a node that could run it), and
    a driver waiting for its result would wait for ever. ``what`` names the command."""
    nodes = alive_nodes()
    if any(
        n.resources.get("CPU", 0.0) >= cpus and n.resources.get("GPU", 0.0) >= gpus for n in nodes
    ):
        return
    ask = f"{cpus:g} CPU" + (f" and {gpus:g} GPU" if gpus > 0 else "")
    sizes = sorted(
        {(n.resources.get("CPU", 0.0), n.resources.get("GPU", 0.0)) for n in nodes}, reverse=True
    )
    have = ", ".join(f"{c:g} CPU" + (f" {g:g} GPU" if g else "") for c, g in sizes[:4])
    raise ConfigError(
        f"{what}: no node of the Ray cluster can run one task of {ask} (its "
        f"{len(nodes)} node(s) have {have or 'nothing'}); Ray would keep every task waiting for "
        "such a node. Ask less per task, or add a node that has it"
    )


def candidate_nodes(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """Nodes advertising ``draftdata_fleet`` if any does, else every node."""
    marked = [n for n in nodes if n.resources.get(FLEET_RESOURCE, 0) > 0]
    return marked or nodes


def fill_template(template: str, *, hostname: str, ip: str, node_id: str) -> str:
    """``template`` with ``{node}``/``{host}`` (hostname), ``{ip}`` and ``{node_id}`` filled."""
    try:
        return template.format(node=hostname, host=hostname, ip=ip, node_id=node_id)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"--fleet-per-node {template!r}: bad placeholder ({exc}); use {{node}}, {{ip}} "
            "or {node_id}"
        ) from exc


def here() -> tuple[str, str, str]:
    """(hostname, ip, node id) of the node this code runs on (inside a Ray worker)."""
    ray = require_ray()
    hostname = socket.gethostname()
    ip = ray.util.get_node_ip_address()
    node_id = ray.get_runtime_context().get_node_id()
    return hostname, ip, node_id


def resolve_fleet(
    fleet: str | None, endpoints: list[str], fleet_per_node: str | None
) -> tuple[str | None, list[str], str]:
    """On the current node: (fleet path or None, endpoint URLs, description) from the
    per-node template, a fleet file (read here, so a node-local path) or endpoint URLs (which
    may use the same placeholders, e.g. ``http://{ip}:30000``)."""

    hostname, ip, node_id = here()
    if fleet_per_node:
        path: str | None = fill_template(fleet_per_node, hostname=hostname, ip=ip, node_id=node_id)
    else:
        path = fleet
    if path is not None:
        spec = read_fleet(path)
        return path, [e.url for e in spec.endpoints], path
    urls = [fill_template(u, hostname=hostname, ip=ip, node_id=node_id) for u in endpoints]
    return None, urls, "--endpoint"


def _answers(url: str, timeout: float) -> bool:
    base = url.rstrip("/")
    base = base[:-3] if base.endswith("/v1") else base
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # it answered (maybe 401 without a key): reachable
    except (OSError, ValueError):
        return False


def probe_here(
    fleet: str | None, endpoints: list[str], fleet_per_node: str | None, timeout: float
) -> NodeFleet:
    """The probe task's body: resolve this node's fleet and check each endpoint answers."""
    hostname, ip, node_id = here()
    node = NodeInfo(node_id=node_id, ip=ip, hostname=hostname)
    try:
        _, urls, source = resolve_fleet(fleet, endpoints, fleet_per_node)
    except DraftdataError as exc:
        return NodeFleet(node=node, source=fleet_per_node or fleet or "--endpoint", error=str(exc))
    reachable = [u for u in urls if _answers(u, timeout)]
    return NodeFleet(node=node, source=source, urls=urls, reachable=reachable)


def discover(
    fleet: str | None,
    endpoints: list[str],
    fleet_per_node: str | None,
    *,
    timeout: float = 5.0,
) -> list[NodeFleet]:
    """Probe every candidate node's fleet (one zero-CPU task pinned to each node)."""
    ray = require_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(probe_here)
    nodes = candidate_nodes(alive_nodes())
    refs = [
        probe.options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False),
            max_retries=1,
        ).remote(fleet, endpoints, fleet_per_node, timeout)
        for n in nodes
    ]
    found: list[NodeFleet] = ray.get(refs, timeout=timeout * 4 + 120)
    # Keep the driver's view of each node (the worker does not see its resources).
    return [msgspec.structs.replace(f, node=n) for f, n in zip(found, nodes, strict=True)]


def fleet_nodes(found: list[NodeFleet]) -> list[NodeFleet]:
    """The usable nodes, or FleetError (one line, listing what each node lacked)."""
    usable = [f for f in found if f.usable]
    if usable:
        return usable
    if not found:
        raise FleetError("--ray: the Ray cluster has no alive node")
    reasons = "; ".join(
        f"{f.node.hostname or f.node.ip}: "
        + (f.error or f"no endpoint answered ({', '.join(map(redact_url, f.urls)) or 'none'})")
        for f in found
    )
    raise FleetError(f"--ray: no node has a reachable fleet ({reasons})")


def node_labels(nodes: list[NodeInfo]) -> dict[str, str]:
    """node id -> the name progress and summaries show: the hostname, or ``host/<id6>`` where
    several nodes share one (several raylets on one machine)."""
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.hostname] = counts.get(n.hostname, 0) + 1
    return {
        n.node_id: n.hostname if counts[n.hostname] == 1 else f"{n.hostname}/{n.node_id[:6]}"
        for n in nodes
    }


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A placement group holding one bundle per fleet node; ``strategy()`` for tasks."""

    group: Any
    nodes: list[NodeInfo]
    tasks_per_node: int
    cpus_per_task: float

    def strategy(self) -> Any:
        """A scheduling strategy that runs a task in whichever bundle has room."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=-1)

    def release(self) -> None:
        """Remove the placement group (idempotent)."""
        from ray.util.placement_group import remove_placement_group

        # Already removed, or the cluster is gone: nothing left to release.
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)


def reserve(
    nodes: list[NodeInfo], *, tasks_per_node: int, cpus_per_task: float, timeout: float = 120.0
) -> Reservation:
    """Create the placement group: bundle i pinned (``node:<ip>`` resource) to node i with room
    for ``tasks_per_node`` partition tasks; wait until it is placed."""
    require_ray()
    import ray
    from ray.util.placement_group import placement_group

    if tasks_per_node < 1:
        raise ConfigError(f"--tasks-per-node: {tasks_per_node}; must be at least 1")
    bundles = []
    for n in nodes:
        bundle: dict[str, float] = {"CPU": cpus_per_task * tasks_per_node}
        pin = f"node:{n.ip}"
        if pin in n.resources:
            bundle[pin] = 0.001
        bundles.append(bundle)
    group = placement_group(bundles, strategy="SPREAD")
    try:
        ray.get(group.ready(), timeout=timeout)
    except Exception as exc:
        remove = Reservation(
            group=group, nodes=nodes, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task
        )
        remove.release()
        raise FleetError(
            f"--ray: could not reserve {cpus_per_task * tasks_per_node:g} CPU on each of "
            f"{len(nodes)} fleet node(s) within {timeout:.0f} s; free CPUs or lower "
            "--tasks-per-node"
        ) from exc
    return Reservation(
        group=group, nodes=nodes, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task
    )
