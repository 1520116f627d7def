"""`draftdata fleet sim`: run N simulated SGLang/vLLM servers in the foreground.

Parses options into a SimConfig (``draftdata.sim.config``), runs
``draftdata.sim.run.serve`` until SIGINT/SIGTERM and prints each URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import typer

from draftdata.cli.quiet import QUIET, quietable
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


def register(app: typer.Typer) -> None:
    """Add the `sim` command to the fleet sub-app."""

    @app.command("sim")
    @quietable
    def sim(
        servers: int = typer.Option(2, "--servers", "-n", help="How many servers to run."),
        port_base: int = typer.Option(
            0, "--port-base", help="Server i listens on PORT_BASE+i; 0 picks free ports."
        ),
        flavor: str = typer.Option("sglang", "--flavor", help="Response shapes: sglang or vllm."),
        out: Path | None = typer.Option(
            None, "--out", help="Write a fleet.yaml (engine 'sim') here once all servers listen."
        ),
        model: str = typer.Option("Qwen3.6-27B-sim", "--model", help="Served model name."),
        max_running: int = typer.Option(
            64, "--max-running", help="Sequences that decode together; the rest wait."
        ),
        hide_max_running: bool = typer.Option(
            False,
            "--hide-max-running",
            help="Report max_running_requests as null in /server_info (SGLang 'auto').",
        ),
        dp_size: int = typer.Option(1, "--dp-size", help="DP ranks reported by /server_info."),
        context_length: int = typer.Option(8192, "--context-length", help="Context in tokens."),
        mean_output_tokens: int = typer.Option(
            2700, "--mean-output-tokens", help="Mean of the lognormal output length."
        ),
        mean_output_tokens_for: list[str] = typer.Option(
            [],
            "--mean-output-tokens-for",
            help="PREFIX:N: requests whose last user message starts with PREFIX draw around "
            "mean N (repeatable; mixed-domain jobs).",
        ),
        domain_mean: list[str] = typer.Option(
            [],
            "--domain-mean",
            help="DOMAIN:N: requests whose conversation is of DOMAIN (code, math, tool, agent, "
            "general: the classifier prepare tags prompts with) draw around mean N "
            "(repeatable; answer lengths that depend on the domain).",
        ),
        output_sigma: float = typer.Option(
            0.8,
            "--output-sigma",
            help="Spread of the lognormal output length (its sigma; 0: every answer at the mean).",
        ),
        time_scale: float = typer.Option(
            1.0,
            "--time-scale",
            help="Multiply every modelled delay (0: answer at once; 0.01: 100x faster).",
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of answers and faults."),
        tokenizer: Path | None = typer.Option(
            None,
            "--tokenizer",
            help="Hugging Face tokenizer folder: real prompt/output token ids via its template.",
        ),
        reasoning: str = typer.Option(
            "parsed",
            "--reasoning",
            help="parsed (reasoning field), inline (<think> in content) or off (no thinking).",
        ),
        default_thinking: list[str] = typer.Option(
            [],
            "--default-thinking",
            help="I:on|off: server I's template defaults to thinking on or off (a server "
            "launched with other default chat-template kwargs; repeatable).",
        ),
        tool_call_rate: float = typer.Option(
            0.5, "--tool-call-rate", help="Share of answers that call a tool when tools are given."
        ),
        startup_seconds: float = typer.Option(
            0.0, "--startup-seconds", help="/health answers 503 this long after start."
        ),
        fault_500: float = typer.Option(0.0, "--fault-500", help="Rate of HTTP 500 answers."),
        fault_503: float = typer.Option(0.0, "--fault-503", help="Rate of HTTP 503 answers."),
        fault_429: float = typer.Option(
            0.0, "--fault-429", help="Rate of HTTP 429 answers (with Retry-After)."
        ),
        fault_context: float = typer.Option(
            0.0, "--fault-context", help="Rate of injected 400 context-length errors."
        ),
        fault_400: float = typer.Option(
            0.0,
            "--fault-400",
            help="Rate of HTTP 400 invalid-request answers (not a context length).",
        ),
        unsupported: list[str] = typer.Option(
            [],
            "--unsupported",
            help="NAME: refuse every chat request that carries the field NAME with HTTP 400 "
            "'Unsupported parameter: NAME' (e.g. top_k; repeatable).",
        ),
        fault_reset: float = typer.Option(
            0.0, "--fault-reset", help="Rate of connections reset mid-response."
        ),
        fault_hang: float = typer.Option(
            0.0, "--fault-hang", help="Rate of requests never answered."
        ),
        fault_malformed: float = typer.Option(
            0.0, "--fault-malformed", help="Rate of 200 answers with a truncated JSON body."
        ),
        fault_server: int | None = typer.Option(
            None, "--fault-server", help="Apply the rate faults to this server index only."
        ),
        retry_after: int = typer.Option(1, "--retry-after", help="Retry-After seconds of 429s."),
        slow: list[str] = typer.Option(
            [], "--slow", help="I:FACTOR: server I's steps take FACTOR times longer (repeatable)."
        ),
        crash_after: list[str] = typer.Option(
            [], "--crash-after", help="I:N: server I crashes at its N-th request (repeatable)."
        ),
        restart_after: float | None = typer.Option(
            None, "--restart-after", help="A crashed server comes back after SECONDS."
        ),
        no_token_ids: bool = typer.Option(
            False,
            "--no-token-ids",
            help="Ignore return_token_ids (answer without ids, as an engine that cannot).",
        ),
        usage: str = typer.Option(
            "full",
            "--usage",
            help="The usage each answer reports: full (the counts), none (no usage object, "
            "as a server that sends none) or zero (0 completion tokens).",
        ),
        max_choices: int | None = typer.Option(
            None,
            "--max-choices",
            min=1,
            help="Answer at most N of a request's n choices (a server that ignores n).",
        ),
        refuse: list[str] = typer.Option(
            [],
            "--refuse",
            help="I:STATUS: server I answers every chat request with HTTP STATUS (e.g. 401, "
            "404, 501) while /health and /v1/models stay fine (repeatable).",
        ),
        refuse_after: int = typer.Option(
            0, "--refuse-after", help="Refusing servers answer their first N chat requests."
        ),
        starting_seconds: float = typer.Option(
            0.5, "--starting-seconds", help="/health 503 this long after a restart."
        ),
        spec_tokens: int = typer.Option(
            0,
            "--spec-tokens",
            help="Decode speculatively with K draft tokens per step (0: off); counters as "
            "vLLM's /metrics or SGLang's per-request details report them.",
        ),
        accept_rate: float = typer.Option(
            0.7,
            "--accept-rate",
            help="Probability a draft token is accepted, given the ones before it were.",
        ),
        accept_rate_for: list[str] = typer.Option(
            [],
            "--accept-rate-for",
            help="PREFIX:P: requests whose last user message starts with PREFIX accept drafts "
            "at rate P (repeatable; per-domain acceptance).",
        ),
        hidden_states: Path | None = typer.Option(
            None,
            "--hidden-states",
            help="Serve hidden-state extraction as vLLM's extract_hidden_states does: "
            "/v1/completions with token ids writes each request's states under this folder "
            "and answers kv_transfer_params.hidden_states_path (vllm flavour).",
        ),
        hidden_layers: str = typer.Option(
            "",
            "--hidden-layers",
            help="With --hidden-states: the layer ids captured, e.g. 2,18,33,36.",
        ),
        hidden_size: int = typer.Option(
            64, "--hidden-size", help="With --hidden-states: the simulated model's hidden size."
        ),
        hidden_write_seconds: float = typer.Option(
            0.0,
            "--hidden-write-seconds",
            help="With --hidden-states: a file is written (and its lock released) this long "
            "after the answer.",
        ),
        fault_hidden_missing: float = typer.Option(
            0.0,
            "--fault-hidden-missing",
            help="Rate of hidden-state answers whose file is never written.",
        ),
        fault_hidden_wrong_ids: float = typer.Option(
            0.0,
            "--fault-hidden-wrong-ids",
            help="Rate of hidden-state files whose token_ids are not the prompt's.",
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Run N OpenAI-compatible simulated servers (SGLang or vLLM shaped) until Ctrl-C."""
        import asyncio

        from draftdata.sim.config import FaultConfig, SimConfig, validate
        from draftdata.sim.run import serve
        from draftdata.sim.server import SimServer

        if flavor not in ("sglang", "vllm"):
            raise ConfigError(f"--flavor {flavor!r}: use sglang or vllm")
        if reasoning not in ("parsed", "inline", "off"):
            raise ConfigError(f"--reasoning {reasoning!r}: use parsed, inline or off")
        if out is not None:
            from draftdata import paths

            paths.output_file(out, "--out")
        if tokenizer is not None:
            from draftdata.tokenizer_folder import check_tokenizer_folder

            check_tokenizer_folder(str(tokenizer))
        faults = FaultConfig(
            error_500=fault_500,
            error_503=fault_503,
            error_429=fault_429,
            context_400=fault_context,
            error_400=fault_400,
            reset=fault_reset,
            hang=fault_hang,
            malformed=fault_malformed,
            server=fault_server,
            retry_after_s=retry_after,
            slow={i: float(f) for i, f in _pairs(slow, "--slow", float).items()},
            crash_after={i: int(n) for i, n in _pairs(crash_after, "--crash-after", int).items()},
            restart_after=restart_after,
            starting_s=starting_seconds,
            refuse={i: int(c) for i, c in _pairs(refuse, "--refuse", int).items()},
            refuse_after=refuse_after,
            hidden_missing=fault_hidden_missing,
            hidden_wrong_ids=fault_hidden_wrong_ids,
        )
        layers: list[int] = []
        if hidden_states is not None:
            from draftdata import paths

            paths.output_folder(hidden_states, "--hidden-states")
            if flavor != "vllm":
                raise ConfigError("--hidden-states: vLLM's protocol; use --flavor vllm")
            try:
                layers = [int(x) for x in hidden_layers.split(",") if x.strip()]
            except ValueError:
                raise ConfigError(
                    f"--hidden-layers {hidden_layers!r}: comma-separated layer ids, e.g. 2,4,5"
                ) from None
            hidden_states.mkdir(parents=True, exist_ok=True)
        config = validate(
            SimConfig(
                flavor=flavor,  # type: ignore[arg-type]
                model=model,
                max_running=max_running,
                report_max_running=not hide_max_running,
                dp_size=dp_size,
                context_length=context_length,
                mean_output_tokens=mean_output_tokens,
                mean_output_tokens_for=_means(mean_output_tokens_for),
                domain_mean_output_tokens=_means(domain_mean, "--domain-mean", "math:6000"),
                output_sigma=output_sigma,
                time_scale=time_scale,
                seed=seed,
                tokenizer=str(tokenizer) if tokenizer else None,
                reasoning=reasoning,  # type: ignore[arg-type]
                default_thinking=_thinking(default_thinking),
                tool_call_rate=tool_call_rate,
                startup_s=startup_seconds,
                token_ids=not no_token_ids,
                usage=usage,  # type: ignore[arg-type]
                max_choices=max_choices,
                unsupported=list(unsupported),
                spec_tokens=spec_tokens,
                accept_rate=accept_rate,
                accept_rate_for=_by_prefix(
                    accept_rate_for, "--accept-rate-for", float, "PREFIX:P, e.g. MATH:0.6"
                ),
                faults=faults,
                hidden_states=str(hidden_states) if hidden_states is not None else None,
                hidden_layers=layers,
                hidden_size=hidden_size,
                hidden_write_s=hidden_write_seconds,
            ),
            servers,
        )

        def ready(started: list[SimServer]) -> None:
            for i, s in enumerate(started):
                typer.echo(f"server {i}: {s.url}")
            if out is not None:
                typer.echo(f"fleet: {out}")
            typer.echo(f"{len(started)} simulated {flavor} servers ready; Ctrl-C to stop", err=True)

        asyncio.run(serve(servers, config, port_base, out, ready))
