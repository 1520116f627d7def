"""speculators' offline files: ``hidden_states/hs_<row>.safetensors`` beside the dataset it indexes.

speculators 0.9.0 trains offline from ``--data-path DIR``: ``datasets.load_from_disk(DIR)`` (a
saved dataset with ``input_ids``, ``loss_mask`` and ``seq_len`` columns, torch format) and, for
row ``i`` of it, ``DIR/hidden_states/hs_{i}.safetensors`` (``hs_connectors.FileTransfer``;
``--hidden-states-path`` points elsewhere). Each file holds:

- ``token_ids``: int64 ``[T]``, which its ``ArrowDataset`` compares with row ``i``'s
  ``input_ids`` (``torch.equal``: same values and dtype, so both are int64 here) and refuses
  the sample when they differ;
- ``hidden_states``: ``[T, layers, hidden]``, the aux layers then the last one *before* the
  final norm (its drafter applies ``verifier_norm``; the reader takes ``[:, :-1]`` flattened as
  the drafter's input and ``[:, -1]`` as ``verifier_last_hidden_states``); bf16 by default;
- with ``--dtype fp8``: ``hidden_states`` as float8 e4m3 and ``hidden_states_scales`` float32
  ``[T, 1, 1]`` (one scale per token), the layout ``hs_connectors``' ``FP8Transfer`` (train with
  ``--hidden-states-backend fp8``) dequantizes.

The loss mask is read from the dataset, not the file. So this writer also writes the dataset
(``dataset_files``): Arrow IPC stream shards ``data-<i>-of-<n>.arrow`` with the Hugging Face
features in their schema metadata, ``dataset_info.json`` and ``state.json`` (format ``torch``),
the layout ``Dataset.save_to_disk`` produces, written here directly so that the same samples
always give the same bytes (a rerun finds them already there). Its row ``i`` is plan row ``i``.
Beside it ``token_freq.pt`` (the loss tokens' counts, what speculators' ``prepare-data``
writes there), from which its trainer builds the draft vocabulary. So ``--data-path DIR`` is
all speculators' offline training needs.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from draftdata.hidden.layers import LastNorm
from draftdata.hidden.writer import (
    DTYPE_BYTES,
    HIDDEN_FOLDER,
    Compression,
    RowFiles,
    SampleRow,
    Stored,
    StoredDtype,
    dequantize_fp8,
    quantize_fp8,
    torch_dtype,
)

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
SCALES = "hidden_states_scales"
SHARD_BYTES = 256 << 20  # the dataset's Arrow shards stay under this (token lists only)

_FEATURES = {
    "input_ids": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
    "loss_mask": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
    "seq_len": {"dtype": "int64", "_type": "Value"},
}
_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int64())),
        pa.field("loss_mask", pa.list_(pa.int64())),
        pa.field("seq_len", pa.int64()),
    ],
    metadata={"huggingface": json.dumps({"info": {"features": _FEATURES}})},
)


class SpeculatorsWriter(RowFiles):
    """speculators 0.9.0's offline files (see the module docstring)."""

    format = "speculators"
    dtypes: ClassVar[tuple[StoredDtype, ...]] = ("bf16", "fp16", "fp32", "fp8")
    compressions: ClassVar[tuple[Compression, ...]] = ("none",)
    NAME = _NAME

    @property
    def capture_last(self) -> LastNorm:
        """Before the final norm: vLLM's layer id N, which speculators' drafter normalises."""
        return "pre_norm"

    def key(self, row: int) -> str:
        """``hidden_states/hs_<row>.safetensors``."""
        return f"{HIDDEN_FOLDER}hs_{row}.safetensors"

    def row_of(self, key: str) -> int | None:
        """The row of a ``hidden_states/hs_<row>.safetensors`` key."""
        m = self._match(key)
        return int(m.group(1)) if m else None

    def encode(self, sample: SampleRow, states: torch.Tensor) -> bytes:
        """The safetensors bytes of ``token_ids`` and ``hidden_states`` (and the fp8 scales)."""
        import torch
        from safetensors.torch import save

        tensors: dict[str, torch.Tensor] = {
            "token_ids": torch.from_numpy(np.ascontiguousarray(sample.input_ids, np.int64))
        }
        if self.dtype == "fp8":
            values, scale = quantize_fp8(states)
            tensors["hidden_states"] = values.contiguous()
            tensors[SCALES] = scale.contiguous()
        else:
            tensors["hidden_states"] = states.to(torch_dtype(self.dtype)).contiguous()
        return bytes(save(tensors))

    def decode(self, data: bytes) -> Stored:
        """token ids and states (dequantized for fp8) of one file; no loss mask (the dataset
        holds it)."""
        from safetensors.torch import load

        tensors = load(data)
        states = tensors["hidden_states"]
        if SCALES in tensors:
            states = dequantize_fp8(states, tensors[SCALES])
        return Stored(
            input_ids=tensors["token_ids"].numpy().astype(np.int64),
            loss_mask=None,
            states=states.float(),
        )

    def predicted_bytes(self, num_tokens: int, layers: int, hidden: int) -> int:
        """The safetensors file's size, exactly: the 8-byte header length, the JSON header
        (tensors ordered as safetensors orders them: by dtype, widest first; padded with
        spaces to 8 bytes) and the tensors."""
        dt = {"bf16": "BF16", "fp16": "F16", "fp32": "F32", "fp8": "F8_E4M3"}[self.dtype]
        tensors = [("token_ids", "I64", [num_tokens], 8 * num_tokens)]
        if self.dtype == "fp8":
            tensors.append((SCALES, "F32", [num_tokens, 1, 1], 4 * num_tokens))
        states = num_tokens * layers * hidden * DTYPE_BYTES[self.dtype]
        tensors.append(("hidden_states", dt, [num_tokens, layers, hidden], states))
        header: dict[str, object] = {}
        offset = 0
        for name, dtype, shape, size in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        text = len(json.dumps(header, separators=(",", ":")))
        return 8 + (text + 7) // 8 * 8 + offset

    def dataset_files(
        self, samples: Iterable[SampleRow], scratch: Path
    ) -> Iterator[tuple[str, Path]]:
        """The saved dataset speculators loads (see the module docstring): the Arrow shards,
        then ``dataset_info.json``, then ``state.json`` (last: a dataset is whole once it is
        there)."""
        parts: list[Path] = []
        out: pa.RecordBatchStreamWriter | None = None
        size = 0
        freq: Counter[int] = Counter()
        for batch in _batches(samples, freq):
            if out is None or size >= SHARD_BYTES:
                if out is not None:
                    out.close()
                part = scratch / f"part-{len(parts):05d}.arrow"
                parts.append(part)
                out = pa.ipc.new_stream(str(part), _SCHEMA)
                size = 0
            out.write_batch(batch)
            size += batch.nbytes
        if out is not None:
            out.close()
        if not parts:  # an empty dataset is one empty shard
            part = scratch / "part-00000.arrow"
            with pa.ipc.new_stream(str(part), _SCHEMA):
                pass
            parts.append(part)
        names = [f"data-{i:05d}-of-{len(parts):05d}.arrow" for i in range(len(parts))]
        for name, part in zip(names, parts, strict=True):
            yield name, part
        info = scratch / "dataset_info.json"
        info.write_text(
            json.dumps(
                {
                    "citation": "",
                    "description": "",
                    "features": _FEATURES,
                    "homepage": "",
                    "license": "",
                },
                indent=2,
            )
        )
        yield "dataset_info.json", info
        tf = scratch / "token_freq.pt"
        _save_token_freq(freq, tf)
        yield "token_freq.pt", tf
        state = scratch / "state.json"
        state.write_text(
            json.dumps(
                {
                    "_data_files": [{"filename": n} for n in names],
                    "_fingerprint": "draftdata",
                    "_format_columns": None,
                    "_format_kwargs": {},
                    "_format_type": "torch",
                    "_output_all_columns": False,
                    "_split": None,
                },
                indent=2,
            )
        )
        yield "state.json", state


