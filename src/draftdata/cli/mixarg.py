"""``--mix`` of prepare and merge: ``DOMAIN=SHARE,...`` or a JSON file that holds a mix.

The file is a ``suggested_mix.json`` (``draftdata acceptance --out``: its ``mix`` object), or
any JSON object of domain -> share; local or ``s3://``. So the mix a measurement suggests goes
straight into the next ``prepare`` and ``merge``. The shares are parsed and checked by
``draftdata.shared.mix``; this module only finds the text or reads the file::

    draftdata merge ... --mix s3://BUCKET/acceptance_v1/suggested_mix.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftdata.errors import ConfigError, DraftdataError
from draftdata.shared.mix import mix_from_json, parse_mix


def is_mix_file(text: str) -> bool:
    """Whether ``--mix`` names a file rather than spelling shares."""
    return "=" not in text and bool(text.strip())


def read_mix_file(text: str) -> dict[str, float]:
    """The mix in the JSON file ``text`` (module docstring); ConfigError in one line."""
    where = f"--mix {text}"
    try:
        if text.startswith("s3://"):
            from draftdata.store.opener import open_store

            parent, _, key = text.rpartition("/")
            raw = open_store(parent).read(key)
        else:
            raw = Path(text).expanduser().read_bytes()
    except (OSError, DraftdataError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"{where}: cannot read it ({why}); give DOMAIN=SHARE,... or a suggested_mix.json"
        ) from None
    try:
        doc: Any = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from None
    return mix_from_json(doc, where)


def mix_option(text: str | None) -> dict[str, float] | None:
    """The mix ``--mix`` gives (None when not given): shares spelt out or read from a file."""
    if text is None or not text.strip():
        return None
    if is_mix_file(text):
        return read_mix_file(text)
    return parse_mix(text)
