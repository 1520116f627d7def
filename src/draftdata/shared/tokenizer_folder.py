"""A target model's tokenizer folder: which files make one, and one-line errors about it.

Shared by ``tokenize`` (which loads the tokenizer), the simulator (``fleet sim --tokenizer``)
and ``fleet up``'s simulator preset, so all three accept the same folders and say the same
thing about a wrong one. This module loads nothing; transformers is the callers' business.
"""

from __future__ import annotations

from pathlib import Path

from draftdata.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # either makes a tokenizer folder


def check_tokenizer_folder(path: str, flag: str = "--tokenizer") -> None:
    """ConfigError in one line unless ``path`` is a folder holding a tokenizer file (before
    transformers is asked, so its multi-line messages and hub lookups never reach the user)."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigError(f"{flag} {path}: {path} does not exist; give the target model's folder")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: not a folder; give the target model's folder")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(
            f"{flag} {path}: no tokenizer.json or tokenizer_config.json in this folder; give the "
            "folder the servers load the target model from"
        )


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (transformers writes paragraphs)."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return lines[0] if lines else type(exc).__name__
