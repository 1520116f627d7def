"""The trainers' side of the hidden-states tier; runs in the trainers' environment.

    python hidden_side.py JOB.json OUT_DIR

Reads draftdata's hidden-state sets with each trainer's own offline dataset code, as its
offline training entry does, and writes what each one hands its drafter, per sample, into
``OUT_DIR/<name>.safetensors`` (keys ``<row>.<tensor>``):

- speculators 0.9.0: ``speculators.train.data.ArrowDataset(max_len, datapath=SET)`` (which
  ``load_from_disk``\\ s the set and reads ``SET/hidden_states/hs_<i>.safetensors`` through
  ``hs_connectors.FileTransfer``, or ``FP8Transfer`` for fp8 sets), ``on_missing="raise"``;
  item ``i``: ``hidden_states`` (the aux layers, flattened), ``verifier_last_hidden_states``,
  ``input_ids``, ``loss_mask``.
- SpecForge 0.2.0: ``specforge.data.preprocessing.build_offline_eagle3_dataset(SET/
  hidden_states, max_len)`` (``OfflineEagle3Dataset`` over ``list_local_files``), item ``i``:
  ``hidden_state`` (aux), ``target`` (last), ``input_ids``, ``loss_mask``; and the runtime's
  ``OfflineManifestReader`` + ``load_feature_file`` + the EAGLE-3 strategy's
  ``normalize_offline_sample`` (name ``<name>-runtime``). A file's row is read from its path.

JOB: {"max_len": N, "speculators": [{"name", "path", "fp8"}], "specforge": [{"name",
"path"}]}. Imports nothing of draftdata.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


def speculators(item: dict[str, Any], max_len: int) -> dict[str, Any]:
    from hs_connectors import FileTransfer, FP8Transfer
    from speculators.train.data import ArrowDataset

    folder = Path(item["path"]) / "hidden_states"
    transfer = FP8Transfer(folder) if item["fp8"] else FileTransfer(folder)
    ds = ArrowDataset(max_len, item["path"], transfer=transfer, on_missing="raise")
    out = {}
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = torch.load(str(Path(item["path"]) / "token_freq.pt"), weights_only=True)
    d2t, _t2d = build_vocab_mappings_from_distribution(freq, 8, max(freq) + 1)
    out["token_freq.ids"] = torch.tensor(sorted(freq), dtype=torch.long)
    out["token_freq.counts"] = torch.tensor([freq[k] for k in sorted(freq)], dtype=torch.long)
    out["token_freq.d2t"] = d2t
    for i in range(len(ds)):
        d = ds[i]
        out[f"{i}.aux"] = d["hidden_states"]
        out[f"{i}.last"] = d["verifier_last_hidden_states"]
        out[f"{i}.input_ids"] = d["input_ids"]
        out[f"{i}.loss_mask"] = d["loss_mask"]
    return out


def _row(path: str) -> int:
    m = re.search(r"data_(\d+)\.ckpt(\.gz)?$", path)
    assert m is not None, path
    return int(m.group(1))


def specforge(item: dict[str, Any], max_len: int) -> dict[str, Any]:
    from specforge.data.preprocessing import build_offline_eagle3_dataset

    ds = build_offline_eagle3_dataset(str(Path(item["path"]) / "hidden_states"), max_len)
    out = {}
    for i in range(len(ds)):
        d = ds[i]
        r = _row(ds.datapaths[i])
        out[f"{r}.aux"] = d["hidden_state"]
        out[f"{r}.last"] = d["target"]
        out[f"{r}.input_ids"] = d["input_ids"]
        out[f"{r}.loss_mask"] = d["loss_mask"]
    return out


def specforge_runtime(item: dict[str, Any], max_len: int) -> dict[str, Any]:
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    reader = OfflineManifestReader(
        str(Path(item["path"]) / "hidden_states"), max_len=max_len, validate_files=True
    )
    out = {}
    for ref in reader.read():
        path = ref.feature_store_uri[len("file://") :]
        d = normalize_offline_sample(load_feature_file(path), max_len)
        r = _row(path)
        out[f"{r}.aux"] = d["hidden_state"]
        out[f"{r}.last"] = d["target"]
        out[f"{r}.input_ids"] = d["input_ids"]
        out[f"{r}.loss_mask"] = d["loss_mask"]
        assert ref.num_tokens == d["input_ids"].numel()
    return out


def main(job_path: str, out_dir: str) -> None:
    from safetensors.torch import save_file

    job = json.loads(Path(job_path).read_text())
    results: dict[str, dict[str, Any]] = {}
    for item in job["speculators"]:
        results[item["name"]] = speculators(item, job["max_len"])
    for item in job["specforge"]:
        results[item["name"]] = specforge(item, job["max_len"])
        results[item["name"] + "-runtime"] = specforge_runtime(item, job["max_len"])
    for name, tensors in results.items():
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(Path(out_dir) / f"{name}.safetensors"),
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
