"""`draftdata acceptance`: how often the current drafter's tokens are accepted, per domain.

The options are ``AcceptanceOptions`` (a ``Setting`` field sets that ``AcceptanceConfig`` key);
the body checks the paths, measures and prints the table (or JSON). The table printers here are
also ``draftdata stats``'s for an acceptance measurement.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli.options import SETTING, command, settings
from draftdata.cli.quiet import Quiet


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_acceptance(result: Any, mix: dict[str, float] | None, title: str = "") -> None:
    """The per-domain table (and the suggested mix) on stdout."""
    from draftdata.support.tables import console, table

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
    from draftdata.support.tables import console, table

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


class AcceptanceOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The options of ``draftdata acceptance``, in ``--help``'s order; a ``Setting`` field sets
    that ``AcceptanceConfig`` key (``--endpoint`` and ``--domain`` are its tuples)."""

    prompts: Annotated[
        str,
        typer.Option(
            "--prompts",
            "-p",
            help="Evaluation prompts: a prompts JSONL or prepare's folder, local or s3://.",
        ),
        SETTING,
    ]
    endpoint: Annotated[
        list[str],
        typer.Option("--endpoint", "-e", help="A server that decodes speculatively (repeatable)."),
    ] = []
    fleet: Annotated[
        str | None, typer.Option("--fleet", "-f", help="fleet.yaml of the servers."), SETTING
    ] = None
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="Write acceptance.json and suggested_mix.json here (local or s3://; never "
            "overwritten).",
        ),
        SETTING,
    ] = None
    as_json: Annotated[bool, typer.Option("--json", help="Print the measurement as JSON.")] = False
    per_domain: Annotated[
        int,
        typer.Option(
            "--per-domain", help="Prompts measured per domain (the first N in file order)."
        ),
        SETTING,
    ] = 200
    domain: Annotated[
        list[str],
        typer.Option("--domain", help="Measure only this domain (repeatable; default: every one)."),
    ] = []
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Output limit per request."), SETTING
    ] = 512
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", help="Sampling temperature (default: the server's)."),
        SETTING,
    ] = None
    seed: Annotated[
        int | None, typer.Option("--seed", help="Sampling seed sent with requests."), SETTING
    ] = 0
    reasoning: Annotated[
        str,
        typer.Option("--reasoning", help="on, off or server (enable_thinking left alone)."),
        SETTING,
    ] = "server"
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            help="Requests in flight per server (default: its capacity, at most 64).",
        ),
        SETTING,
    ] = None
    chunk: Annotated[
        int | None,
        typer.Option(
            "--chunk",
            help="Prompts of one domain a server takes at a time (default: 4x its concurrency).",
        ),
        SETTING,
    ] = None
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="Read the API key from this environment variable."),
        SETTING,
    ] = None
    unavailable_timeout: Annotated[
        float,
        typer.Option(
            "--unavailable-timeout",
            help="Stop (exit 1, what was measured written) when no server can serve for this "
            "many seconds; a failing server is waited out and taken back until then.",
        ),
        SETTING,
    ] = 300.0
    min_share: Annotated[
        float,
        typer.Option("--min-share", help="The smallest share the suggested mix gives a domain."),
        SETTING,
    ] = 0.05
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `acceptance` command to `app`."""
    command(app, "acceptance", AcceptanceOptions)(_acceptance)


def _acceptance(opts: AcceptanceOptions) -> None:
    """Run evaluation prompts on servers that decode speculatively (SGLang with a draft
    model, vLLM with --speculative-config) and report, per domain, how often the drafter's
    tokens are accepted; --out also writes a mix aimed at the weakest domains."""
    import json

    from draftdata.acceptance.stage import AcceptanceConfig, measure_acceptance
    from draftdata.shared.speculation import suggest_mix

    _check_paths(opts)
    config = AcceptanceConfig(
        **settings(opts), endpoints=tuple(opts.endpoint), domains=tuple(opts.domain)
    )
    result = measure_acceptance(config, log=lambda line: typer.echo(line, err=True))
    if opts.as_json:
        typer.echo(json.dumps(msgspec.to_builtins(result), indent=2))
        return
    rates = {d: a.acceptance_rate for d, a in result.by_domain.items()}
    print_acceptance(result, suggest_mix(rates, opts.min_share))
    if opts.out:
        typer.echo(f"wrote {opts.out.rstrip('/')}/acceptance.json and suggested_mix.json")


def _check_paths(opts: AcceptanceOptions) -> None:
    from draftdata.shared import paths

    if not paths.is_remote(opts.prompts):
        paths.input_path(opts.prompts, "--prompts")
    if opts.fleet is not None:
        paths.input_file(opts.fleet, "--fleet")
    if opts.out is not None and not paths.is_remote(opts.out):
        paths.output_folder(opts.out, "--out")
