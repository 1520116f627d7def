"""A generate run's settings: one typed record, written and read here.

``manifest.json`` (and each ``manifest-history/<n>.json``) holds the settings that change what
a run generates, under ``settings``; their hash identifies the run (``manifest.py``). Generate
builds a ``RunSettings`` (``generate/preflight.py``) and writes ``to_json()``; every reader
(generate on resume, tokenize, export) gets the run's effective settings from
``recorded_settings`` or ``settings_of``, never from the JSON's keys.

The JSON keys are the public run layout and stay as they are::

    {"stage": "generate", "prompts": {"sha256": ..., "lines": ..., "bytes": ...},
     "model": ..., "max_tokens": 4096 | "auto", "strict_limit": true (only when set),
     "sampling": {...}, "reasoning": "on" | "off" | "server", "chat_template_kwargs": {...},
     "keep_reasoning_history": false, "n": 1, "overrides": [...], "extra_body": {...},
     "server_chat_template_kwargs": {...} (only when generate learnt them)}

A key that is absent when read takes the field's default (runs written before it existed, and
the store's own tests, which record partial settings); a key of the wrong type is a damaged
manifest (StoreError, one line). Keys this record does not know are ignored.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from draftdata.errors import StoreError
from draftdata.store.base import Store
from draftdata.store.manifest import MANIFEST_KEY, load_manifest

Reasoning = Literal["on", "off", "server"]
# the key where generate records the chat-template kwargs the servers applied by default
# (generate/answers/thinking.py learns them, tokenize and export render with them)
SERVER_TEMPLATE_KWARGS = "server_chat_template_kwargs"


class PromptsIdentity(msgspec.Struct, kw_only=True, frozen=True):
    """Which prompts a run answers: their files' sha256, prompt lines and bytes."""

    sha256: str
    lines: int
    bytes: int


class RunSettings(msgspec.Struct, kw_only=True, frozen=True):
    """What a generate run records as its settings (module docstring)."""

    stage: str = "generate"
    prompts: PromptsIdentity | None = None
    model: str | None = None
    max_tokens: int | Literal["auto"] = "auto"
    strict_limit: bool = False
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    reasoning: Reasoning = "server"
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    keep_reasoning_history: bool = False
    n: int = 1
    overrides: list[dict[str, Any]] = msgspec.field(default_factory=list)
    extra_body: dict[str, Any] = msgspec.field(default_factory=dict)
    server_chat_template_kwargs: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``settings`` object the manifest holds and hashes: every key always, except
        ``strict_limit`` (only when true) and ``server_chat_template_kwargs`` (only when
        known), so the settings and hash of runs that never used them stay as they were."""
        out: dict[str, Any] = {
            "stage": self.stage,
            "prompts": msgspec.to_builtins(self.prompts),
            "model": self.model,
            "max_tokens": self.max_tokens,
        }
        if self.strict_limit:
            out["strict_limit"] = True
        out.update(
            sampling=self.sampling,
            reasoning=self.reasoning,
            chat_template_kwargs=self.chat_template_kwargs,
            keep_reasoning_history=self.keep_reasoning_history,
            n=self.n,
            overrides=self.overrides,
            extra_body=self.extra_body,
        )
        if self.server_chat_template_kwargs is not None:
            out[SERVER_TEMPLATE_KWARGS] = self.server_chat_template_kwargs
        return out


def settings_of(manifest: dict[str, Any], where: str) -> RunSettings:
    """The effective settings of a loaded manifest (``load_manifest``); ``where`` names it in
    the error when they do not read as settings."""
    value = manifest.get("effective_settings", manifest.get("settings")) or {}
    try:
        return msgspec.convert(value, RunSettings)
    except msgspec.ValidationError as exc:
        raise StoreError(
            f"{where}: the run's settings do not read ({exc}); the manifest is damaged: "
            "restore it from a copy or start a new run"
        ) from exc


def recorded_settings(store: Store) -> RunSettings | None:
    """The effective settings of the run in ``store`` (the newest manifest-history entry's,
    else the manifest's); None when it holds no run."""
    if not store.exists(MANIFEST_KEY):
        return None
    return settings_of(load_manifest(store), store.key_url(MANIFEST_KEY))
