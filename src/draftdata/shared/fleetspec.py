"""fleet.yaml: the description of a running fleet that ``generate --fleet`` reads.

Written by ``draftdata fleet up`` and ``draftdata fleet sim --out``; users may also write one by
hand for servers they started themselves (only ``endpoints[].url`` is required)::

    format: draftdata.fleet/1
    engine: sglang
    model: /models/Qwen3.6-27B
    endpoints:
      - url: http://127.0.0.1:30000
        pid: 4242                 # only for servers draftdata started
        gpu: "0"
        model: Qwen3.6-27B        # id served at /v1/models
        engine_version: 0.5.4
        context_length: 8192
        max_running_requests: 72
        log: fleet-logs/server-0.log
    hidden_states:                # only a fleet launched with `fleet up --hidden-states DIR`
      path: /shared/hs-staging    # where every server writes each request's hidden states
      layers: [2, 18, 33, 36]     # the layer ids it captures (vLLM's index space)
      connector: ExampleHiddenStatesConnector

This module reads and writes that file (the schema sits next to the records, below both
``fleet`` and ``generate``, ARCHITECTURE.md); it starts and probes nothing.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import psutil
import yaml

from draftdata.errors import ConfigError
from draftdata.support.config import convert, read_yaml

FLEET_FORMAT = "draftdata.fleet/1"


class EndpointSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One server of the fleet."""

    url: str
    pid: int | None = None
    pgid: int | None = None
    started: float | None = None
    gpu: str | None = None
    model: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    log: str | None = None


class HiddenStatesSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A fleet that extracts hidden states (``fleet up --hidden-states``): every server writes
    each request's states under ``path`` (a folder the reader must see: the same host or a
    shared file system), capturing the layer ids ``layers`` (the residual stream after that
    many decoder layers: 0 the embeddings, N the last layer before the final norm), with the
    KV connector ``connector`` (vLLM's class name, ``MODULE:CLASS`` for one of your own)."""

    path: str
    layers: list[int]
    connector: str | None = None


class FleetSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A whole fleet: what was launched and where each server listens."""

    format: str = FLEET_FORMAT
    engine: str = "custom"
    model: str | None = None
    endpoints: list[EndpointSpec] = msgspec.field(default_factory=list)
    hidden_states: HiddenStatesSpec | None = None


def process_start_time(pid: int) -> float | None:
    """The kernel's start time of ``pid`` (seconds since the epoch), None if it is gone: the
    ``started`` of an EndpointSpec, which ``fleet status/down`` compare to tell a reused pid."""

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def no_fleet_file(path: Path | str) -> ConfigError:
    """The one-line error for a fleet file that does not exist (status, down, generate)."""
    return ConfigError(
        f"{path} does not exist: no fleet is written there; start one with `draftdata fleet "
        f"up` or `draftdata fleet sim --out {path}`, or give the path of the fleet file they "
        "wrote"
    )


def read_fleet(path: Path | str) -> FleetSpec:
    """Read and validate a fleet.yaml; errors name the file and key (a missing file: one line
    saying how to make one)."""
    if not Path(path).exists():
        raise no_fleet_file(path)
    data = read_yaml(path)
    spec = convert(data, FleetSpec, str(path))
    if spec.format != FLEET_FORMAT:
        raise ConfigError(f"{path}: format {spec.format!r}; this draftdata reads {FLEET_FORMAT}")
    if not spec.endpoints:
        raise ConfigError(f"{path}: endpoints: the fleet lists no endpoint")
    return spec


def write_fleet(spec: FleetSpec, path: Path | str) -> None:
    """Write ``spec`` as YAML (atomically: temp file then rename)."""
    p = Path(path)
    data = msgspec.to_builtins(spec)
    if data.get("hidden_states") is None:  # written only for a fleet that extracts them
        data.pop("hidden_states", None)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    tmp.replace(p)
