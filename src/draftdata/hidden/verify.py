"""Verified, not trusted: samples recomputed one at a time and compared with what was written.

Batching and padding change what a model computes only by rounding; a padding or offset bug
(states of the wrong positions, a pad token attended to, a shifted sample) changes it by the
size of the values themselves. So after a command's samples are committed, ``--verify N`` of
them are read back from the store, decoded by the format's writer, and compared with the same
samples run through the backend alone (``states([ids])``: a batch of one, no padding):

- the token ids (and SpecForge's loss mask) in the file must equal the sample's exactly;
- per captured layer: the largest absolute difference (``max_abs``), the largest difference
  relative to the layer's largest magnitude (``max_rel``), and ``rms_rel`` = RMS(difference) /
  RMS(values), over all positions of all verified samples. ``rms_rel`` above the tolerance of
  the stored dtype and compute dtype (``tolerance``) stops the command with one line; the
  figures go into the summary either way.

Which samples: those written by this command, half of them the ones that had the most padding
in their batch (where a padding bug shows), half drawn at random with a fixed seed; when the
command wrote nothing (a rerun of a finished set), drawn from every sample file.

The tolerance (rms_rel) is the larger of the storage's and the computation's rounding: bf16
stores 8 significant bits (a value's rounding is at most 2^-9 of it, about 0.1% RMS) and a bf16
forward pass that batches differently drifts by a few tenths of a percent per layer; fp8 e4m3
keeps 4 bits (about 2.6% RMS measured). Measured on the CPU (float32 compute, bf16 storage):
0.17% rms; float32 batched against alone differs by less than 0.01% (``tests/unit/hidden``);
the planted faults there (left padding with the first rows kept, pads attended without a mask)
are more than ten times the bf16 tolerance.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from draftdata.hidden.config import LayerCheck, Verification

if TYPE_CHECKING:
    import torch

# rms_rel allowed, by stored dtype and by compute dtype (the larger applies)
STORED_TOLERANCE = {"bf16": 0.02, "fp16": 0.01, "fp32": 0.01, "fp8": 0.08}
COMPUTE_TOLERANCE = {"bfloat16": 0.02, "float16": 0.01, "float32": 0.005}


def tolerance(stored: str, compute: str) -> float:
    """The rms_rel a verified layer may differ by (see the module docstring)."""
    return max(STORED_TOLERANCE.get(stored, 0.02), COMPUTE_TOLERANCE.get(compute, 0.02))


@dataclass
class LayerSums:
    """Running sums of one layer's differences (mergeable across samples and workers)."""

    sq_diff: float = 0.0
    sq_ref: float = 0.0
    max_abs: float = 0.0
    max_ref: float = 0.0
    values: int = 0

    def add(self, other: LayerSums) -> None:
        """Fold ``other`` in."""
        self.sq_diff += other.sq_diff
        self.sq_ref += other.sq_ref
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_ref = max(self.max_ref, other.max_ref)
        self.values += other.values

    def check(self, name: str) -> LayerCheck:
        """The layer's figures."""
        rms_rel = (self.sq_diff / self.sq_ref) ** 0.5 if self.sq_ref > 0 else 0.0
        rel = self.max_abs / self.max_ref if self.max_ref > 0 else 0.0
        return LayerCheck(layer=name, max_abs=self.max_abs, max_rel=rel, rms_rel=rms_rel)


@dataclass
class SampleCheck:
    """One verified sample: ``mismatch`` says what differed outside the values (token ids,
    loss mask, shape), ``layers`` the sums per captured layer."""

    row: int
    mismatch: str | None
    layers: list[LayerSums] = field(default_factory=list)
    fp8: list[LayerSums] | None = None  # --dtype fp8: quantized against bf16, per layer


def layer_sums(stored: torch.Tensor, fresh: torch.Tensor) -> list[LayerSums]:
    """Per layer sums of ``stored`` vs ``fresh`` (both ``[T, layers, hidden]``)."""
    a = stored.float()
    b = fresh.float()
    diff = (a - b).abs()
    out = []
    for i in range(a.shape[1]):
        d, r = diff[:, i], b[:, i]
        out.append(
            LayerSums(
                sq_diff=float((d.double() ** 2).sum()),
                sq_ref=float((r.double() ** 2).sum()),
                max_abs=float(d.max()) if d.numel() else 0.0,
                max_ref=float(r.abs().max()) if r.numel() else 0.0,
                values=int(d.numel()),
            )
        )
    return out


