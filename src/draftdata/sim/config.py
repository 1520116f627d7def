"""Settings of the inference-server simulator: one frozen struct per concern.

``SimConfig`` describes what every simulated server is (flavour, capacity, speed, answer shape);
``FaultConfig`` describes what goes wrong and where. Both are plain msgspec Structs so tests build
them directly and the CLI builds them from its options; ``validate`` turns a bad value into a
ConfigError that names the option. The timing defaults model a dense ~27B model in bf16 on one
H100/H200-class GPU: a decode step costs ``base_step_s + per_seq_step_s * batch`` seconds, i.e.
about 20 ms at batch 1 and 30 ms at batch 64 (~2,100 output tokens/s per server at full batch),
and a prefill costs ``prefill_per_token_s`` per prompt token (~50K prompt tokens/s), stalling the
batch while it runs, as a non-chunked prefill does.

This module holds values only; the simulator itself is the rest of ``draftdata.sim``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from draftdata.errors import ConfigError
from draftdata.shared.domains import DOMAINS

Flavor = Literal["sglang", "vllm"]
ReasoningMode = Literal["parsed", "inline", "off"]
# what ``usage`` a server reports: the counts, no ``usage`` object at all, or 0 completion tokens
UsageMode = Literal["full", "none", "zero"]


class FaultConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What goes wrong. Rates are per chat request in [0, 1], drawn from a seeded generator.

    ``server`` limits the rate-based faults to one server index (None: every server).
    ``slow`` maps a server index to a factor its step time is multiplied by. ``crash_after``
    maps a server index to N: that server crashes (listening socket closed, every open
    connection dropped) when its N-th chat request arrives, once; it comes back on the same
    port after ``restart_after`` seconds (None: never) and then answers /health with 503 for
    ``starting_s`` seconds. ``refuse`` maps a server index to an HTTP status it answers every
    chat request with, after answering its first ``refuse_after`` normally, while /health and
    /v1/models stay fine (a rotated key: 401, a renamed model: 404, not OpenAI-compatible: 501,
    a server launched otherwise than the rest of its fleet: 400).
    ``error_400`` is the rate of requests refused as invalid (HTTP 400, not a context length),
    drawn per request. ``bad_prompts`` is the share of prompts refused so by every server,
    every time (chosen by a hash of the first user message, not drawn): the few a real server
    refuses for something in one prompt.
    """

    error_500: float = 0.0
    error_503: float = 0.0
    error_429: float = 0.0
    context_400: float = 0.0
    reset: float = 0.0
    hang: float = 0.0
    malformed: float = 0.0
    error_400: float = 0.0
    bad_prompts: float = 0.0
    server: int | None = None
    retry_after_s: int = 1
    slow: dict[int, float] = msgspec.field(default_factory=dict)
    crash_after: dict[int, int] = msgspec.field(default_factory=dict)
    restart_after: float | None = None
    starting_s: float = 0.5
    refuse: dict[int, int] = msgspec.field(default_factory=dict)
    refuse_after: int = 0
    # hidden states (sim/hidden.py), per /v1/completions request, drawn apart from the rates
    # above (``server`` limits them too): answered with a path whose file is never written, or
    # written with other token ids
    hidden_missing: float = 0.0
    hidden_wrong_ids: float = 0.0

    def rates(self) -> list[tuple[str, float]]:
        """The rate-based faults in the order they are drawn (one uniform draw per request)."""
        return [
            ("error_500", self.error_500),
            ("error_503", self.error_503),
            ("error_429", self.error_429),
            ("context_400", self.context_400),
            ("reset", self.reset),
            ("hang", self.hang),
            ("malformed", self.malformed),
            ("error_400", self.error_400),
        ]

    def applies_to(self, index: int) -> bool:
        """Whether the rate-based faults apply to server ``index``."""
        return self.server is None or self.server == index


class SimConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What each simulated server is. Defaults: an SGLang-served ~27B reasoning model."""

    flavor: Flavor = "sglang"
    model: str = "Qwen3.6-27B-sim"
    model_path: str = "/models/Qwen3.6-27B"
    engine_version: str | None = None
    host: str = "127.0.0.1"
    max_running: int = 64
    report_max_running: bool = True
    dp_size: int = 1
    context_length: int = 8192
    mean_output_tokens: int = 2700
    # a request whose last user message starts with PREFIX draws around this mean instead
    mean_output_tokens_for: dict[str, int] = msgspec.field(default_factory=dict)
    # ... else, when the request's conversation is of this domain (draftdata.shared.domains'
    # classifier, as prepare tags prompts), around this mean: a fleet whose answer lengths depend on
    # the domain
    domain_mean_output_tokens: dict[str, int] = msgspec.field(default_factory=dict)
    output_sigma: float = 0.8
    min_output_tokens: int = 8
    reasoning: ReasoningMode = "parsed"
    # server index -> the template's default ``enable_thinking`` on that server (a server
    # launched with other default chat-template kwargs); servers not named think unless
    # ``reasoning`` is "off". A request's own ``enable_thinking`` always wins.
    default_thinking: dict[int, bool] = msgspec.field(default_factory=dict)
    reasoning_share: float = 0.6
    tool_call_rate: float = 0.5
    cache_report: bool = True
    usage: UsageMode = "full"
    token_ids: bool = True  # False: ignore return_token_ids (an engine that cannot return ids)
    max_choices: int | None = None  # answer at most this many of ``n`` choices (None: all)
    # request fields the server does not know: a chat request carrying one is refused with
    # HTTP 400 "Unsupported parameter: NAME" (an engine or API that lacks a sampling option)
    unsupported: list[str] = msgspec.field(default_factory=list)
    unsupported_after: int = 0  # ... refused after each server's first N chat requests
    time_scale: float = 1.0
    base_step_s: float = 0.020
    per_seq_step_s: float = 0.00016
    prefill_per_token_s: float = 0.00002
    stream_interval: int = 8
    startup_s: float = 0.0
    seed: int = 0
    tokenizer: str | None = None
    # speculative decoding (sim/spec.py): K draft tokens per step (0: off), each accepted with
    # this probability given the ones before it; by last-user-message prefix as for lengths
    spec_tokens: int = 0
    accept_rate: float = 0.7
    accept_rate_for: dict[str, float] = msgspec.field(default_factory=dict)
    # hidden-state extraction (sim/hidden.py): vLLM's extract_hidden_states protocol on
    # /v1/completions, files written under this folder (None: no /v1/completions route)
    hidden_states: str | None = None
    hidden_layers: list[int] = msgspec.field(default_factory=list)
    hidden_size: int = 64
    hidden_write_s: float = 0.0  # the lock is held this long after the answer, then the file
    faults: FaultConfig = msgspec.field(default_factory=FaultConfig)

    @property
    def version(self) -> str:
        """The engine version the server reports."""
        if self.engine_version:
            return self.engine_version
        return "0.5.4" if self.flavor == "sglang" else "0.11.0"

    def accept_rate_of(self, last_user: str) -> float:
        """The per-position acceptance probability of a request (its last user message)."""
        return next(
            (r for p, r in self.accept_rate_for.items() if last_user.startswith(p)),
            self.accept_rate,
        )

    def step_s(self, batch: int, slow: float = 1.0) -> float:
        """Wall-clock seconds of one decode step at ``batch`` running sequences."""
        return (self.base_step_s + self.per_seq_step_s * batch) * self.time_scale * slow


ROLES = ("system", "user", "assistant", "tool", "developer")  # the message roles it takes

_FLAGS = {
    "error_500": "500",
    "error_503": "503",
    "error_429": "429",
    "error_400": "400",
    "context_400": "context",
}


def validate(config: SimConfig, servers: int = 1) -> SimConfig:
    """Check every value; raise ConfigError naming the option and the allowed range."""
    checks: list[tuple[bool, str]] = [
        (config.flavor in ("sglang", "vllm"), f"--flavor: {config.flavor!r}; use sglang or vllm"),
        (
            config.reasoning in ("parsed", "inline", "off"),
            f"--reasoning: {config.reasoning!r}; use parsed, inline or off",
        ),
        (
            config.usage in ("full", "none", "zero"),
            f"--usage: {config.usage!r}; use full, none or zero",
        ),
        (config.max_running >= 1, "--max-running: must be at least 1"),
        (config.dp_size >= 1, "--dp-size: must be at least 1"),
        (config.context_length >= 16, "--context-length: must be at least 16"),
        (config.mean_output_tokens >= 1, "--mean-output-tokens: must be at least 1"),
        (
            all(n >= 1 for n in config.mean_output_tokens_for.values()),
            "--mean-output-tokens-for: every mean must be at least 1",
        ),
        (
            all(n >= 1 for n in config.domain_mean_output_tokens.values()),
            "--domain-mean: every mean must be at least 1",
        ),
        (
            not (unknown := sorted(set(config.domain_mean_output_tokens) - set(DOMAINS))),
            f"--domain-mean: {', '.join(unknown)} is no domain of the classifier; use "
            + ", ".join(DOMAINS),
        ),
        (
            0 <= config.output_sigma <= 4,
            f"--output-sigma: {config.output_sigma} is not in [0, 4]",
        ),
        (config.time_scale >= 0, "--time-scale: must be >= 0 (0 answers without delay)"),
        (config.stream_interval >= 1, "stream_interval: must be at least 1"),
        (0 <= config.tool_call_rate <= 1, "--tool-call-rate: must be in [0, 1]"),
        (0 <= config.reasoning_share < 1, "reasoning_share: must be in [0, 1)"),
        (servers >= 1, "--servers: must be at least 1"),
        (0 <= config.spec_tokens <= 64, "--spec-tokens: must be in [0, 64]"),
        (0 <= config.accept_rate <= 1, "--accept-rate: must be in [0, 1]"),
        (
            all(0 <= r <= 1 for r in config.accept_rate_for.values()),
            "--accept-rate-for: every rate must be in [0, 1]",
        ),
    ]
    f = config.faults
    for name, rate in f.rates():
        checks.append(
            (0 <= rate <= 1, f"--fault-{_FLAGS.get(name, name)}: {rate} is not in [0, 1]")
        )
    total = sum(rate for _, rate in f.rates())
    checks.append((total <= 1, f"fault rates add up to {total:.3f}; their sum must be <= 1"))
    if f.server is not None:
        checks.append(
            (0 <= f.server < servers, f"--fault-server: {f.server} is not a server index")
        )
    for name in config.unsupported:
        checks.append((bool(name.strip()), "--unsupported: give a request field's name"))
        role = name.removeprefix("role:") if name.startswith("role:") else None
        checks.append(  # a role no message can have would refuse nothing, silently
            (
                role is None or role in ROLES,
                f"--unsupported: {name!r} names no message role; use role:ROLE with ROLE one "
                f"of {', '.join(ROLES)}",
            )
        )
    checks.append((config.unsupported_after >= 0, "--unsupported-after: must be >= 0"))
    for index in config.default_thinking:
        checks.append((0 <= index < servers, f"--default-thinking: {index} is not a server index"))
    for index, factor in f.slow.items():
        checks.append((0 <= index < servers, f"--slow: {index} is not a server index"))
        checks.append((factor > 0, f"--slow: factor {factor} must be > 0"))
    for index, n in f.crash_after.items():
        checks.append((0 <= index < servers, f"--crash-after: {index} is not a server index"))
        checks.append((n >= 1, f"--crash-after: N={n} must be at least 1"))
    for index, status in f.refuse.items():
        checks.append((0 <= index < servers, f"--refuse: {index} is not a server index"))
        checks.append((400 <= status <= 599, f"--refuse: status {status} is not in 400-599"))
    checks.append((f.refuse_after >= 0, "--refuse-after: must be >= 0"))
    checks.append((0 <= f.bad_prompts <= 1, f"--bad-prompts: {f.bad_prompts} is not in [0, 1]"))
    for name, rate in (("missing", f.hidden_missing), ("wrong-ids", f.hidden_wrong_ids)):
        checks.append((0 <= rate <= 1, f"--fault-hidden-{name}: {rate} is not in [0, 1]"))
    if config.hidden_states is not None:
        checks.append(
            (bool(config.hidden_layers), "--hidden-states: give the layers (--hidden-layers)")
        )
        checks.append((all(i >= 0 for i in config.hidden_layers), "--hidden-layers: ids are >= 0"))
        checks.append((config.hidden_size >= 1, "--hidden-size: must be at least 1"))
        checks.append((config.hidden_write_s >= 0, "--hidden-write-seconds: must be >= 0"))
    if f.restart_after is not None:
        checks.append((f.restart_after >= 0, "--restart-after: must be >= 0"))
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"fleet sim: {message}")
    return config
