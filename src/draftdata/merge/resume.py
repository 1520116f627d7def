"""Where a merge may write, and how a killed merge is finished.

A merge writes many objects (shards, the JSONL export, the card) and only the last one,
``merge_report.json``, says the output is complete. So right before its first shard (after
the inputs are read and the mix is planned: a merge that fails on them leaves nothing behind)
it writes ``merge_config.json``: the settings that shape the output and the identity of
every input file (key and size). Its output is deterministic (same inputs, settings and
seed: the same bytes), so a merge killed half-way (kill -9, OOM, a lost node) is finished by
running the same command again: it finds its own ``merge_config.json``, writes what is
missing, and every object the killed run had written already holds exactly the bytes it
writes again (``put_new`` accepts them). Two such commands at once cooperate the same way.

Refused, before anything is written: a location holding a finished merge, an unfinished merge
of other inputs or settings, or anything else. Readers (``stats.readers.open_dataset``) refuse
a location holding ``merge_config.json`` without ``merge_report.json``: its rows are a part.

It does not delete or overwrite anything.
"""

from __future__ import annotations

import json
from typing import Any

from draftdata.errors import AlreadyExistsError
from draftdata.merge.config import MergeConfig
from draftdata.merge.inputs import InputInfo
from draftdata.shared.formats import MERGE_CONFIG, MERGE_REPORT
from draftdata.store.base import Store

CONFIG_VERSION = 1


def config_bytes(config: MergeConfig, infos: list[InputInfo]) -> bytes:
    """``merge_config.json``: what decides the output's bytes (deterministic, no clocks)."""
    doc: dict[str, Any] = {
        "format": MERGE_CONFIG.format,
        "version": CONFIG_VERSION,
        "settings": {
            "mix": dict(sorted(config.mix.items())),
            "seed": config.seed,
            "eval_fraction": config.eval_fraction,
            "format": config.format,
            "upsample": config.upsample,
            "max_repeat": config.max_repeat,
            "dedup_ids": config.dedup_ids,
            "tolerance": config.tolerance,
            "shard_rows": config.shard_rows,
            "shard_bytes": config.shard_bytes,
            "mix_by": config.mix_by,
            "tokenizer": config.tokenizer if config.mix_by == "tokens" else None,
        },
        "inputs": [
            {
                "role": i.role,
                "path": i.path,
                "kind": i.dataset.kind,
                "files": [[k, i.dataset.store.size(k)] for k in i.dataset.keys],
            }
            for i in infos
        ],
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def check_output(store: Store) -> None:
    """Refuse (AlreadyExistsError) a location holding a finished merge or anything but an
    unfinished merge; cheap (one listing), so it runs before any input is read."""
    listing = store.list("")
    if MERGE_REPORT.name in listing:
        raise AlreadyExistsError(
            f"{store.url}: not empty: holds a finished merge ({MERGE_REPORT.name}); merge writes "
            "into a new, empty location (choose another --out)"
        )
    if listing and MERGE_CONFIG.name not in listing:
        raise AlreadyExistsError(
            f"{store.url}: not empty; merge writes into a new, empty location (choose another "
            "--out or remove the old output yourself)"
        )


def claim_output(store: Store, marker: bytes) -> bool:
    """Make ``store`` this merge's output (after ``check_output``): True when it finishes a
    killed merge of the same inputs and settings, False when the location was empty.
    AlreadyExistsError for an unfinished merge of other inputs or settings."""
    if not store.exists(MERGE_CONFIG.name):
        check_output(store)  # still empty?
        try:
            store.put_new(MERGE_CONFIG.name, marker)  # an identical one written meanwhile is fine
        except AlreadyExistsError:
            pass  # another merge claimed it meanwhile: compared below
        else:
            return False
    if store.read(MERGE_CONFIG.name) != marker:
        raise AlreadyExistsError(
            f"{store.url}: holds an unfinished merge of other inputs or settings "
            f"({MERGE_CONFIG.name}); rerun that merge to finish it, or choose another --out"
        )
    return True
