"""The ``draftdata`` command line: a thin Typer app whose tree mirrors the command tree.

Each subcommand lives in its own module here (``cli/generate.py`` for ``draftdata generate``)
and does three things: parse options into one config object, call one stage function, print a
summary. Heavy imports happen inside command bodies so ``draftdata --help`` starts instantly.

Exit codes: 0 success; 1 a DraftdataError (one line on stderr, no traceback); 2 a usage error
(Typer/Click); 128 + N when signal N (SIGINT, SIGTERM) stopped the command, at whatever moment:
in its work, while it printed its summary or as it shut down, always with the one line
``STOPPED_LINE`` (``Interrupted``; one ``interrupts`` block spans the whole command); anything
else is a bug and keeps its traceback. Path options are checked
before any work (``draftdata.shared.paths``); a file-system error that still reaches ``main`` with a
file name (a folder removed under a running command), and a full, over-quota or read-only disk
with or without one (``DiskError``: the standard output under ``> file`` too), is the user's
place, not a bug, and is one line too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

import typer

from draftdata import __version__
from draftdata.cli import (
    acceptance,
    demo,
    export,
    fleet,
    generate,
    hidden_states,
    merge,
    prepare,
    report,
    run,
    stats,
    tokenize,
)
from draftdata.errors import DiskError, DraftdataError, Interrupted
from draftdata.support.workerpool import interrupts


def _no_type_after_flags() -> None:
    """``--help`` shows no ``<bool>`` after a flag (it takes no value). Typer 0.2x with Click 8.2+
    labels every option with its Python type, flags included; a flag's label is dropped here,
    once, for every command."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_draftdata", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if getattr(self, "is_bool_flag", False):
            return None
        return shown(self, ctx)

    display_type_rich._draftdata = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_no_type_after_flags()

app = typer.Typer(
    name="draftdata",
    help="Build self-distillation training data for speculative-decoding drafters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"draftdata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Build self-distillation training data for speculative-decoding drafters."""


for _module in (
    prepare,
    generate,
    export,
    tokenize,
    merge,
    hidden_states,
    stats,
    report,
    acceptance,
    demo,
):
    _module.register(app)
app.add_typer(fleet.app, name="fleet")
app.add_typer(run.app, name="run")


_FIX = "write to another place (--out, --tmp-dir, TMPDIR)"


def _flush_stdout() -> None:
    """Flush stdout; a reader that went away (``| head``) is no error, a full disk is."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()


def _quiet_stdout() -> None:
    """Point stdout at the null device: what is still buffered for a full disk would fail
    again when the interpreter exits (a second, unreadable message)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # stdout already closed or not a file
        return


# The width of ``--help`` when stdout is not a terminal. Rich then draws at 80 columns, where a
# help cell holding a long word (a path template, a list of variables) is cut with an ellipsis;
# at this width no option's help is cut, and a pipe has no terminal to overflow.
PIPED_HELP_WIDTH = 120


def _help_width() -> None:
    """Give ``--help`` a width at which nothing is cut when stdout is piped (a width the user
    set with $COLUMNS or $TERMINAL_WIDTH wins)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"):
        return
    import typer.rich_utils

    typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH


STOPPED_LINE = (
    "draftdata: stopped by {signame}; what was written is kept, and the same command run "
    "again finishes the work"
)


def _say_stopped(signum: int) -> None:
    """The line a signal ends a command with (also from a signal handler: one write)."""
    line = STOPPED_LINE.format(signame=signal.Signals(signum).name) + "\n"
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), line.encode())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map DraftdataError to exit code 1 and a
    signal to its line and 128 + the signal.

    Typer's standalone mode already turns usage errors into exit code 2 with a message.
    ``argv`` None means this process is the command (the console script, ``python -c``): a
    signal that lands after everything was said is then ignored while the interpreter shuts
    down (the command ends as it would have); a caller that passes ``argv`` gets its own
    signal handlers back.
    """
    # transformers announces on import that PyTorch is absent; draftdata needs only its
    # tokenizers, so that advice is noise in every command's output.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    _help_width()
    try:
        # one handler from here to the end: a signal in the work, in the summary or in the
        # command's own clean-up raises Interrupted (not click's KeyboardInterrupt "Aborted!"
        # or a silent 130/143); a stage's own block (a pool's) adds its action to it
        with interrupts(farewell=_say_stopped, last=argv is None):
            _command(argv)
    except Interrupted as exc:  # its worker processes are already gone
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal: the same ending
            signal.signal(sig, signal.SIG_IGN)
        with contextlib.suppress(OSError, ValueError):
            _flush_stdout()  # the summary lines it printed before, then the line
        _say_stopped(exc.signum)
        sys.exit(128 + exc.signum)


def _command(argv: list[str] | None) -> None:
    """Run the app; a file-system error or a DraftdataError becomes its one line and exit 1."""
    try:
        try:
            app(args=argv)
        finally:
            _flush_stdout()  # a full disk under `> file` shows here, not at exit
    except OSError as exc:  # a local write no stage named: full, over quota, read-only
        err = DiskError.of(exc, exc.filename or "an output file (or the standard output)", _FIX)
        if err is not None:
            _quiet_stdout()
            typer.echo(f"error: {err}", err=True)
            sys.exit(1)
        if exc.filename is None:
            raise
        where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        reason = exc.strerror or type(exc).__name__
        typer.echo(f"error: {where}: {reason}; check the path and its permissions", err=True)
        sys.exit(1)
    except DraftdataError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
