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
- TensorRT Model Optimizer 0.47: what its ``examples/speculative_decoding`` online mode
  builds (``make_speculative_data_module``): ``ShardedDataset("json", data_files=...)`` and
  ``LanguageDataCollator(tokenizer, train_len, return_labels=True, answer_only_loss=True,
  chat_template=<the file's text>)``, one row per batch. ``shift_labels=False`` (its DFlash
  setting) so a label is the input token itself where it is trained and -100 elsewhere; the
  padding is cut off by the attention mask.

JOB: {"tokenizer": DIR, "max_length": N, "specforge": [{"name", "path", "template",
"preformatted", "last_turn"}], "speculators": [{"name", "path"}], "modelopt": [{"name",
"path", "chat_template"}]}.
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


def modelopt(item: dict[str, Any], tokenizer_path: str, max_length: int) -> list[dict[str, Any]]:
    from modelopt.torch.utils.plugins.transformers_dataset import (
        IGNORE_TOKEN_ID,
        LanguageDataCollator,
        ShardedDataset,
    )
    from transformers import AutoTokenizer

    # A tokenizer of its own: the collator sets its chat_template (as main.py loads one).
    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_path, local_files_only=True, model_max_length=max_length
    )
    with open(item["chat_template"], encoding="utf-8") as fh:
        template = fh.read()
    data = ShardedDataset("json", data_files=item["path"])
    collator = LanguageDataCollator(
        tokenizer=tokenizer,
        train_len=max_length,
        chat_template=template,
        answer_only_loss=True,
        shift_labels=False,
        return_labels=True,
    )
    out = []
    for i in range(len(data)):
        row = data[i]
        batch = collator([row])
        ids = _flat(batch["input_ids"][0])
        keep = _flat(batch["attention_mask"][0])
        labels = _flat(batch["labels"][0])
        out.append(
            {
                "id": row["id"],
                "input_ids": [t for t, k in zip(ids, keep, strict=True) if k],
                "loss_mask": [
                    int(lab != IGNORE_TOKEN_ID) for lab, k in zip(labels, keep, strict=True) if k
                ],
            }
        )
    return out


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
    for item in job.get("modelopt", []):
        out[item["name"]] = modelopt(item, job["tokenizer"], job["max_length"])
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
