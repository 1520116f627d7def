"""`draftdata stats DATASET`: the domain mix and shape of any dataset, as tables or JSON.

The options are ``StatsOptions``; the body checks the inputs, measures each one (a dataset's
stats, an acceptance measurement, a hidden-state set) and prints them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli.options import command
from draftdata.cli.quiet import Quiet


class StatsOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The arguments and options of ``draftdata stats``, in ``--help``'s order."""

    dataset: Annotated[
        list[str],
        typer.Argument(
            help="A run, prepare's output folder (or a prompts JSONL), tokenized parquet, a "
            "merge output, or conversations jsonl/json/parquet (SpecForge, ShareGPT, OpenAI "
            "messages); local path or s3://BUCKET/PREFIX. Several may be given. An acceptance "
            "measurement (acceptance.json, or its folder) shows the drafter's acceptance per "
            "domain; two or more are also compared side by side. A hidden-state set "
            "(hidden-states' --out) shows its samples, tokens, bytes, layers, dtype and "
            "verification, beside its dataset when both are given."
        ),
    ]
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            metavar="DIR",
            help="The target model's tokenizer folder: count chat rows' and runs' tokens with "
            "it (default: estimated from the text; tokenized sets are exact either way).",
        ),
    ] = None
    quiet: Quiet = False


def register(app: typer.Typer) -> None:
    """Add the `stats` command to `app`."""
    command(app, "stats", StatsOptions)(_stats)


def _stats(opts: StatsOptions) -> None:
    """Counts and shares per domain and source (rows, tokens, loss tokens), length
    percentiles, reasoning share, finish reasons and failures (for runs). Format is
    auto-detected."""
    import json

    from draftdata.errors import disk_errors

    _check_paths(opts)
    measured, hidden, results = _measure(opts.dataset, opts.tokenizer)
    with disk_errors("the standard output", "redirect it to another place"):
        if opts.as_json:
            typer.echo(json.dumps(results[0] if len(results) == 1 else results, indent=2))
            return
        _print(measured, hidden, results)


def _check_paths(opts: StatsOptions) -> None:
    from draftdata.shared import paths

    for url in opts.dataset:
        paths.input_path(url, "stats")
    if opts.tokenizer is not None:
        from draftdata.shared.tokenizer_folder import check_tokenizer_folder

        check_tokenizer_folder(opts.tokenizer)


def _measure(
    dataset: list[str], tokenizer: str | None
) -> tuple[dict[str, Any], set[str], list[Any]]:
    """Each input's figures: (its acceptance measurement or None, by input), the inputs that
    are hidden-state sets, and the figures in input order. An acceptance measurement is shown
    as one, beside the datasets' mix; so is a hidden-state set (hidden-states' output), beside
    the dataset it was made from."""
    from draftdata.stats import compute_stats
    from draftdata.stats.hiddenset import hidden_set_stats, is_hidden_set
    from draftdata.stats.readers import acceptance_json

    hidden = {url for url in dataset if is_hidden_set(url)}
    measured = {url: None if url in hidden else acceptance_json(url) for url in dataset}
    results: list[Any] = [
        hidden_set_stats(url)
        if url in hidden
        else msgspec.to_builtins(a)
        if a is not None
        else compute_stats(url, tokenizer)
        for url, a in measured.items()
    ]
    return measured, hidden, results


def _print(measured: dict[str, Any], hidden: set[str], results: list[Any]) -> None:
    import sys

    from draftdata.cli.acceptance import print_acceptance, print_acceptance_compare
    from draftdata.stats.render import print_hidden_set, print_stats

    for url, item in zip(measured, results, strict=True):
        a = measured[url]
        if url in hidden:
            print_hidden_set(item)
        elif a is None:
            print_stats(item)
        else:
            print_acceptance(a, None, title=url)
    found = [(u, a) for u, a in measured.items() if a is not None]
    if len(found) > 1:
        print_acceptance_compare(found)
    sys.stdout.flush()
