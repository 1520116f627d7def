"""A hidden-state set read back: its manifest, index and summaries, and its figures.

``draftdata hidden-states`` writes a set (``hidden/setfiles.py`` has the layout): the manifest
(the settings: format, dtype, layers, the target, the dataset's identity), the index (which
file holds which sample id, with its token counts), one file per sample under
``hidden_states/``, and a summary per command that found the set complete (the verification
per layer). This module is the reading side, below the stages, so that ``stats`` and
``report`` show a set beside its dataset and the stage itself reads it the same way:

- ``read_set(url)`` -> ``HiddenSet`` (manifest, index table, newest summary); ``read_index``,
  ``summary_keys``;
- ``hidden_set_stats(url)`` -> the figures (``HIDDEN_STATS_FORMAT``, JSON-ready): samples and
  tokens planned and done (the files there now: the set's done-set), bytes in the set, the
  layers and dtype, the target, the dataset, and the newest verification;
- ``is_hidden_set(url)``: whether ``url`` is one (a ``hidden_manifest.json`` there).

It writes nothing.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.errors import InputError, StoreError
from draftdata.shared.formats import (
    HIDDEN_INDEX,
    HIDDEN_INDEX_FORMAT,
    HIDDEN_MANIFEST,
    HIDDEN_SUMMARY,
    check_format,
)
from draftdata.store.base import Store
from draftdata.store.opener import open_store

HIDDEN_STATS_FORMAT = "draftdata.hidden-set-stats/1"
HIDDEN_FILES = "hidden_states/"  # where the sample files are (hidden/writer.py's HIDDEN_FOLDER)


@dataclass(frozen=True)
class HiddenSet:
    """A hidden-state set as read back: its manifest, index and newest summary (None before
    a command finished it)."""

    url: str
    store: Store
    manifest: dict[str, Any]
    index: pa.Table
    summary: dict[str, Any] | None


def read_index(store: Store) -> pa.Table:
    """The set's index table (``formats.HIDDEN_INDEX_SCHEMA``)."""
    where = store.key_url(HIDDEN_INDEX)
    try:
        table = pq.read_table(io.BytesIO(store.read(HIDDEN_INDEX)))
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{where}: cannot read the index ({exc})") from exc
    check_format(table.schema, HIDDEN_INDEX_FORMAT, where)
    return table


def summary_keys(store: Store) -> list[str]:
    """The set's summary keys, oldest first."""
    stem = HIDDEN_SUMMARY.name[: -len(".json")]
    found = []
    for key in store.list(stem):
        rest = key[len(stem) : -len(".json")] if key.endswith(".json") else None
        if rest == "":
            found.append((1, key))
        elif rest is not None and rest.startswith("-") and rest[1:].isdigit():
            found.append((int(rest[1:]), key))
    return [k for _, k in sorted(found)]


def read_set(url: str) -> HiddenSet:
    """Read the set at ``url``; InputError when it holds no hidden-state manifest."""
    store = open_store(url)
    if not store.exists(HIDDEN_MANIFEST.name):
        raise InputError(f"{url}: no {HIDDEN_MANIFEST.name}; not a hidden-state set")
    manifest = HIDDEN_MANIFEST.load(
        store.read(HIDDEN_MANIFEST.name), store.key_url(HIDDEN_MANIFEST.name)
    )
    index = read_index(store) if store.exists(HIDDEN_INDEX) else None
    if index is None:
        raise InputError(f"{url}: no {HIDDEN_INDEX}; the first command was stopped before it")
    keys = summary_keys(store)
    summary = HIDDEN_SUMMARY.load(store.read(keys[-1]), store.key_url(keys[-1])) if keys else None
    return HiddenSet(url=url, store=store, manifest=manifest, index=index, summary=summary)


def is_hidden_set(url: str) -> bool:
    """Whether ``url`` (a folder or prefix) holds a hidden-state set's manifest."""
    if not url.startswith("s3://") and not os.path.isdir(os.path.expanduser(url)):
        return False
    try:
        return open_store(url).exists(HIDDEN_MANIFEST.name)
    except StoreError:
        return False


def _present(store: Store) -> dict[str, int | None]:
    """Sample files there now: key -> size (local: one scandir; S3: listed, sizes unknown)."""
    path = store.local_path(HIDDEN_FILES)
    if path is not None:
        try:
            return {
                HIDDEN_FILES + e.name: e.stat().st_size
                for e in os.scandir(path)
                if not e.name.startswith(".")
            }
        except FileNotFoundError:
            return {}
    return {k: None for k in store.list(HIDDEN_FILES)}


def hidden_set_stats(url: str) -> dict[str, Any]:
    """The set's figures (module docstring); InputError when ``url`` holds no set."""
    s = read_set(url)
    settings = s.manifest.get("settings") or {}
    model = settings.get("model") or {}
    dataset = settings.get("dataset") or {}
    files = s.index.column("file").to_pylist()
    tokens = s.index.column("num_tokens").to_pylist()
    loss = s.index.column("num_loss_tokens").to_pylist()
    present = _present(s.store)
    done = [i for i, f in enumerate(files) if f in present]
    sizes = [present[files[i]] for i in done]
    n_layers = model.get("num_layers")
    summary = s.summary or {}
    if sizes and all(isinstance(x, int) for x in sizes):
        size: int | None = sum(int(x or 0) for x in sizes)
    elif len(done) == len(files) and summary.get("complete"):
        size = int(summary.get("bytes_total") or 0) or None  # S3: the finished set's total
    else:
        size = None  # S3 before the set is finished: its files' sizes are not listed
    done_tokens = sum(int(tokens[i]) for i in done)
    verification = summary.get("verification")
    return {
        "format": HIDDEN_STATS_FORMAT,
        "url": s.url,
        "set_id": s.manifest.get("set_id"),
        "created": s.manifest.get("created"),
        "trainer_format": settings.get("format"),
        "dtype": settings.get("dtype"),
        "compress": settings.get("compress"),
        "layers": {
            "aux": list(settings.get("aux_layers") or []),
            "last": n_layers,
            "last_norm": settings.get("last"),
            "count": len(settings.get("aux_layers") or []) + 1,
        },
        "model": {
            "name": model.get("name"),
            "model_type": model.get("model_type"),
            "num_layers": n_layers,
            "hidden_size": model.get("hidden_size"),
        },
        "dataset": {
            "url": dataset.get("url"),
            "samples": dataset.get("samples"),
            "tokens": dataset.get("tokens"),
        },
        "samples": {"planned": len(files), "done": len(done)},
        "tokens": {
            "planned": int(sum(int(t) for t in tokens)),
            "done": done_tokens,
            "loss_done": sum(int(loss[i]) for i in done),
        },
        "bytes": {
            "in_set": size,
            "per_token": round(size / done_tokens, 1) if size and done_tokens else None,
            "bill": summary.get("bill_bytes"),
        },
        "complete": len(done) == len(files),
        "engine": summary.get("engine"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "verification": verification,
        "fp8_error": summary.get("fp8_error"),
        "compression_ratio": summary.get("compression_ratio"),
    }
