"""Reading a prompts JSONL file, a local path or an ``s3://BUCKET/KEY`` object, line by line.

``open_prompt_file`` opens one (S3 through the store, in 8 MiB ranged GETs), ``read_lines``
(``readers/jsontext.py``) reads its lines in bounded memory (a line past
``records.MAX_LINE_BYTES`` is cut and the rest skipped; ``parse_prompt`` rejects it) and
``iter_prompt_lines`` yields the non-blank ones with their line numbers. Parsing a line is
``records.parse_prompt``; this module only reads (it lives in the store so that ``records``
depends on nothing of the project but errors).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

from draftdata.errors import InputError, StoreError
from draftdata.records import BOM
from draftdata.shared.readers.jsontext import read_lines
from draftdata.store.opener import open_store


def open_prompt_file(source: Path | str) -> BinaryIO:
    """A binary reader of one prompts file: a local path or an ``s3://BUCKET/KEY`` object
    (read in 8 MiB ranged GETs). InputError when it cannot be opened."""
    text = str(source)
    if text.startswith("s3://"):
        parent, _, name = text.rstrip("/").rpartition("/")
        try:
            raw = open_store(parent).open_input(name)
        except StoreError as exc:
            raise InputError(f"{text}: cannot read prompts ({exc})") from exc
        return io.BufferedReader(cast(io.RawIOBase, raw), buffer_size=8 << 20)
    try:
        return Path(source).open("rb")
    except OSError as exc:
        raise InputError(f"{source}: cannot read prompts ({exc.strerror})") from exc


def iter_prompt_lines(source: Path | str) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw line) of a prompts JSONL file (a local path or an s3://
    object) lazily, skipping blank lines and a byte-order mark at the start of the file."""
    with open_prompt_file(source) as fh:
        for lineno, line in enumerate(read_lines(fh), start=1):
            if lineno == 1 and line.startswith(BOM):
                line = line[3:]
            if line.strip():
                yield lineno, line
