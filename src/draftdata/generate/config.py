"""Settings of ``draftdata generate``: one frozen struct, loaded from YAML plus CLI flags.

Example ``gen.yaml`` (every key optional; CLI flags win over the file)::

    prompts: prompts/part-0.jsonl
    fleet: fleet.yaml            # or endpoints: [http://127.0.0.1:30000, ...]
    out: s3://bucket/expansion_v1/
    protect: [s3://bucket/completions/]
    model: Qwen3.6-27B           # default: the id served at /v1/models
    max_tokens: 4096             # default: fill each endpoint's context
    reasoning: on                # on | off | server
    sampling: {temperature: 0.6, top_p: 0.95, top_k: 20}
    overrides:                   # per source or domain; the first match wins
      - domain: math
        max_tokens: 6144
      - source: hermes
        sampling: {temperature: 0.2}
    concurrency: auto            # or a number per endpoint
    n: 1
    partition: 0/4               # only prompts whose id hash is in partition 0 of 4

This module holds values and their validation only; the engine reads them. Every number a
setting holds is checked by one rule (``NUMBER_RULES``: finite, and within its range), so
``--temperature nan`` or ``--read-timeout -1`` is a one-line error, never a manifest with NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from draftdata.errors import ConfigError
from draftdata.generate.prompts.partition import parse_partition

Reasoning = Literal["on", "off", "server"]
ProgressMode = Literal["auto", "rich", "plain", "off"]
TokenIds = Literal["auto", "on", "off"]
Order = Literal["length", "file"]


class Sampling(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Sampling parameters sent with every request; None means "the server's default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None

    def merged(self, other: Sampling | None) -> Sampling:
        """``self`` with every field that ``other`` sets replaced."""
        if other is None:
            return self
        changes = {k: v for k, v in msgspec.structs.asdict(other).items() if v is not None}
        return msgspec.structs.replace(self, **changes)

    def body(self) -> dict[str, Any]:
        """The set fields, as request-body keys."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


