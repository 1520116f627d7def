"""The writer seam: one sample's states -> the bytes of the file a trainer's offline reader takes.

A writer knows one trainer's file format and nothing of stores, engines or batching::

    writer = writer_for("speculators", dtype="bf16", compress="none")   # writers.py
    writer.capture_last            # "pre_norm" / "post_norm": the last layer as this trainer
                                   # reads it (the stage asks the backend for exactly that)
    key = writer.key(row)          # "hidden_states/hs_17.safetensors": derived from the row
    writer.row_of(key)             # 17 (None for a key that is not one of its files)
    data = writer.encode(sample, states)   # states: [T, layers, hidden] from the backend
    back = writer.decode(data)     # Stored: the token ids, loss mask and states it holds
    writer.predicted_bytes(T, layers, hidden)   # the file's size, for the bill
    writer.dataset_files(samples, scratch)      # files beside them the trainer needs (its
                                   # dataset of input_ids / loss_mask), or none

- A sample's file name is a function of its *row*: its position in the plan (``plan.py``),
  fixed before any forward pass and recorded in ``index.parquet``. So a file from a killed run
  is found by name, never written twice, and the done-set is the listing of these names.
- ``encode`` is pure: the same sample and states give the same bytes.
- Stored dtypes (``--dtype``): ``bf16`` (default), ``fp16``, ``fp32``, and ``fp8`` (e4m3 with a
  float32 scale per token, speculators' own fp8 layout; only a writer whose trainer reads it
  takes it: ``dtypes``).

The formats are ``speculators.py`` and ``specforge.py``; ``writers.py`` maps ``--format`` to them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

import numpy as np
import numpy.typing as npt

from draftdata.hidden.layers import LastNorm

if TYPE_CHECKING:
    import torch

StoredDtype = Literal["bf16", "fp16", "fp32", "fp8"]
Compression = Literal["none", "gzip"]
HIDDEN_FOLDER = "hidden_states/"

# bytes per stored value
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


@dataclass(frozen=True)
class SampleRow:
    """One sample as the stage hands it to a writer: its row (file number), id, and tokens."""

    row: int
    id: str
    input_ids: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.int64]


@dataclass(frozen=True)
class Stored:
    """What one written file holds, read back: ``states`` as float32 ``[T, layers, hidden]``
    (aux layers, then the last), ``loss_mask`` None where the file carries none."""

    input_ids: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.int64] | None
    states: torch.Tensor


class Writer(Protocol):
    """One trainer's offline file format (see the module docstring)."""

    format: str
    dtype: StoredDtype
    compress: Compression

    @property
    def capture_last(self) -> LastNorm:
        """The last layer as this trainer reads it: before or after the final norm."""
        ...

    def key(self, row: int) -> str:
        """The store key of row ``row``'s file."""
        ...

    def row_of(self, key: str) -> int | None:
        """The row a listed key holds, or None when the key is not one of this format's files."""
        ...

    def encode(self, sample: SampleRow, states: torch.Tensor) -> bytes:
        """The file's bytes for ``sample`` and its ``[T, layers, hidden]`` states."""
        ...

    def decode(self, data: bytes) -> Stored:
        """What a file of this format holds (for verification and tests)."""
        ...

    def predicted_bytes(self, num_tokens: int, layers: int, hidden: int) -> int:
        """The size of one sample's file of ``num_tokens`` tokens (before compression)."""
        ...

    def dataset_files(
        self, samples: Iterable[SampleRow], scratch: Path
    ) -> Iterator[tuple[str, Path]]:
        """(key, local file) of the files the trainer reads beside the states (written under
        ``scratch``), in order; none for a format whose sample files are self-contained."""
        ...


class RowFiles:
    """What the formats share: the stored dtype and compression they were made with, and file
    names that are a row number in a pattern (``NAME``, the row its first group)."""

    NAME: ClassVar[re.Pattern[str]]

    def __init__(self, *, dtype: StoredDtype = "bf16", compress: Compression = "none") -> None:
        self.dtype = dtype
        self.compress = compress

    def _match(self, key: str) -> re.Match[str] | None:
        """The name pattern's match on a key in the states' folder, else None."""
        if not key.startswith(HIDDEN_FOLDER):
            return None
        return self.NAME.match(key[len(HIDDEN_FOLDER) :])


def torch_dtype(dtype: StoredDtype) -> torch.dtype:
    """The torch dtype a stored dtype is written in."""
    import torch

    return {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp32": torch.float32,
        "fp8": torch.float8_e4m3fn,
    }[dtype]


def quantize_fp8(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``states`` ``[T, ...]`` as float8 e4m3 and a float32 scale per token ``[T, 1, ...]``:
    scale = the token's largest magnitude / 448 (at least 1e-12), value = states / scale."""
    import torch

    wide = states.float()
    dims = tuple(range(1, wide.dim()))
    amax = wide.abs().amax(dim=dims, keepdim=True)
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    return (wide / scale).to(torch.float8_e4m3fn), scale


def dequantize_fp8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 states from fp8 ``values`` and their per-token ``scale``."""
    return values.float() * scale.float()
