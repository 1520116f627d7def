"""Probing one OpenAI-compatible inference server: health, served model, capacity and load.

Pure parsers (``parse_server_info``, ``parse_vllm_metrics``, ``parse_vllm_kv_tokens``,
``parse_loads``, ``parse_models``) turn the bodies of SGLang's ``/server_info`` (older
``/get_server_info``), ``/v1/loads`` (older ``/get_load``), vLLM's Prometheus ``/metrics`` and
``/v1/models`` into small typed values; the
async ``probe_*`` functions fetch them over a shared aiohttp session. ``fleet up`` uses them for
readiness, ``generate`` for capacity discovery and concurrency adaptation; it sits below both
(ARCHITECTURE.md) and imports nothing of draftdata.

This module never raises for a missing or unexpected endpoint: a probe that cannot tell returns
None (or a Capacity with ``None`` fields). It does not decide concurrency; the engine does.
"""

from __future__ import annotations

import os
import re
from typing import Any

import aiohttp
import msgspec

from draftdata.errors import ConfigError


class Capacity(msgspec.Struct, kw_only=True, frozen=True):
    """What a server says about how many requests it runs at once and what it serves.

    ``max_running`` is the server's cap on running requests (a scheduling limit); ``kv_tokens``
    is how many tokens its KV cache holds (SGLang's ``max_total_tokens``, vLLM's KV blocks x
    block size), which bounds how many requests really run at once: the generation engine
    divides it by the tokens a request is expected to hold (``generate/engine/endpoint.py``).
    """

    engine: str = "unknown"  # sglang | vllm | unknown
    max_running: int | None = None  # total over data-parallel ranks
    kv_tokens: int | None = None  # total over data-parallel ranks
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


def _over_ranks(states: Any, key: str, dp: int) -> int | None:
    """The sum over data-parallel ranks of ``internal_states[].<key>``: a rank reporting none
    counts as the mean of the others, times ``dp`` ranks when fewer states are listed."""
    per_rank: list[int] = []
    if isinstance(states, list):
        for s in states:
            if isinstance(s, dict):
                v = _int(s.get(key))
                if v is not None and v > 0:
                    per_rank.append(v)
    if not per_rank:
        return None
    mean = sum(per_rank) / len(per_rank)
    ranks = max(dp, len(per_rank))
    return sum(per_rank) + round(mean * (ranks - len(per_rank)))


def parse_server_info(data: Any) -> Capacity:
    """SGLang ``/server_info`` -> Capacity.

    ``max_running_requests`` may be null (auto); then the per-rank
    ``internal_states[].effective_max_running_requests_per_dp`` are summed (``_over_ranks``).
    ``kv_tokens`` is the sum of the per-rank ``internal_states[].max_total_tokens`` (the KV
    pool; SGLang 0.5.x), else the top-level ``max_total_tokens`` (the flag, per rank) times
    the ranks.
    """
    if not isinstance(data, dict):
        return Capacity(engine="sglang")
    dp = _int(data.get("dp_size")) or 1
    states = data.get("internal_states")
    max_running = _int(data.get("max_running_requests"))
    effective = _over_ranks(states, "effective_max_running_requests_per_dp", dp)
    if effective:
        # A configured total caps the effective one (the per-rank value can be larger when the
        # KV pool would allow more than the flag).
        max_running = min(max_running, effective) if max_running else effective
    kv = _over_ranks(states, "max_total_tokens", dp)
    if kv is None and (flag := _int(data.get("max_total_tokens"))) and flag > 0:
        kv = flag * dp
    model = data.get("served_model_name") or data.get("model_path")
    return Capacity(
        engine="sglang",
        max_running=max_running if max_running and max_running > 0 else None,
        kv_tokens=kv,
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


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _label_int(labels: dict[str, str], key: str) -> int | None:
    try:
        value = int(labels.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def parse_vllm_kv_tokens(text: str) -> int | None:
    """vLLM ``/metrics`` -> the tokens its KV cache holds, summed over engines: the labels of
    the ``vllm:cache_config_info`` gauge, ``kv_cache_size_tokens`` (0.32) else
    ``num_gpu_blocks`` x ``block_size``; None when no engine tells."""
    total = 0
    for line in text.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = dict(_LABEL.findall(line[: line.rfind("}") + 1]))
        tokens = _label_int(labels, "kv_cache_size_tokens")
        blocks, size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
        if tokens is None and blocks and size:
            tokens = blocks * size
        total += tokens or 0
    return total or None


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
    id and context length. vLLM reports no running cap (its ``max_running`` stays None); its KV
    cache size comes from ``/metrics`` (``parse_vllm_kv_tokens``).
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
        kv = None
        if engine == "vllm":
            got = await _get(session, root + "/metrics", timeout)
            if got is not None and got[0] == 200:
                kv = parse_vllm_kv_tokens(got[1].decode("utf-8", "replace"))
        return Capacity(engine=engine or "unknown", model=mid, context_length=max_len, kv_tokens=kv)
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


def api_key_from_env(name: str | None) -> str | None:
    """The API key in the environment variable ``name`` (``--api-key-env``; None: no key);
    ConfigError when it is unset or empty. The key is never logged."""
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"--api-key-env: ${name} is not set or empty")
    return value