class Override(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Settings for prompts of one source and/or domain (both given: both must match)."""

    source: str | None = None
    domain: str | None = None
    sampling: Sampling | None = None
    max_tokens: int | None = None
    reasoning: Reasoning | None = None

    def matches(self, source: str, domain: str) -> bool:
        """Whether a prompt of ``source``/``domain`` takes this override."""
        if self.source is None and self.domain is None:
            return False
        return (self.source is None or self.source == source) and (
            self.domain is None or self.domain == domain
        )


class GenerateConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Everything ``generate`` needs. Times are seconds."""

    prompts: str = ""
    endpoints: list[str] = msgspec.field(default_factory=list)
    fleet: str | None = None
    out: str = ""
    model: str | None = None
    max_tokens: int | None = None  # None: fill the endpoint's context (generate/engine/limits.py)
    strict_limit: bool = False  # send max_tokens as configured, never lowered to fit the context
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    reasoning: Reasoning = "server"
    keep_reasoning_history: bool = False
    overrides: list[Override] = msgspec.field(default_factory=list)
    extra_body: dict[str, Any] = msgspec.field(default_factory=dict)
    concurrency: int | Literal["auto"] = "auto"
    default_concurrency: int = 32  # auto, when the server reports no capacity
    n: int = 1
    limit: int | None = None  # only the first N prompts of the file (before partition/resume)
    partition: str | None = None  # "I/P": only prompts whose id hash falls in partition I of P
    writer_id: str | None = None  # default: <host>-<pid>-<random> (store/run.py)
    api_key_env: str | None = None
    token_ids: TokenIds = "auto"
    # store
    protect: list[str] = msgspec.field(default_factory=list)
    retry_failed: bool = False
    allow_config_change: bool = False
    allow_mixed_models: bool = False  # endpoints reporting different models (run_model.py)
    flush_records: int = 256
    flush_seconds: float = 5.0
    max_uncommitted: int = 4096  # dispatch pauses while more records wait for the store
    store_retry_max: float = 30.0  # cap of the backoff between flush retries in an outage
    lease_ttl: float = 30.0  # a dead holder's run lease expires after this heartbeat silence
    lease_wait: float = 0.0  # wait this long for a live holder to finish (0: refuse at once)
    # retries and timeouts
    max_attempts: int = 6
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    connect_timeout: float = 10.0
    read_timeout: float = 3600.0
    breaker_failures: int = 5
    probe_interval: float = 2.0
    unavailable_timeout: float = 300.0  # stop when no endpoint can serve for this long
    load_interval: float = 5.0
    # scheduling and the tail
    order: Order = "length"  # longest expected output first within the look-ahead; file: off
    lookahead: int = 4096  # prompts read ahead of dispatch (the window ``order`` sorts)
    # ... and at most this many MiB of prompt lines read ahead (queued or backing off, not
    # running): long prompts keep the read-ahead's memory bounded whatever their count
    lookahead_mib: int = 64
    hedge: bool = True
    hedge_min_age: float = 2.0
    # an endpoint that holds requests and answers none for this long (and three of the fleet's
    # mean latencies) while the others answer plenty is taken out as stalled (dispatch.py)
    stall_after: float = 60.0
    # near the end a clearly slower server starts only what it can finish in time
    # (placement.TailPlan); a pilot turns it off so that every server, the slow ones too, runs
    # full while work is queued
    tail_plan: bool = True
    prefix_steering: bool = True
    # progress and shutdown
    progress: ProgressMode = "auto"
    log_interval: float = 30.0
    metrics_interval: float = 60.0
    grace_seconds: float = 60.0

    def settings_for(self, source: str, domain: str) -> tuple[Sampling, int | None, Reasoning]:
        """Sampling, max tokens and reasoning mode for a prompt, after the first override that
        matches it."""
        for o in self.overrides:
            if o.matches(source, domain):
                return (
                    self.sampling.merged(o.sampling),
                    o.max_tokens or self.max_tokens,
                    o.reasoning or self.reasoning,
                )
        return self.sampling, self.max_tokens, self.reasoning


def validate(cfg: GenerateConfig, name: Callable[[str], str] | None = None) -> GenerateConfig:
    """Check values and combinations; raise ConfigError naming the option (``name``: how the
    command names a setting, ``config.Origins.name``: its flag, or its key in the file that
    gave it; default: its flag where it has one)."""
    name = name or option_name
    checks: list[tuple[bool, str]] = [
        (bool(cfg.prompts), "--prompts: required (a prepare JSONL file)"),
        (bool(cfg.out), "--out: required (a local path or s3:// URL for the run)"),
        (
            bool(cfg.endpoints) or cfg.fleet is not None,
            "--endpoint or --fleet: give at least one server",
        ),
        (not (cfg.endpoints and cfg.fleet), "--endpoint and --fleet: give one or the other"),
        (
            cfg.concurrency == "auto" or isinstance(cfg.concurrency, int),
            "--concurrency: use auto or a number >= 1",
        ),
        (cfg.order in ("length", "file"), f"--order: {cfg.order!r}; use length or file"),
    ]
    if cfg.partition is not None:
        parse_partition(cfg.partition)
    for i, o in enumerate(cfg.overrides):
        checks.append(
            (
                o.source is not None or o.domain is not None,
                f"overrides.{i}: give source and/or domain",
            )
        )
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"generate: {message}")
    for path, value in numbers(cfg):
        if (fault := number_fault(path.rpartition(".")[2], value)) is not None:
            raise ConfigError(f"generate: {name(path)}: {value!r} {fault}")
    _check_extra_body(cfg)
    return cfg


# The range of every number a setting may hold: (least, whether the least itself is allowed,
# most). A numeric setting without a row is a bug (tests/unit/generate/test_option_values.py).
NUMBER_RULES: dict[str, tuple[float | None, bool, float | None]] = {
    "max_tokens": (1, True, None),
    "concurrency": (1, True, None),
    "default_concurrency": (1, True, None),
    "n": (1, True, None),
    "limit": (0, True, None),
    "flush_records": (1, True, None),
    "flush_seconds": (0, True, None),
    "max_uncommitted": (1, True, None),
    "store_retry_max": (0, False, None),
    "lease_ttl": (0, False, None),
    "lease_wait": (0, True, None),
    "max_attempts": (1, True, None),
    "backoff_base": (0, True, None),
    "backoff_max": (0, True, None),
    "connect_timeout": (0, False, None),
    "read_timeout": (0, False, None),
    "breaker_failures": (1, True, None),
    "probe_interval": (0, False, None),
    "unavailable_timeout": (0, False, None),
    "load_interval": (0, False, None),
    "lookahead": (0, True, None),
    "lookahead_mib": (1, True, None),
    "hedge_min_age": (0, True, None),
    "stall_after": (0, False, None),
    "log_interval": (0, False, None),
    "metrics_interval": (0, False, None),
    "grace_seconds": (0, True, None),
    # sampling: what SGLang and vLLM accept (top_k -1 is "off"; penalties may be negative)
    "temperature": (0, True, None),
    "top_p": (0, False, 1),
    "top_k": (-1, True, None),
    "min_p": (0, True, 1),
    "presence_penalty": (-2, True, 2),
    "frequency_penalty": (-2, True, 2),
    "repetition_penalty": (0, False, None),
    "seed": (None, True, None),  # any integer (vLLM takes negative seeds)
}
# settings of gen.yaml without a command-line flag (named by their key in messages)
_NO_FLAG = frozenset(
    {
        "default_concurrency",
        "store_retry_max",
        "backoff_base",
        "backoff_max",
        "breaker_failures",
        "probe_interval",
        "load_interval",
        "hedge_min_age",
        "stall_after",
        "metrics_interval",
    }
)
_SAMPLING_FLAGS = frozenset({"temperature", "top_p", "top_k", "seed"})


