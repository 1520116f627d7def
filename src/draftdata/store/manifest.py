"""The run manifest: what a run is, and the hash of everything that changes what it generates.

``manifest.json`` is written once, create-only, when a run starts::

    {"format": "draftdata.run/1", "run_id": "...", "created": "2026-12-03T08:50:00+00:00",
     "draftdata_version": "0.1.0", "settings": {...}, "settings_hash": "sha256:..."}

``settings`` is whatever the caller says changes the output (a generate run's is the typed
``settings.RunSettings``: the prompts' identity, model, sampling, template kwargs, ...); its
hash is sha256 over canonical JSON (sorted keys, no spaces).
The store has no overwrite, so an allowed config change is recorded as a new create-only object
``manifest-history/<n>.json`` (n = 1, 2, ...) holding the new settings, their hash and the list
of changed settings; the run's effective settings are those of the newest history entry.

This module builds, reads and compares manifests, and opens a run's (``open_manifest``: create
it in an empty prefix, or check the settings against it and record an allowed change);
``run.py`` decides when.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from datetime import UTC, datetime
from typing import Any

from draftdata import __version__
from draftdata.errors import (
    AlreadyExistsError,
    ConfigError,
    FormatVersionError,
    RunMismatchError,
    UnreadableObjectError,
)
from draftdata.store.base import Store
from draftdata.store.lease import LEASE_PREFIX

RUN_FORMAT = "draftdata.run/1"
MANIFEST_KEY = "manifest.json"
HISTORY_PREFIX = "manifest-history/"
_MISSING = object()


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, compact) used for hashing settings.

    NaN and infinities are refused (ConfigError naming the setting): Python would write them as
    ``NaN``/``Infinity``, which is not JSON, and every reader of the run would then fail on
    its manifest. The options are validated before this; it is the backstop for any other path.
    """
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except ValueError as exc:
        bad = [p or "(value)" for p in _not_finite(value, "")]
        raise ConfigError(
            f"run settings: {', '.join(bad[:5]) or 'a value'}: NaN or infinity, which a JSON "
            "manifest cannot hold; pass a finite value"
        ) from exc
    return text.encode()


def _not_finite(value: Any, path: str) -> list[str]:
    """The dotted paths (``a.b[2]``) of the NaN and infinite floats in ``value``."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _not_finite(v, f"{path}.{k}".lstrip("."))]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in _not_finite(v, f"{path}[{i}]")]
    return []


def settings_hash(settings: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``settings``."""
    return "sha256:" + hashlib.sha256(canonical_json(settings)).hexdigest()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in value:
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(unset)"
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def diff_settings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per changed leaf setting, e.g. ``sampling.temperature: 0.6 -> 0.7``."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(old, "", a)
    _flatten(new, "", b)
    lines = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va is _MISSING or vb is _MISSING or canonical_json(va) != canonical_json(vb):
            lines.append(f"{key or '(settings)'}: {_show(va)} -> {_show(vb)}")
    return lines


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_manifest(settings: dict[str, Any]) -> dict[str, Any]:
    """A fresh manifest for a run with these settings (a new random run id)."""
    return {
        "format": RUN_FORMAT,
        "run_id": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(4),
        "created": _now(),
        "draftdata_version": __version__,
        "settings": settings,
        "settings_hash": settings_hash(settings),
    }


# what a manifest that is not one says besides where (create-only: nobody may fix it in place)
_NOT_OURS = (
    "not a manifest draftdata wrote (an object put there by hand or by another tool); "
    "write the run to another --out"
)


def _load_json(store: Store, key: str) -> dict[str, Any]:
    raw = store.read(key)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise UnreadableObjectError(
            f"{store.key_url(key)}: not valid JSON ({exc}); {_NOT_OURS}"
        ) from exc
    if not isinstance(value, dict):
        raise UnreadableObjectError(f"{store.key_url(key)}: expected a JSON object; {_NOT_OURS}")
    return value


