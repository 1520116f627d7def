"""The files that describe a hidden-state set, beside its sample files.

Layout of a set (local folder or ``s3://`` prefix)::

    hidden_manifest.json          draftdata.hidden-manifest/1: set id, created, version, the
                                  settings (config.HiddenSettings) and their sha256; created
                                  before anything else, create-only
    hidden_index.parquet          row, id, file, source, domain, num_tokens, num_loss_tokens,
                                  truncated: which file holds which sample (hidden-index/1);
                                  committed before the first sample file
    hidden_states/hs_<row>.safetensors  or  hidden_states/data_<row>.ckpt[.gz]
                                  one file per sample (writer.py); the done-set is their listing
    data-*-of-*.arrow, dataset_info.json, state.json
                                  speculators only: the dataset its trainer loads (row i = hs_i)
    hidden_summary.json, hidden_summary-2.json, ...
                                  draftdata.hidden-summary/1: one per command that found every
                                  sample done (config.HiddenSummary: counts, bytes, the
                                  verification per layer, the fp8 error, the rate); the newest
                                  is the set's state
    lease/...                     the writer's lease (store/lease.py)

``open_manifest`` creates the manifest in an empty prefix or compares the settings with it and
refuses a change in one line naming what changed (a changed model, layers, dtype, format or
dataset: the files would mix two sets), as generate refuses a changed run. The verification is
not in the manifest (written before any pass, never rewritten) but in the summaries.

The reading side (``read_set``, ``read_index``, ``summary_keys``) is
``stats/hiddenset.py``, below the stages, where ``stats`` and ``report`` read a set too.
"""

from __future__ import annotations

import io
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from draftdata import __version__
from draftdata.errors import AlreadyExistsError, RunMismatchError
from draftdata.hidden.config import HiddenSettings, HiddenSummary
from draftdata.shared.formats import (
    HIDDEN_INDEX,
    HIDDEN_MANIFEST,
    HIDDEN_SUMMARY,
)
from draftdata.stats.hiddenset import HiddenSet as HiddenSet
from draftdata.stats.hiddenset import read_index, summary_keys
from draftdata.stats.hiddenset import read_set as read_set
from draftdata.store.base import Store
from draftdata.store.lease import LEASE_PREFIX
from draftdata.store.manifest import diff_settings, settings_hash


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def check_prefix(store: Store) -> None:
    """RunMismatchError unless the prefix holds a set's manifest or nothing (but a lease):
    called before the lease is taken, so a foreign folder is left as it was."""
    if store.exists(HIDDEN_MANIFEST.name):
        return
    others = [k for k in store.list("") if not k.startswith(LEASE_PREFIX)]
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise RunMismatchError(
            f"{store.url}: not empty and holds no {HIDDEN_MANIFEST.name} (found "
            f"{', '.join(others[:3])}{more}); give an empty --out or an existing hidden-state set"
        )


def open_manifest(store: Store, settings: HiddenSettings) -> dict[str, Any]:
    """The set's manifest: created in an empty prefix, else checked against ``settings``
    (RunMismatchError naming the changes, or naming what else the prefix holds)."""
    compared = settings.compared()
    if not store.exists(HIDDEN_MANIFEST.name):
        check_prefix(store)
        manifest = {
            "format": HIDDEN_MANIFEST.format,
            "set_id": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(4),
            "created": _now(),
            "draftdata_version": __version__,
            "settings": msgspec.to_builtins(settings),
            "settings_hash": settings_hash(compared),
        }
        try:
            store.put_new(HIDDEN_MANIFEST.name, json.dumps(manifest, indent=1).encode())
            return manifest
        except AlreadyExistsError:
            pass  # created at the same moment by another command: compare with it
    manifest = HIDDEN_MANIFEST.load(
        store.read(HIDDEN_MANIFEST.name), store.key_url(HIDDEN_MANIFEST.name)
    )
    if manifest.get("settings_hash") != settings_hash(compared):
        old = dict(manifest.get("settings") or {})
        old.get("model", {}).pop("name", None)
        old.get("dataset", {}).pop("url", None)
        changes = diff_settings(old, compared)
        raise RunMismatchError(
            f"{store.url}: this hidden-state set was made with other settings; changed: "
            + "; ".join(changes[:6])
            + ". Use the same model, layers, dtype, format and dataset, or a new --out"
        )
    return manifest


def index_bytes(table: pa.Table) -> bytes:
    """``hidden_index.parquet``'s bytes (zstd; one row group per 64K samples)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=1 << 16)
    return buf.getvalue()


def write_index(store: Store, table: pa.Table) -> None:
    """Commit the index once; a rerun finds it there and checks it lists the same samples."""
    if store.exists(HIDDEN_INDEX):
        have = read_index(store)
        if have.column("id").to_pylist() != table.column("id").to_pylist():
            raise RunMismatchError(
                f"{store.key_url(HIDDEN_INDEX)}: lists other samples than this dataset's plan; "
                "give the dataset this set was made from, or a new --out"
            )
        return
    try:
        store.put_new(HIDDEN_INDEX, index_bytes(table))
    except AlreadyExistsError:
        write_index(store, table)


def write_summary(store: Store, summary: HiddenSummary) -> str:
    """Commit ``summary`` as the next ``hidden_summary[-N].json``; its key."""
    doc = {"format": HIDDEN_SUMMARY.format, "at": _now(), **msgspec.to_builtins(summary)}
    doc["complete"] = summary.complete
    raw = json.dumps(doc, indent=1).encode()
    stem = HIDDEN_SUMMARY.name[: -len(".json")]
    n = len(summary_keys(store)) + 1
    while True:
        key = HIDDEN_SUMMARY.name if n == 1 else f"{stem}-{n}.json"
        try:
            store.put_new(key, raw)
            return key
        except AlreadyExistsError:
            n += 1