def numbers(cfg: GenerateConfig) -> list[tuple[str, int | float]]:
    """Every number ``cfg`` holds, named by its path (``read_timeout``, ``sampling.top_p``,
    ``overrides.0.sampling.temperature``); booleans and unset values are not numbers."""
    out: list[tuple[str, int | float]] = []

    def walk(struct: msgspec.Struct, prefix: str) -> None:
        for field in msgspec.structs.fields(struct):
            value = getattr(struct, field.name)
            if isinstance(value, msgspec.Struct):
                walk(value, f"{prefix}{field.name}.")
            elif isinstance(value, int | float) and not isinstance(value, bool):
                out.append((prefix + field.name, value))

    walk(cfg, "")
    for i, override in enumerate(cfg.overrides):
        walk(override, f"overrides.{i}.")
    return out


def number_fault(key: str, value: float) -> str | None:
    """What is wrong with ``value`` for the setting ``key`` (None when nothing)."""
    least, inclusive, most = NUMBER_RULES[key]
    wanted = [f"{'>=' if inclusive else '>'} {least:g}" if least is not None else ""]
    wanted.append(f"<= {most:g}" if most is not None else "")
    give = f"give a number {' and '.join(w for w in wanted if w)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"is not a finite number; {give}"
    low = least is not None and (value < least or (value == least and not inclusive))
    if low or (most is not None and value > most):
        return f"is out of range; {give}"
    return None


def option_name(path: str) -> str:
    """How a message names the setting at ``path``: its flag where it has one."""
    parts = path.split(".")
    key = parts[-1]
    if len(parts) == 1 and key not in _NO_FLAG:
        return "--" + key.replace("_", "-")
    if parts == ["sampling", key] and key in _SAMPLING_FLAGS:
        return "--" + key.replace("_", "-")
    return path


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


# request fields the options own: --extra-body may not set them (it would win silently)
_OWNED = {
    "model": "--model",
    "messages": "the prompts",
    "tools": "the prompts' tools",
    "n": "--n",
    "max_tokens": "--max-tokens",
    "max_completion_tokens": "--max-tokens",
    "return_token_ids": "--token-ids",
    "return_prompt_token_ids": "--token-ids",
    "stream": "draftdata (it reads whole answers)",
}


def _check_extra_body(cfg: GenerateConfig) -> None:
    """Refuse an ``extra_body`` field that an option also sets (one line naming both)."""
    extra = cfg.extra_body
    if _non_finite(extra):
        raise ConfigError("--extra-body: NaN and Infinity are not JSON numbers; give finite values")
    for key, owner in _OWNED.items():
        if key in extra:
            raise ConfigError(f"--extra-body: {key!r} is set by {owner}; set it there instead")
    sampled = set(cfg.sampling.body())
    for o in cfg.overrides:
        if o.sampling is not None:
            sampled |= set(o.sampling.body())
    for key in sorted(sampled & set(extra)):
        flag = "--" + key.replace("_", "-")
        raise ConfigError(
            f"--extra-body: {key!r} is also set by the sampling options ({flag} / "
            f"sampling.{key}); set it in one place"
        )
    kwargs = extra.get("chat_template_kwargs")
    if cfg.reasoning != "server" and isinstance(kwargs, dict) and "enable_thinking" in kwargs:
        raise ConfigError(
            "--extra-body: chat_template_kwargs.enable_thinking is also set by --reasoning "
            f"{cfg.reasoning}; set it in one place"
        )


def parse_concurrency(value: str | None) -> int | str | None:
    """CLI ``--concurrency auto|N`` -> "auto" or an int (ConfigError otherwise)."""
    if value is None:
        return None
    if value == "auto":
        return "auto"
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--concurrency: {value!r}; use auto or a number") from None
