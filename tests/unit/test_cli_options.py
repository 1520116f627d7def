"""cli/options.py: a command's options as one typed record, and its Setting fields as config
keys."""

from __future__ import annotations

from typing import Annotated, Any

import hypothesis.strategies as st
import msgspec
import typer
from hypothesis import given
from typer.testing import CliRunner

from draftdata.cli.options import SETTING, Setting, command, settings
from draftdata.cli.quiet import Quiet


class _Options(msgspec.Struct, kw_only=True, frozen=True):
    name: Annotated[str, typer.Argument(help="A name.")]
    count: Annotated[int, typer.Option("--count", min=0, help="How many."), SETTING] = 1
    tags: Annotated[list[str], typer.Option("--tag", help="A tag."), Setting("meta.tags")] = []
    seed: Annotated[int | None, typer.Option("--seed"), Setting("meta.seed")] = None
    loud: Annotated[bool, typer.Option("--loud/--soft")] = False
    quiet: Quiet = False


def _app(seen: list[_Options]) -> typer.Typer:
    app = typer.Typer()

    def body(opts: _Options) -> None:
        """Say it."""
        seen.append(opts)
        print(f"said {opts.name}")

    command(app, "say", _Options)(body)
    app.command("other")(lambda: None)  # two commands: "say" is a subcommand
    return app


@given(
    name=st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=8),
    count=st.integers(0, 10**6),
    tags=st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
    seed=st.none() | st.integers(0, 99),
    loud=st.booleans(),
)
def test_the_body_gets_what_was_typed_and_the_settings_by_key(
    name: str, count: int, tags: list[str], seed: int | None, loud: bool
) -> None:
    seen: list[_Options] = []
    args = ["say", name, "--count", str(count), *(x for t in tags for x in ("--tag", t))]
    args += [] if seed is None else ["--seed", str(seed)]
    args += ["--loud"] if loud else []
    result = CliRunner().invoke(_app(seen), args)
    assert result.exit_code == 0, result.output
    [opts] = seen
    assert opts == _Options(name=name, count=count, tags=tags, seed=seed, loud=loud)
    assert settings(opts) == {"count": count, "meta": {"tags": tags, "seed": seed}}


def test_help_is_the_bodys_docstring_and_the_fields_options() -> None:
    result = CliRunner().invoke(_app([]), ["say", "--help"])
    assert result.exit_code == 0
    for text in ("Say it.", "--count", "--tag", "--loud", "--soft", "--quiet", "A name."):
        assert text in result.output


def test_quiet_silences_the_body_and_a_bad_value_is_a_usage_error() -> None:
    runner = CliRunner()
    assert runner.invoke(_app([]), ["say", "x"]).output == "said x\n"
    assert runner.invoke(_app([]), ["say", "x", "-q"]).output == ""
    bad: Any = runner.invoke(_app([]), ["say", "x", "--count", "-1"])
    assert bad.exit_code == 2
