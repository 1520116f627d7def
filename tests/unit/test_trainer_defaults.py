"""No default and no README command writes rows a trainer mis-trains.

Whole-conversation rows (``sharegpt``, ``openai``, ``modelopt``, ``eagle``) make a trainer that
renders the whole conversation train the earlier turns of a multi-turn row in a form the target
never wrote, wherever the chat template rewrites history (Qwen3): docs/trainers.md. So export's
default, and the walkthrough's trainer output, must be a per-turn format.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer.main

from draftdata.cli import app
from draftdata.shared.trainer_rows import PER_TURN_FORMATS

ROOT = Path(__file__).resolve().parents[2]


def _default(command: str, option: str) -> object:
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    param = next(p for p in cmd.params if option in p.opts)
    return param.default


def test_export_defaults_to_a_per_turn_format() -> None:
    assert _default("export", "--format") in PER_TURN_FORMATS


def test_the_walkthrough_writes_a_trainer_format() -> None:
    from tests.integration.test_walkthrough import walkthrough_commands

    formats = []
    for cmd in walkthrough_commands(ROOT / "README.md"):
        words = shlex.split(cmd)
        if "--format" in words and words[1] in ("merge", "export"):
            formats.append(words[words.index("--format") + 1])
    assert formats and all(f in PER_TURN_FORMATS for f in formats), formats
