"""The trainers' side of the trainer tier; runs in the trainers' environment (env_path.sh).

    python trainer_side.py JOB.json OUT.json

Reads draftdata's exports with each trainer's own data code, exactly as the trainer's training
entry does, and writes per row the token ids and loss mask the trainer would train on:

- SpecForge 0.2.0: ``datasets.load_dataset("json", ...)`` then
  ``specforge.data.preprocessing.build_eagle3_dataset`` with a ``TEMPLATE_REGISTRY`` template
  (what ``specforge.data.prompt_builder`` does). It shuffles with ``shuffle_seed`` and drops
  every column, so the row order is recovered from the same seeded permutation.
- speculators 0.9.0: ``speculators.data_generation.preprocessing.load_raw_dataset`` then
  ``build_speculator_training_dataset`` (pre-tokenized rows pass through; no shuffle).

JOB: {"tokenizer": DIR, "max_length": N, "specforge": [{"name", "path", "template",
"preformatted", "last_turn"}], "speculators": [{"name", "path"}]}.
OUT: {name: [{"id", "input_ids", "loss_mask"}]}. Imports nothing of draftdata.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SHUFFLE_SEED = 42


def _flat(x: Any) -> list[int]:
    return [int(v) for v in x.reshape(-1).tolist()]


def specforge(item: dict[str, Any], tokenizer: Any, max_length: int) -> list[dict[str, Any]]:
    from datasets import Dataset, load_dataset
    from specforge.data.preprocessing import build_eagle3_dataset

    raw = load_dataset("json", data_files=item["path"], split="train")
    ids = list(raw["id"])
    order = Dataset.from_dict({"i": list(range(len(raw)))}).shuffle(seed=SHUFFLE_SEED)["i"]
    built = build_eagle3_dataset(
        raw,
        tokenizer,
        chat_template=item["template"],
        max_length=max_length,
        shuffle_seed=SHUFFLE_SEED,
        num_proc=None,
        is_preformatted=item["preformatted"],
        train_only_last_turn=item["last_turn"],
    )
    assert len(built) == len(ids), (len(built), len(ids))
    return [
        {
            "id": ids[order[j]],
            "input_ids": _flat(row["input_ids"]),
            "loss_mask": _flat(row["loss_mask"]),
        }
        for j, row in enumerate(built)
    ]


def speculators(item: dict[str, Any], tokenizer: Any, max_length: int) -> list[dict[str, Any]]:
    from speculators.data_generation.preprocessing import (
        build_speculator_training_dataset,
        load_raw_dataset,
    )

    raw, _ = load_raw_dataset(item["path"])
    ids = list(raw["id"])
    built = build_speculator_training_dataset(raw, tokenizer, max_length=max_length, num_proc=1)
    assert len(built) == len(ids), (len(built), len(ids))
    return [
        {"id": rid, "input_ids": _flat(row["input_ids"]), "loss_mask": _flat(row["loss_mask"])}
        for rid, row in zip(ids, built, strict=True)
    ]


def main() -> None:
    from transformers import AutoTokenizer

    with open(sys.argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"], local_files_only=True)
    out: dict[str, list[dict[str, Any]]] = {}
    for item in job.get("specforge", []):
        out[item["name"]] = specforge(item, tokenizer, job["max_length"])
    for item in job.get("speculators", []):
        out[item["name"]] = speculators(item, tokenizer, job["max_length"])
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
