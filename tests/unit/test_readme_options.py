"""Every option of every command is documented (README.md or a page under docs/), and the README
opens with the two commands."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main

from draftdata.cli import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _docs_text() -> str:
    """README.md and every page under docs/, the places an option may be documented."""
    pages = [README, *sorted((ROOT / "docs").glob("**/*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)


# Typer ships its own copy of click, so commands are walked by shape, not by click's classes.
def _commands(cmd: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, f"{path} {name}")


def _long_options(cmd: Any) -> Iterator[str]:
    for param in cmd.params:
        if param.param_type_name == "option":
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--") and opt != "--help":
                    yield opt


def test_every_option_is_documented() -> None:
    text = _docs_text()
    missing = [
        f"{path}: {opt}"
        for path, cmd in _commands(typer.main.get_command(app), "draftdata")
        for opt in _long_options(cmd)
        if not re.search(re.escape(opt) + r"(?![\w-])", text)
    ]
    assert missing == []


def test_every_generate_config_key_is_an_option_or_documented() -> None:
    """A gen.yaml key is a generate option (``--max-tokens`` for ``max_tokens``, ``--endpoint``
    for ``endpoints``, ``--no-hedge`` for ``hedge``) or has its row in docs/generate.md's table
    of the keys without one."""
    from draftdata.generate.config import GenerateConfig

    options = set(_long_options(typer.main.get_command(app).commands["generate"]))
    page = (ROOT / "docs" / "generate.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", page, re.MULTILINE))

    def option(key: str) -> bool:
        name = key.replace("_", "-")
        return bool({f"--{name}", f"--{name.removesuffix('s')}", f"--no-{name}"} & options)

    missing = [
        key for key in GenerateConfig.__struct_fields__ if not option(key) and key not in rows
    ]
    assert missing == []


def test_the_walk_reaches_subcommands_and_their_options() -> None:
    found = {
        p: set(_long_options(c)) for p, c in _commands(typer.main.get_command(app), "draftdata")
    }
    assert "--max-tokens" in found["draftdata generate"]
    assert "--no-verify" in found["draftdata tokenize"]
    assert "--fault-500" in found["draftdata fleet sim"]


def test_readme_opens_with_make_demo_and_make_test() -> None:
    lines = [ln for ln in README.read_text(encoding="utf-8").splitlines() if ln.strip()]
    block = lines[1:5]  # after the title: the fence and the two commands
    assert block[0].startswith("```")
    assert block[1].startswith("make demo") and block[2].startswith("make test")
