"""SpecForge's offline files: one ``hidden_states/data_<row>.ckpt`` (or ``.ckpt.gz``) per sample.

SpecForge 0.2.0 trains EAGLE-3 offline from a folder of feature files: ``list_local_files``
(and the runtime's ``OfflineManifestReader``) walk it for every ``*.ckpt`` / ``*.ckpt.gz``,
sorted, and ``OfflineEagle3Dataset`` (the runtime: ``feature_store.load_feature_file`` then
``normalize_offline_sample``) ``torch.load``\\ s each (gzip-decompressed for ``.gz``) as a dict:

- ``input_ids``: int64 ``[T]`` and ``loss_mask``: int64 ``[T]`` (1-D: the reader adds the batch
  dimension itself; it zeroes the last position's loss);
- ``hidden_state``: ``[1, T, hidden]``, the last layer *after* the final norm (the training
  target: SpecForge's target head applies only the lm_head to it);
- ``aux_hidden_state``: ``[1, T, aux * hidden]``, the aux layers concatenated along the last
  dimension in layer order (the drafter's input).

Files hold only tensors, so ``torch.load(..., weights_only=True)`` reads them too. SpecForge
reads bf16 (its drafter's dtype); fp8 is not offered (its reader would hand fp8 tensors to the
drafter). ``--compress gzip`` writes ``.ckpt.gz``, which both readers decompress whole.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from draftdata.hidden.layers import LastNorm
from draftdata.hidden.writer import (
    DTYPE_BYTES,
    HIDDEN_FOLDER,
    Compression,
    RowFiles,
    SampleRow,
    Stored,
    StoredDtype,
    torch_dtype,
)

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")
# torch.save's zip container around 4 tensors (records aligned to 64 bytes), measured on torch
# 2.13: 2,205-2,317 bytes for 1 to 1,000 tokens
ZIP_OVERHEAD = 2300
GZIP_LEVEL = 1  # activations are nearly incompressible; level 1 gets what there is, fast


class SpecForgeWriter(RowFiles):
    """SpecForge 0.2.0's offline ``.ckpt`` files (see the module docstring)."""

    format = "specforge"
    dtypes: ClassVar[tuple[StoredDtype, ...]] = ("bf16", "fp16", "fp32")
    compressions: ClassVar[tuple[Compression, ...]] = ("none", "gzip")
    NAME = _NAME

    @property
    def capture_last(self) -> LastNorm:
        """After the final norm: what SpecForge's target head turns into logits."""
        return "post_norm"

    def key(self, row: int) -> str:
        """``hidden_states/data_<row>.ckpt`` (``.ckpt.gz`` with gzip)."""
        ext = ".ckpt.gz" if self.compress == "gzip" else ".ckpt"
        return f"{HIDDEN_FOLDER}data_{row}{ext}"

    def row_of(self, key: str) -> int | None:
        """The row of one of this writer's keys (the compression must match too)."""
        m = self._match(key)
        if m is None or bool(m.group(2)) != (self.compress == "gzip"):
            return None
        return int(m.group(1))

    def encode(self, sample: SampleRow, states: torch.Tensor) -> bytes:
        """The ``torch.save`` bytes of the sample's dict (gzip-compressed with ``gzip``)."""
        import torch

        t, layers, hidden = states.shape
        typed = states.to(torch_dtype(self.dtype))
        data = {
            "input_ids": torch.from_numpy(np.ascontiguousarray(sample.input_ids, np.int64)),
            "loss_mask": torch.from_numpy(np.ascontiguousarray(sample.loss_mask, np.int64)),
            # clone: a view would save its whole storage (the other layers too)
            "hidden_state": typed[:, -1, :].clone().unsqueeze(0),
            "aux_hidden_state": typed[:, :-1, :].reshape(t, (layers - 1) * hidden).clone()[None],
        }
        buf = io.BytesIO()
        torch.save(data, buf)
        raw = buf.getvalue()
        if self.compress == "gzip":
            return gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0)
        return raw

    def decode(self, data: bytes) -> Stored:
        """The tokens, loss mask and states ``[T, aux + 1, hidden]`` of one file."""
        import torch

        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        d = torch.load(io.BytesIO(data), weights_only=True)
        last = d["hidden_state"].squeeze(0)
        aux = d["aux_hidden_state"].squeeze(0)
        t, hidden = last.shape
        states = torch.cat([aux.reshape(t, -1, hidden), last.unsqueeze(1)], dim=1)
        return Stored(
            input_ids=d["input_ids"].numpy().astype(np.int64),
            loss_mask=d["loss_mask"].numpy().astype(np.int64),
            states=states.float(),
        )

    def predicted_bytes(self, num_tokens: int, layers: int, hidden: int) -> int:
        """The uncompressed file: the tensors (two int64 lists and the states) plus the zip."""
        return num_tokens * (16 + layers * hidden * DTYPE_BYTES[self.dtype]) + ZIP_OVERHEAD

    def dataset_files(
        self, samples: Iterable[SampleRow], scratch: Path
    ) -> Iterator[tuple[str, Path]]:
        """None: each file carries its own input_ids and loss_mask."""
        return iter(())
