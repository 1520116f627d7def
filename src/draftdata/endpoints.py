"""Probing one OpenAI-compatible inference server: health, served model, capacity and load.

Pure parsers (``parse_server_info``, ``parse_vllm_metrics``, ``parse_loads``, ``parse_models``)
turn the bodies of SGLang's ``/server_info`` (older ``/get_server_info``), ``/v1/loads`` (older
``/get_load``), vLLM's Prometheus ``/metrics`` and ``/v1/models`` into small typed values; the
async ``probe_*`` functions fetch them over a shared aiohttp session. ``fleet up`` uses them for
readiness, ``generate`` for capacity discovery and concurrency adaptation; it sits below both
(ARCHITECTURE.md) and imports nothing of draftdata.

This module never raises for a missing or unexpected endpoint: a probe that cannot tell returns
None (or a Capacity with ``None`` fields). It does not decide concurrency; the engine does.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import msgspec


class Capacity(msgspec.Struct, kw_only=True, frozen=True):
    """What a server says about how many requests it runs at once and what it serves."""

    engine: str = "unknown"  # sglang | vllm | unknown
    max_running: int | None = None  # total over data-parallel ranks
    dp_size: int = 1
    context_length: int | None = None
    model: str | None = None
    version: str | None = None


class Load(msgspec.Struct, kw_only=True, frozen=True):
    """Requests the server is running and holding in its waiting queue right now."""

    running: int
    waiting: int


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_server_info(data: Any) -> Capacity:
    """SGLang ``/server_info`` -> Capacity.

    ``max_running_requests`` may be null (auto); then the per-rank
    ``internal_states[].effective_max_running_requests_per_dp`` are summed (a rank reporting
    none counts as the mean of the others, times ``dp_size`` ranks when fewer states are
    listed).
    """
    if not isinstance(data, dict):
        return Capacity(engine="sglang")
    dp = _int(data.get("dp_size")) or 1
    states = data.get("internal_states")
    per_rank: list[int] = []
    if isinstance(states, list):
        for s in states:
            if isinstance(s, dict):
                v = _int(s.get("effective_max_running_requests_per_dp"))
                if v is not None and v > 0:
                    per_rank.append(v)
    max_running = _int(data.get("max_running_requests"))
    if per_rank:
        mean = sum(per_rank) / len(per_rank)
        ranks = max(dp, len(per_rank))
        effective = sum(per_rank) + round(mean * (ranks - len(per_rank)))
        # A configured total caps the effective one (the per-rank value can be larger when the
        # KV pool would allow more than the flag).
        max_running = min(max_running, effective) if max_running else effective
    model = data.get("served_model_name") or data.get("model_path")
    return Capacity(
        engine="sglang",
        max_running=max_running if max_running and max_running > 0 else None,
        dp_size=dp,
        context_length=_int(data.get("context_length")),
        model=model if isinstance(model, str) else None,
        version=data.get("version") if isinstance(data.get("version"), str) else None,
    )


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric's samples over its labels: ``{"vllm:num_requests_running": 3.0, ...}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def parse_vllm_metrics(text: str) -> Load | None:
    """vLLM (or SGLang with --enable-metrics) ``/metrics`` -> running/waiting, summed over
    engines and models; None when neither gauge is there."""
    m = parse_prometheus(text)
    for running_key, waiting_key in (
        ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ):
        if running_key in m or waiting_key in m:
            return Load(running=int(m.get(running_key, 0)), waiting=int(m.get(waiting_key, 0)))
    return None


def parse_loads(data: Any) -> Load | None:
    """SGLang ``/v1/loads`` (``{"loads": [{num_running_reqs, num_waiting_reqs}]}``) or the
    older ``/get_load`` list (``[{num_reqs, num_waiting_reqs}]``) -> Load summed over ranks."""
    rows: Any = data.get("loads") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        return None
    running = waiting = 0
    seen = False
    for r in rows:
        if not isinstance(r, dict):
            continue
        run = _int(r.get("num_running_reqs"))
        if run is None:
            run = _int(r.get("num_reqs"))
        wait = _int(r.get("num_waiting_reqs"))
        if run is None and wait is None:
            continue
        seen = True
        running += run or 0
        waiting += wait or 0
    return Load(running=running, waiting=waiting) if seen else None


def parse_models(data: Any) -> tuple[str | None, str | None, int | None]:
    """``/v1/models`` -> (first model id, engine from ``owned_by``, ``max_model_len``)."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list) or not data["data"]:
        return None, None, None
    first = data["data"][0]
    if not isinstance(first, dict):
        return None, None, None
    mid = first.get("id") if isinstance(first.get("id"), str) else None
    owner = first.get("owned_by")
    engine = owner if owner in ("sglang", "vllm") else None
    return mid, engine, _int(first.get("max_model_len"))


# ---------------------------------------------------------------------------------------------
# Async probes (one shared session; short timeouts; never raise for an unreachable server)


def base_url(url: str) -> str:
    """The server root of an endpoint URL: trailing slashes and a trailing ``/v1`` removed."""
    u = url.strip().rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    return u


async def _get(
    session: aiohttp.ClientSession, url: str, timeout: float
) -> tuple[int, bytes] | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


def _json(body: bytes) -> Any:
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None


async def probe_health(session: aiohttp.ClientSession, url: str, *, timeout: float = 5.0) -> bool:
    """Whether ``GET /health`` answers 200 (503 means starting or stopping)."""
    got = await _get(session, base_url(url) + "/health", timeout)
    return got is not None and got[0] == 200


async def probe_capacity(
    session: aiohttp.ClientSession, url: str, *, timeout: float = 5.0
) -> Capacity | None:
    """Discover engine, model and capacity; None when the server does not answer at all.

    Tries SGLang's ``/server_info`` then ``/get_server_info``, and ``/v1/models`` for the served
    id and context length (vLLM reports no capacity; its ``max_running`` stays None).
    """
    root = base_url(url)
    models = await _get(session, root + "/v1/models", timeout)
    if models is None:
        return None
    mid, engine, max_len = parse_models(_json(models[1])) if models[0] == 200 else (None,) * 3
    cap: Capacity | None = None
    if engine != "vllm":
        for path in ("/server_info", "/get_server_info"):
            got = await _get(session, root + path, timeout)
            if got is not None and got[0] == 200:
                data = _json(got[1])
                if isinstance(data, dict):
                    cap = parse_server_info(data)
                    break
    if cap is None:
        return Capacity(engine=engine or "unknown", model=mid, context_length=max_len)
    return msgspec.structs.replace(
        cap, model=mid or cap.model, context_length=cap.context_length or max_len
    )


async def probe_load(
    session: aiohttp.ClientSession, url: str, engine: str, *, timeout: float = 5.0
) -> Load | None:
    """Running/waiting right now: SGLang ``/v1/loads`` (or ``/get_load``), else ``/metrics``."""
    root = base_url(url)
    if engine != "vllm":
        for path in ("/v1/loads", "/get_load"):
            got = await _get(session, root + path, timeout)
            if got is not None and got[0] == 200:
                load = parse_loads(_json(got[1]))
                if load is not None:
                    return load
    got = await _get(session, root + "/metrics", timeout)
    if got is not None and got[0] == 200:
        return parse_vllm_metrics(got[1].decode("utf-8", "replace"))
    return None
