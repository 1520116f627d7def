"""`draftdata fleet sim`: run N simulated SGLang/vLLM servers in the foreground.

Parses options (``SimOptions``: a ``Setting`` field sets that ``SimConfig`` key, ``faults.KEY``
its ``FaultConfig``'s) into a SimConfig (``draftdata.sim.config``), runs
``draftdata.sim.run.serve`` until SIGINT/SIGTERM and prints each URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer

from draftdata.cli.options import SETTING, Setting, command, settings
from draftdata.cli.quiet import Quiet
from draftdata.errors import ConfigError

T = TypeVar("T", int, float)


def _pairs(values: list[str], option: str, kind: type[int] | type[float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for v in values:
        index, sep, value = v.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(index)] = kind(value)
        except ValueError as exc:
            raise ConfigError(f"{option} {v!r}: expected SERVER:VALUE, e.g. 1:3") from exc
    return out


def _means(
    values: list[str], option: str = "--mean-output-tokens-for", example: str = "PREFIX:N"
) -> dict[str, int]:
    shape = "PREFIX:N, e.g. math:6000" if example == "PREFIX:N" else f"DOMAIN:N, e.g. {example}"
    return _by_prefix(values, option, int, shape)


def _by_prefix(values: list[str], option: str, kind: type[T], shape: str) -> dict[str, T]:
    """``PREFIX:VALUE`` options -> {prefix: value}; a bad one is a ConfigError naming it."""
    out: dict[str, T] = {}
    for v in values:
        prefix, sep, value = v.rpartition(":")
        try:
            if not sep or not prefix:
                raise ValueError
            out[prefix] = kind(value)
        except ValueError as exc:
            raise ConfigError(f"{option} {v!r}: expected {shape}") from exc
    return out


def _thinking(values: list[str]) -> dict[int, bool]:
    """``--default-thinking I:on|off`` options -> {server index: enable_thinking}."""
    out: dict[int, bool] = {}
    for v in values:
        index, _, mode = v.partition(":")
        try:
            if mode not in ("on", "off"):
                raise ValueError
            out[int(index)] = mode == "on"
        except ValueError as exc:
            raise ConfigError(
                f"--default-thinking {v!r}: expected SERVER:on or SERVER:off, e.g. 1:off"
            ) from exc
    return out


class SimOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The options of ``draftdata fleet sim``, in ``--help``'s order; a ``Setting`` field sets
    that ``SimConfig`` key, ``faults.KEY`` that ``FaultConfig`` key (the rest are parsed into
    theirs, ``_sim_config``)."""

    servers: Annotated[int, typer.Option("--servers", "-n", help="How many servers to run.")] = 2
    port_base: Annotated[
        int,
        typer.Option("--port-base", help="Server i listens on PORT_BASE+i; 0 picks free ports."),
    ] = 0
    flavor: Annotated[
        str, typer.Option("--flavor", help="Response shapes: sglang or vllm."), SETTING
    ] = "sglang"
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write a fleet.yaml (engine 'sim') here once all servers listen."
        ),
    ] = None
    model: Annotated[str, typer.Option("--model", help="Served model name."), SETTING] = (
        "Qwen3.6-27B-sim"
    )
    max_running: Annotated[
        int,
        typer.Option("--max-running", help="Sequences that decode together; the rest wait."),
        SETTING,
    ] = 64
    hide_max_running: Annotated[
        bool,
        typer.Option(
            "--hide-max-running",
            help="Report max_running_requests as null in /server_info (SGLang 'auto').",
        ),
    ] = False
    dp_size: Annotated[
        int, typer.Option("--dp-size", help="DP ranks reported by /server_info."), SETTING
    ] = 1
    context_length: Annotated[
        int, typer.Option("--context-length", help="Context in tokens."), SETTING
    ] = 8192
    mean_output_tokens: Annotated[
        int,
        typer.Option("--mean-output-tokens", help="Mean of the lognormal output length."),
        SETTING,
    ] = 2700
    mean_output_tokens_for: Annotated[
        list[str],
        typer.Option(
            "--mean-output-tokens-for",
            help="PREFIX:N: requests whose last user message starts with PREFIX draw around "
            "mean N (repeatable; mixed-domain jobs).",
        ),
    ] = []
    domain_mean: Annotated[
        list[str],
        typer.Option(
            "--domain-mean",
            help="DOMAIN:N: requests whose conversation is of DOMAIN (code, math, tool, agent, "
            "general: the classifier prepare tags prompts with) draw around mean N "
            "(repeatable; answer lengths that depend on the domain).",
        ),
    ] = []
    output_sigma: Annotated[
        float,
        typer.Option(
            "--output-sigma",
            help="Spread of the lognormal output length (its sigma; 0: every answer at the mean).",
        ),
        SETTING,
    ] = 0.8
    time_scale: Annotated[
        float,
        typer.Option(
            "--time-scale",
            help="Multiply every modelled delay (0: answer at once; 0.01: 100x faster).",
        ),
        SETTING,
    ] = 1.0
    seed: Annotated[int, typer.Option("--seed", help="Seed of answers and faults."), SETTING] = 0
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="Hugging Face tokenizer folder: real prompt/output token ids via its template.",
        ),
    ] = None
    reasoning: Annotated[
        str,
        typer.Option(
            "--reasoning",
            help="parsed (reasoning field), inline (<think> in content) or off (no thinking).",
        ),
        SETTING,
    ] = "parsed"
    default_thinking: Annotated[
        list[str],
        typer.Option(
            "--default-thinking",
            help="I:on|off: server I's template defaults to thinking on or off (a server "
            "launched with other default chat-template kwargs; repeatable).",
        ),
    ] = []
    tool_call_rate: Annotated[
        float,
        typer.Option(
            "--tool-call-rate", help="Share of answers that call a tool when tools are given."
        ),
        SETTING,
    ] = 0.5
    startup_seconds: Annotated[
        float,
        typer.Option("--startup-seconds", help="/health answers 503 this long after start."),
        Setting("startup_s"),
    ] = 0.0
    fault_500: Annotated[
        float,
        typer.Option("--fault-500", help="Rate of HTTP 500 answers."),
        Setting("faults.error_500"),
    ] = 0.0
    fault_503: Annotated[
        float,
        typer.Option("--fault-503", help="Rate of HTTP 503 answers."),
        Setting("faults.error_503"),
    ] = 0.0
    fault_429: Annotated[
        float,
        typer.Option("--fault-429", help="Rate of HTTP 429 answers (with Retry-After)."),
        Setting("faults.error_429"),
    ] = 0.0
    fault_context: Annotated[
        float,
        typer.Option("--fault-context", help="Rate of injected 400 context-length errors."),
        Setting("faults.context_400"),
    ] = 0.0
    fault_400: Annotated[
        float,
        typer.Option(
            "--fault-400", help="Rate of HTTP 400 invalid-request answers (not a context length)."
        ),
        Setting("faults.error_400"),
    ] = 0.0
    bad_prompts: Annotated[
        float,
        typer.Option(
            "--bad-prompts",
            help="Share of prompts every server refuses with HTTP 400, every time (chosen by "
            "a hash of the first user message): prompts with something the server cannot take.",
        ),
        Setting("faults.bad_prompts"),
    ] = 0.0
    unsupported: Annotated[
        list[str],
        typer.Option(
            "--unsupported",
            help="NAME: refuse every chat request that carries the field NAME with HTTP 400 "
            "'Unsupported parameter: NAME' (e.g. top_k; repeatable); role:ROLE refuses every "
            "request with a message of that role ('Unsupported message role: ROLE', e.g. "
            "role:tool: a chat template that cannot take tool results).",
        ),
        SETTING,
    ] = []
    unsupported_after: Annotated[
        int,
        typer.Option(
            "--unsupported-after",
            help="Refuse the --unsupported fields only after each server's first N chat "
            "requests (a server restarted mid-run without an option).",
        ),
        SETTING,
    ] = 0
    fault_reset: Annotated[
        float,
        typer.Option("--fault-reset", help="Rate of connections reset mid-response."),
        Setting("faults.reset"),
    ] = 0.0
    fault_hang: Annotated[
        float,
        typer.Option("--fault-hang", help="Rate of requests never answered."),
        Setting("faults.hang"),
    ] = 0.0
    fault_malformed: Annotated[
        float,
        typer.Option("--fault-malformed", help="Rate of 200 answers with a truncated JSON body."),
        Setting("faults.malformed"),
    ] = 0.0
    fault_server: Annotated[
        int | None,
        typer.Option("--fault-server", help="Apply the rate faults to this server index only."),
        Setting("faults.server"),
    ] = None
    retry_after: Annotated[
        int,
        typer.Option("--retry-after", help="Retry-After seconds of 429s."),
        Setting("faults.retry_after_s"),
    ] = 1
    slow: Annotated[
        list[str],
        typer.Option(
            "--slow", help="I:FACTOR: server I's steps take FACTOR times longer (repeatable)."
        ),
    ] = []
    crash_after: Annotated[
        list[str],
        typer.Option(
            "--crash-after", help="I:N: server I crashes at its N-th request (repeatable)."
        ),
    ] = []
    restart_after: Annotated[
        float | None,
        typer.Option("--restart-after", help="A crashed server comes back after SECONDS."),
        Setting("faults.restart_after"),
    ] = None
    no_token_ids: Annotated[
        bool,
        typer.Option(
            "--no-token-ids",
            help="Ignore return_token_ids (answer without ids, as an engine that cannot).",
        ),
    ] = False
    usage: Annotated[
        str,
        typer.Option(
            "--usage",
            help="The usage each answer reports: full (the counts), none (no usage object, "
            "as a server that sends none) or zero (0 completion tokens).",
        ),
        SETTING,
    ] = "full"
    max_choices: Annotated[
        int | None,
        typer.Option(
            "--max-choices",
            min=1,
            help="Answer at most N of a request's n choices (a server that ignores n).",
        ),
        SETTING,
    ] = None
    refuse: Annotated[
        list[str],
        typer.Option(
            "--refuse",
            help="I:STATUS: server I answers every chat request with HTTP STATUS (e.g. 401, "
            "404, 501; 400: a server configured differently from the rest of the fleet) while "
            "/health and /v1/models stay fine (repeatable).",
        ),
    ] = []
    refuse_after: Annotated[
        int,
        typer.Option("--refuse-after", help="Refusing servers answer their first N chat requests."),
        Setting("faults.refuse_after"),
    ] = 0
    starting_seconds: Annotated[
        float,
        typer.Option("--starting-seconds", help="/health 503 this long after a restart."),
        Setting("faults.starting_s"),
    ] = 0.5
    spec_tokens: Annotated[
        int,
        typer.Option(
            "--spec-tokens",
            help="Decode speculatively with K draft tokens per step (0: off); counters as "
            "vLLM's /metrics or SGLang's per-request details report them.",
        ),
        SETTING,
    ] = 0
    accept_rate: Annotated[
        float,
        typer.Option(
            "--accept-rate",
            help="Probability a draft token is accepted, given the ones before it were.",
        ),
        SETTING,
    ] = 0.7
    accept_rate_for: Annotated[
        list[str],
        typer.Option(
            "--accept-rate-for",
            help="PREFIX:P: requests whose last user message starts with PREFIX accept drafts "
            "at rate P (repeatable; per-domain acceptance).",
        ),
    ] = []
    hidden_states: Annotated[
        Path | None,
        typer.Option(
            "--hidden-states",
            help="Serve hidden-state extraction as vLLM's extract_hidden_states does: "
            "/v1/completions with token ids writes each request's states under this folder "
            "and answers kv_transfer_params.hidden_states_path (vllm flavour).",
        ),
    ] = None
    hidden_layers: Annotated[
        str,
        typer.Option(
            "--hidden-layers", help="With --hidden-states: the layer ids captured, e.g. 2,18,33,36."
        ),
    ] = ""
    hidden_size: Annotated[
        int,
        typer.Option(
            "--hidden-size", help="With --hidden-states: the simulated model's hidden size."
        ),
        SETTING,
    ] = 64
    hidden_write_seconds: Annotated[
        float,
        typer.Option(
            "--hidden-write-seconds",
            help="With --hidden-states: a file is written (and its lock released) this long "
            "after the answer.",
        ),
        Setting("hidden_write_s"),
    ] = 0.0
    fault_hidden_missing: Annotated[
        float,
        typer.Option(
            "--fault-hidden-missing",
            help="Rate of hidden-state answers whose file is never written.",
        ),
        Setting("faults.hidden_missing"),
    ] = 0.0
    fault_hidden_wrong_ids: Annotated[
        float,
        typer.Option(
            "--fault-hidden-wrong-ids",
            help="Rate of hidden-state files whose token_ids are not the prompt's.",
        ),
        Setting("faults.hidden_wrong_ids"),
    ] = 0.0
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `sim` command to the fleet sub-app."""
    command(app, "sim", SimOptions)(_sim)


def _sim(opts: SimOptions) -> None:
    """Run N OpenAI-compatible simulated servers (SGLang or vLLM shaped) until Ctrl-C."""
    import asyncio

    from draftdata.sim.run import serve
    from draftdata.sim.server import SimServer

    if opts.flavor not in ("sglang", "vllm"):
        raise ConfigError(f"--flavor {opts.flavor!r}: use sglang or vllm")
    if opts.reasoning not in ("parsed", "inline", "off"):
        raise ConfigError(f"--reasoning {opts.reasoning!r}: use parsed, inline or off")
    if opts.out is not None:
        from draftdata.shared import paths

        paths.output_file(opts.out, "--out")
    if opts.tokenizer is not None:
        from draftdata.shared.tokenizer_folder import check_tokenizer_folder

        check_tokenizer_folder(str(opts.tokenizer))
    config = _sim_config(opts)

    def ready(started: list[SimServer]) -> None:
        for i, s in enumerate(started):
            typer.echo(f"server {i}: {s.url}")
        if opts.out is not None:
            typer.echo(f"fleet: {opts.out}")
        typer.echo(
            f"{len(started)} simulated {opts.flavor} servers ready; Ctrl-C to stop", err=True
        )

    asyncio.run(serve(opts.servers, config, opts.port_base, opts.out, ready))


def _hidden_layers(opts: SimOptions) -> list[int]:
    """``--hidden-layers`` of ``--hidden-states`` (whose folder is made here), else none."""
    if opts.hidden_states is None:
        return []
    from draftdata.shared import paths

    paths.output_folder(opts.hidden_states, "--hidden-states")
    if opts.flavor != "vllm":
        raise ConfigError("--hidden-states: vLLM's protocol; use --flavor vllm")
    try:
        layers = [int(x) for x in opts.hidden_layers.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--hidden-layers {opts.hidden_layers!r}: comma-separated layer ids, e.g. 2,4,5"
        ) from None
    opts.hidden_states.mkdir(parents=True, exist_ok=True)
    return layers


def _sim_config(opts: SimOptions) -> Any:
    """The validated ``SimConfig`` of the options."""
    from draftdata.sim.config import FaultConfig, SimConfig, validate

    flags = settings(opts)
    faults = FaultConfig(
        **flags.pop("faults"),
        slow={i: float(f) for i, f in _pairs(opts.slow, "--slow", float).items()},
        crash_after={i: int(n) for i, n in _pairs(opts.crash_after, "--crash-after", int).items()},
        refuse={i: int(c) for i, c in _pairs(opts.refuse, "--refuse", int).items()},
    )
    layers = _hidden_layers(opts)
    hidden = opts.hidden_states
    return validate(
        SimConfig(
            **flags,
            report_max_running=not opts.hide_max_running,
            mean_output_tokens_for=_means(opts.mean_output_tokens_for),
            domain_mean_output_tokens=_means(opts.domain_mean, "--domain-mean", "math:6000"),
            tokenizer=str(opts.tokenizer) if opts.tokenizer else None,
            default_thinking=_thinking(opts.default_thinking),
            token_ids=not opts.no_token_ids,
            accept_rate_for=_by_prefix(
                opts.accept_rate_for, "--accept-rate-for", float, "PREFIX:P, e.g. MATH:0.6"
            ),
            faults=faults,
            hidden_states=str(hidden) if hidden is not None else None,
            hidden_layers=layers,
        ),
        opts.servers,
    )
