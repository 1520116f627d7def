"""`draftdata run check RUN [--quarantine]`: read every shard of a run; set unreadable ones aside.

Parses the options (``CheckOptions``), calls ``draftdata.store.check.check_run`` and prints one
line per unreadable shard and what to do. Exit 0 when every shard reads (or every unreadable
one is set aside now or was before), 1 when unreadable shards are left in the run or a shard
could not be read now because the store failed the read (run the check again; such a shard is
never set aside).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from draftdata.cli.options import command
from draftdata.cli.quiet import Quiet

app = typer.Typer(help="Look after a generate run: check its shards.", no_args_is_help=True)


class CheckOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The argument and options of ``draftdata run check``, in ``--help``'s order."""

    run: Annotated[
        str,
        typer.Argument(metavar="RUN_URL", help="The generate run: a folder or s3://BUCKET/PREFIX."),
    ]
    quarantine: Annotated[
        bool,
        typer.Option(
            "--quarantine",
            help="Set every unreadable shard aside (a marker under quarantine/; nothing is "
            "deleted): readers then leave it out and the same generate command generates its "
            "prompts again.",
        ),
    ] = False
    quiet: Quiet = False


def _check(opts: CheckOptions) -> None:
    """Read every completions and failures shard in full (pages, checksums, rows) and list
    the ones that cannot be read."""
    from draftdata.shared import paths
    from draftdata.store.check import check_run

    paths.input_folder(opts.run, "run check", "give a run (generate's --out)")
    result = check_run(opts.run, quarantine=opts.quarantine)
    _print(result)
    if code := _exit_code(result, quarantine=opts.quarantine):
        raise typer.Exit(code)


command(app, "check", CheckOptions)(_check)


def _print(result: Any) -> None:
    """The line of what was read and one line per shard that was not."""
    typer.echo(
        f"run check: {result.shards:,} shard(s) read in full, {result.rows:,} rows; "
        f"{len(result.bad)} unreadable"
        + (f"; {len(result.unread)} not read now (retry)" if result.unread else "")
        + (f"; {len(result.earlier)} set aside before (quarantine/)" if result.earlier else "")
    )
    for bad in result.bad:
        rows = f"{bad.rows:,} rows" if bad.rows is not None else "rows unknown"
        state = "set aside now" if bad.key in result.now else "unreadable"
        typer.echo(f"  {bad.key} ({rows}): {state}: {bad.reason}")
    for later in result.unread:
        typer.echo(f"  {later.key}: {later.reason}")


def _exit_code(result: Any, *, quarantine: bool) -> int:
    """0 when nothing unreadable is left in the run, else 1 with what to do on stderr."""
    if result.unread:
        typer.echo(
            f"error: {len(result.unread)} shard(s) not read now: the store failed the read "
            "(throttling, 5xx, a dropped connection), not the shard; nothing was set aside "
            f"for them; run `draftdata run check {result.url}"
            + (" --quarantine" if quarantine else "")
            + "` again",
            err=True,
        )
        return 1
    if not result.bad:
        return 0
    if quarantine:
        typer.echo(
            f"run check: {len(result.now)} shard(s) set aside; run the same generate command "
            "to generate their prompts again"
        )
        return 0
    typer.echo(
        f"error: {len(result.bad)} unreadable shard(s); set them aside with `draftdata run "
        f"check {result.url} --quarantine`, then run the same generate command",
        err=True,
    )
    return 1