def compare_sample(
    row: int,
    input_ids: np.ndarray,
    loss_mask: np.ndarray,
    stored_ids: np.ndarray,
    stored_mask: np.ndarray | None,
    stored: torch.Tensor,
    fresh: torch.Tensor,
) -> SampleCheck:
    """The check of one sample's file against its tokens and its fresh states."""
    if not np.array_equal(stored_ids, input_ids):
        return SampleCheck(row=row, mismatch="token ids differ from the sample's")
    if stored_mask is not None and not np.array_equal(stored_mask, loss_mask):
        return SampleCheck(row=row, mismatch="loss mask differs from the sample's")
    if tuple(stored.shape) != tuple(fresh.shape):
        return SampleCheck(
            row=row,
            mismatch=f"states shaped {list(stored.shape)}, expected {list(fresh.shape)}",
        )
    return SampleCheck(row=row, mismatch=None, layers=layer_sums(stored, fresh))


def fp8_sums(fresh: torch.Tensor) -> list[LayerSums]:
    """The error fp8 storage adds against bf16 storage, per layer, on ``fresh``."""
    import torch

    from draftdata.hidden.writer import dequantize_fp8, quantize_fp8

    values, scale = quantize_fp8(fresh)
    return layer_sums(dequantize_fp8(values, scale), fresh.to(torch.bfloat16).float())


def choose_rows(written: dict[int, float], done: Sequence[int], n: int, seed: int = 0) -> list[int]:
    """``n`` rows to verify: from ``written`` (row -> its batch's padding share), the most
    padded half and a random half; from ``done`` when nothing was written."""
    if n <= 0:
        return []
    rng = random.Random(seed)
    if not written:
        pool = sorted(done)
        return sorted(rng.sample(pool, min(n, len(pool))))
    by_padding = sorted(written, key=lambda r: (-written[r], r))
    chosen = [r for r in by_padding[: (n + 1) // 2] if written[r] > 0]
    rest = sorted(set(written) - set(chosen))
    chosen += rng.sample(rest, min(n - len(chosen), len(rest)))
    return sorted(chosen)


def summarise(
    checks: list[SampleCheck], names: list[str], tol: float
) -> tuple[Verification, list[LayerCheck] | None, str | None]:
    """The verification record, the fp8 error per layer (or None), and the one-line reason
    it failed (None when it passed)."""
    totals = [LayerSums() for _ in names]
    fp8 = [LayerSums() for _ in names] if any(c.fp8 for c in checks) else None
    worst: tuple[float, int] | None = None
    failure: str | None = None
    for c in checks:
        if c.mismatch is not None and failure is None:
            failure = f"sample row {c.row}: {c.mismatch}"
        for t, s in zip(totals, c.layers, strict=False):
            t.add(s)
        if c.layers:
            rel = max(s.check("").rms_rel for s in c.layers)
            if worst is None or rel > worst[0]:
                worst = (rel, c.row)
        if fp8 is not None and c.fp8:
            for t, s in zip(fp8, c.fp8, strict=False):
                t.add(s)
    layers = [t.check(n) for t, n in zip(totals, names, strict=True)]
    bad = [lc for lc in layers if lc.rms_rel > tol]
    if failure is None and bad:
        lc = max(bad, key=lambda x: x.rms_rel)
        failure = (
            f"layer {lc.layer} differs by {lc.rms_rel:.1%} RMS (max abs {lc.max_abs:.4g}) from "
            f"the same samples computed one at a time, over the {tol:.1%} tolerance"
            + (f" (worst: sample row {worst[1]})" if worst else "")
        )
    record = Verification(
        samples=len(checks),
        rows=[c.row for c in checks],
        tolerance=tol,
        passed=failure is None,
        layers=layers,
        worst_row=worst[1] if worst else None,
    )
    fp8_layers = [t.check(n) for t, n in zip(fp8, names, strict=True)] if fp8 else None
    return record, fp8_layers, failure
