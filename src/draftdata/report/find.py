"""Find what a report input holds: runs, merge outputs and other datasets.

``find_parts(url)`` looks at the location itself and at most two folder levels below it:

- a **run** is a folder holding ``manifest.json`` (generate's output);
- a **merged dataset** is a folder holding ``merge_report.json`` (merge's output);
- a **tokenized** set is a folder holding tokenize's ``summary.json``, or a folder named
  ``tokenized*`` holding parquet;
- **prompts** are a folder holding ``prepare_report.json`` (prepare's output);
- a **hidden-state set** is a folder holding ``hidden_manifest.json`` (hidden-states' output:
  shown as a set, never read as a dataset);
- when none of these is found, the location itself is read as one dataset (prompts, tokenized
  samples or conversations; anything ``draftdata stats`` reads).

So ``report`` works on a run, on a merge output, and on a demo output folder holding several
(``prompts/``, ``run/``, ``tokenized/``, ``merged/`` ...). A folder inside a found run or merge
output is not searched further (a run's shards are never mistaken for datasets). Local symlinks
(to files or folders) are followed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from draftdata.errors import InputError
from draftdata.shared.formats import (
    HIDDEN_MANIFEST,
    MERGE_REPORT,
    PREPARE_REPORT,
    RUN_MANIFEST,
    TOKENIZE_SUMMARY,
)
from draftdata.stats.readers import DATA_EXT, read_json_file
from draftdata.store.base import Store
from draftdata.store.opener import open_store

MAX_DEPTH = 2


@dataclass(frozen=True)
class Parts:
    """The URLs of what one input holds, each list in path order."""

    root: str
    runs: tuple[str, ...] = ()
    merged: tuple[str, ...] = ()
    tokenized: tuple[str, ...] = ()
    prompts: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """True when nothing readable was found."""
        return not (
            self.runs or self.merged or self.tokenized or self.prompts or self.datasets
            or self.hidden
        )  # fmt: skip


def _url(store: Store, prefix: str) -> str:
    return store.key_url(prefix) if prefix else store.url


def _local_keys(root: str) -> list[str]:
    """The files under ``root`` down to ``MAX_DEPTH`` folders, following symlinked folders
    (``latest -> runs/2024-06-01/``; each real folder once, so a link loop ends), hidden
    names skipped. Sorted keys relative to ``root``."""
    out: list[str] = []
    seen: set[str] = set()

    def walk(path: str, rel: str, depth: int) -> None:
        real = os.path.realpath(path)
        if real in seen:
            return
        seen.add(real)
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if e.name.startswith("."):
                continue
            key = f"{rel}{e.name}"
            if e.is_dir(follow_symlinks=True):
                if depth < MAX_DEPTH:
                    walk(e.path, key + "/", depth + 1)
            elif e.is_file(follow_symlinks=True):
                out.append(key)

    walk(root, "", 0)
    return sorted(out)


def find_parts(url: str) -> Parts:
    """Locate the runs, merge outputs and tokenized sets at or under ``url`` (see module doc)."""
    if not url.startswith("s3://"):
        path = os.path.realpath(os.path.expanduser(url))
        if not os.path.exists(path):
            raise InputError(f"{url}: no such file or directory")
        if os.path.isfile(path):
            return Parts(root=path, datasets=(path,))
        url = path
    elif url.rstrip("/").endswith(DATA_EXT):
        return Parts(root=url, datasets=(url,))  # one s3:// data file
    store = open_store(url)
    keys = _local_keys(url) if not url.startswith("s3://") else store.list("")
    if not keys:
        raise InputError(f"{url}: nothing there to report on")
    runs: set[str] = set()
    merged: set[str] = set()
    prompts: set[str] = set()
    tokenized: set[str] = set()
    hidden: set[str] = set()
    for key in keys:
        parts = key.split("/")
        if len(parts) - 1 > MAX_DEPTH:
            continue
        prefix = "/".join(parts[:-1])
        name = parts[-1]
        if name == RUN_MANIFEST.name:
            runs.add(prefix)
        elif name == MERGE_REPORT.name:
            merged.add(prefix)
        elif name == PREPARE_REPORT.name:
            prompts.add(prefix)
        elif name == HIDDEN_MANIFEST.name:
            hidden.add(prefix)
        elif name == TOKENIZE_SUMMARY.name and read_json_file(store, TOKENIZE_SUMMARY, key):
            tokenized.add(prefix)
    owners = runs | merged | hidden

    def inside(prefix: str) -> bool:
        return any(o == "" or prefix == o or prefix.startswith(o + "/") for o in owners)

    for key in keys:
        parts = key.split("/")
        for depth in range(min(len(parts) - 1, MAX_DEPTH)):
            if parts[depth].startswith("tokenized") and key.endswith(".parquet"):
                tokenized.add("/".join(parts[: depth + 1]))
                break
    tokenized = {t for t in tokenized if not inside(t)}
    prompts = {p for p in prompts if not inside(p)}
    found = Parts(
        root=store.url,
        runs=tuple(_url(store, p) for p in sorted(runs)),
        merged=tuple(_url(store, p) for p in sorted(merged)),
        tokenized=tuple(_url(store, p) for p in sorted(tokenized)),
        prompts=tuple(_url(store, p) for p in sorted(prompts)),
        hidden=tuple(_url(store, p) for p in sorted(hidden)),
    )
    if found.empty:
        return Parts(root=store.url, datasets=(store.url,))
    return found