def load_manifest(store: Store) -> dict[str, Any]:
    """The run's manifest with ``history`` (list of change entries) and effective settings.

    The returned dict is manifest.json plus ``history`` and ``effective_settings`` /
    ``effective_hash`` (the newest history entry's, or the manifest's own).
    """
    manifest = _load_json(store, MANIFEST_KEY)
    fmt = manifest.get("format")
    if fmt != RUN_FORMAT:
        raise FormatVersionError(
            f"{store.key_url(MANIFEST_KEY)}: run format {fmt!r}, this draftdata reads "
            f"{RUN_FORMAT}; use the draftdata version that wrote it"
        )
    history = [_load_json(store, k) for k in _history_keys(store)]
    manifest["history"] = history
    last = history[-1] if history else manifest
    manifest["effective_settings"] = last["settings"]
    manifest["effective_hash"] = last["settings_hash"]
    return manifest


def _history_keys(store: Store) -> list[str]:
    keys = [k for k in store.list(HISTORY_PREFIX) if k.endswith(".json")]
    return sorted(keys, key=lambda k: int(k[len(HISTORY_PREFIX) : -5] or 0))


def history_entry(
    manifest: dict[str, Any], settings: dict[str, Any], changes: list[str]
) -> tuple[str, bytes]:
    """The key and bytes of the next ``manifest-history/<n>.json`` for an allowed change."""
    n = len(manifest.get("history", [])) + 1
    entry = {
        "n": n,
        "at": _now(),
        "draftdata_version": __version__,
        "previous_hash": manifest.get("effective_hash", manifest.get("settings_hash")),
        "settings_hash": settings_hash(settings),
        "changes": changes,
        "settings": settings,
    }
    return f"{HISTORY_PREFIX}{n:06d}.json", json.dumps(entry, indent=1).encode()


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The bytes of ``manifest.json`` (pretty JSON; the hash does not depend on layout)."""
    return json.dumps(manifest, indent=1, ensure_ascii=False).encode()


def check_empty(store: Store, keys: list[str]) -> None:
    """Refuse a prefix without a manifest that holds anything but a run lease."""
    keys = [k for k in keys if not k.startswith(LEASE_PREFIX)]
    if keys:
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        raise RunMismatchError(
            f"{store.url}: output prefix is not empty and holds no draftdata manifest "
            f"(found {shown}); give an empty prefix or an existing run's prefix"
        )


def open_manifest(
    store: Store, keys: list[str], settings: dict[str, Any], allow_config_change: bool
) -> dict[str, Any]:
    """The run's manifest (with ``history``, ``effective_settings``, ``effective_hash``):
    created when ``keys`` hold none, else checked against ``settings`` (RunMismatchError on a
    change unless ``allow_config_change``, which records it in manifest-history/)."""
    if MANIFEST_KEY not in keys:
        check_empty(store, keys)
        manifest = new_manifest(settings)
        try:
            store.put_new(MANIFEST_KEY, manifest_bytes(manifest))
        except AlreadyExistsError:
            pass  # another writer created the run at the same moment: validate against it
        else:
            manifest["history"] = []
            manifest["effective_settings"] = settings
            manifest["effective_hash"] = manifest["settings_hash"]
            return manifest
    for _ in range(5):
        manifest = load_manifest(store)
        if manifest["effective_hash"] == settings_hash(settings):
            return manifest
        changes = diff_settings(manifest["effective_settings"], settings)
        if not allow_config_change:
            raise RunMismatchError(
                f"{store.url}: this run was started with other settings; changed: "
                + "; ".join(changes)
                + ". Use the same config, a new --out, or --allow-config-change "
                "to continue with the new settings (recorded in manifest-history/)"
            )
        key, raw = history_entry(manifest, settings, changes)
        try:
            store.put_new(key, raw)
        except AlreadyExistsError:
            continue  # a concurrent change landed first: re-read and compare again
        return load_manifest(store)
    raise RunMismatchError(f"{store.url}: the run's settings keep changing under us; retry")