def _save_token_freq(freq: Counter[int], path: Path) -> None:
    """``token_freq.pt``: {token id: count of its loss tokens}, as speculators'
    ``save_token_frequency_distribution`` writes it (its trainer builds the draft vocabulary's
    d2t/t2d maps from it), keys in increasing order so the bytes are the same each time."""
    import torch

    torch.save({int(k): int(freq[k]) for k in sorted(freq)}, str(path))


def _batches(
    samples: Iterable[SampleRow], freq: Counter[int], rows: int = 1024
) -> Iterator[pa.RecordBatch]:
    chunk: list[SampleRow] = []
    for s in samples:
        ids, counts = np.unique(s.input_ids[s.loss_mask.astype(bool)], return_counts=True)
        freq.update(dict(zip(ids.tolist(), counts.tolist(), strict=True)))
        chunk.append(s)
        if len(chunk) >= rows:
            yield _batch(chunk)
            chunk = []
    if chunk:
        yield _batch(chunk)


def _batch(chunk: list[SampleRow]) -> pa.RecordBatch:
    ids = pa.array([s.input_ids.astype(np.int64) for s in chunk], pa.list_(pa.int64()))
    mask = pa.array([s.loss_mask.astype(np.int64) for s in chunk], pa.list_(pa.int64()))
    lens = pa.array([len(s.input_ids) for s in chunk], pa.int64())
    return pa.RecordBatch.from_arrays([ids, mask, lens], schema=_SCHEMA)
