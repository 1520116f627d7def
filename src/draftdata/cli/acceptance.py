"""`draftdata acceptance`: how often the current drafter's tokens are accepted, per domain."""

from __future__ import annotations

from typing import Any

import typer

from draftdata.cli.quiet import QUIET, quietable


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_acceptance(result: Any, mix: dict[str, float] | None, title: str = "") -> None:
    """The per-domain table (and the suggested mix) on stdout."""
    from draftdata.tables import console, table

    rows = []
    for name, a in [*result.by_domain.items(), ("total", result.total)]:
        rows.append(
            [
                name,
                f"{a.prompts:,}",
                f"{a.output_tokens:,}",
                f"{a.drafts:,}",
                f"{a.draft_tokens:,}",
                f"{a.accepted_tokens:,}",
                _fmt(a.acceptance_rate),
                _fmt(a.mean_accept_length, 2),
                " ".join(f"{r:.2f}" for r in a.per_position) or "-",
                f"{mix[name]:.3f}" if mix and name in mix else "",
            ]
        )
    header = [
        "domain",
        "prompts",
        "output tok",
        "drafts",
        "draft tok",
        "accepted",
        "accept rate",
        "accept len",
        "per position",
        "suggested share",
    ]
    if not mix:
        header.pop()
        rows = [r[:-1] for r in rows]
    name = title or f"draft acceptance ({result.model or 'unknown model'})"
    console().print(table(name, header, rows))


def print_acceptance_compare(measured: list[tuple[str, Any]]) -> None:
    """Several measurements side by side: acceptance rate and length per domain."""
    from draftdata.tables import console, table

    domains: list[str] = []
    for _, a in measured:
        domains += [d for d in a.by_domain if d not in domains]
    header = ["domain"]
    for url, _ in measured:
        header += [f"rate: {url}", f"length: {url}"]
    rows = []
    for d in [*domains, "total"]:
        row = [d]
        for _, a in measured:
            fig = a.total if d == "total" else a.by_domain.get(d)
            row += [
                _fmt(fig.acceptance_rate if fig else None),
                _fmt(fig.mean_accept_length if fig else None, 2),
            ]
        rows.append(row)
    console().print(table("draft acceptance side by side", header, rows))


def register(app: typer.Typer) -> None:
    """Add the `acceptance` command to `app`."""

    @app.command("acceptance")
    @quietable
    def _cmd(
        prompts: str = typer.Option(
            ...,
            "--prompts",
            "-p",
            help="Evaluation prompts: a prompts JSONL or prepare's folder, local or s3://.",
        ),
        endpoint: list[str] = typer.Option(
            [], "--endpoint", "-e", help="A server that decodes speculatively (repeatable)."
        ),
        fleet: str | None = typer.Option(None, "--fleet", "-f", help="fleet.yaml of the servers."),
        out: str | None = typer.Option(
            None,
            "--out",
            "-o",
            help="Write acceptance.json and suggested_mix.json here (local or s3://; never "
            "overwritten).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the measurement as JSON."),
        per_domain: int = typer.Option(
            200, "--per-domain", help="Prompts measured per domain (the first N in file order)."
        ),
        domain: list[str] = typer.Option(
            [], "--domain", help="Measure only this domain (repeatable; default: every one)."
        ),
        max_tokens: int = typer.Option(512, "--max-tokens", help="Output limit per request."),
        temperature: float | None = typer.Option(
            None, "--temperature", help="Sampling temperature (default: the server's)."
        ),
        seed: int | None = typer.Option(0, "--seed", help="Sampling seed sent with requests."),
        reasoning: str = typer.Option(
            "server", "--reasoning", help="on, off or server (enable_thinking left alone)."
        ),
        concurrency: int | None = typer.Option(
            None,
            "--concurrency",
            help="Requests in flight per server (default: its capacity, at most 64).",
        ),
        chunk: int | None = typer.Option(
            None,
            "--chunk",
            help="Prompts of one domain a server takes at a time (default: 4x its concurrency).",
        ),
        api_key_env: str | None = typer.Option(
            None, "--api-key-env", help="Read the API key from this environment variable."
        ),
        unavailable_timeout: float = typer.Option(
            300.0,
            "--unavailable-timeout",
            help="Stop (exit 1, what was measured written) when no server can serve for this "
            "many seconds; a failing server is waited out and taken back until then.",
        ),
        min_share: float = typer.Option(
            0.05, "--min-share", help="The smallest share the suggested mix gives a domain."
        ),
        quiet: bool = QUIET,
    ) -> None:
        """Run evaluation prompts on servers that decode speculatively (SGLang with a draft
        model, vLLM with --speculative-config) and report, per domain, how often the drafter's
        tokens are accepted; --out also writes a mix aimed at the weakest domains."""
        import json

        import msgspec

        from draftdata import paths
        from draftdata.acceptance.stage import AcceptanceConfig, measure_acceptance
        from draftdata.speculation import suggest_mix

        if not paths.is_remote(prompts):
            paths.input_path(prompts, "--prompts")
        if fleet is not None:
            paths.input_file(fleet, "--fleet")
        if out is not None and not paths.is_remote(out):
            paths.output_folder(out, "--out")
        config = AcceptanceConfig(
            prompts=prompts,
            endpoints=tuple(endpoint),
            fleet=fleet,
            out=out,
            per_domain=per_domain,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            reasoning=reasoning,  # type: ignore[arg-type]
            concurrency=concurrency,
            chunk=chunk,
            api_key_env=api_key_env,
            unavailable_timeout=unavailable_timeout,
            min_share=min_share,
            domains=tuple(domain),
        )
        result = measure_acceptance(config, log=lambda line: typer.echo(line, err=True))
        if as_json:
            typer.echo(json.dumps(msgspec.to_builtins(result), indent=2))
            return
        mix = suggest_mix({d: a.acceptance_rate for d, a in result.by_domain.items()}, min_share)
        print_acceptance(result, mix)
        if out:
            typer.echo(f"wrote {out.rstrip('/')}/acceptance.json and suggested_mix.json")
