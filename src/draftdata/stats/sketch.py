"""Streaming length distributions in bounded memory: a log-bucket quantile sketch.

A ``Sketch`` counts non-negative values in buckets whose width grows geometrically (relative
accuracy 0.5% by default), so percentiles of millions of lengths cost a few thousand integers,
whatever the row count. Integer values below ~100 fall in buckets narrower than 1 and come back
exact. Count, sum, min and max are exact. This module knows nothing about datasets.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

PERCENTILES = (5, 25, 50, 75, 95, 99)


class Sketch:
    """Quantiles of a stream of non-negative numbers within ``rel`` relative error."""

    def __init__(self, rel: float = 0.005) -> None:
        self.gamma = (1 + rel) / (1 - rel)
        self._log_gamma = math.log(self.gamma)
        self.buckets: Counter[int] = Counter()
        self.zeros = 0
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, x: float) -> None:
        """Count one value (negative values count as 0)."""
        x = max(0.0, float(x))
        self.count += 1
        self.total += x
        self.min = min(self.min, x)
        self.max = max(self.max, x)
        if x == 0:
            self.zeros += 1
        else:
            self.buckets[math.ceil(math.log(x) / self._log_gamma)] += 1

    def add_many(self, values: Iterable[float] | np.ndarray) -> None:
        """Count many values at once (vectorised for numpy arrays)."""
        arr = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
        if arr.size == 0:
            return
        self.count += int(arr.size)
        self.total += float(arr.sum())
        self.min = min(self.min, float(arr.min()))
        self.max = max(self.max, float(arr.max()))
        pos = arr[arr > 0]
        self.zeros += int(arr.size - pos.size)
        if pos.size:
            idx = np.ceil(np.log(pos) / self._log_gamma).astype(np.int64)
            keys, counts = np.unique(idx, return_counts=True)
            for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
                self.buckets[k] += c

    def merge(self, other: Sketch) -> None:
        """Fold another sketch (same accuracy) into this one."""
        self.buckets.update(other.buckets)
        self.zeros += other.zeros
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float:
        """The nearest-rank value at quantile ``q`` in [0, 1] (0.0 for an empty sketch)."""
        if self.count == 0:
            return 0.0
        # nearest rank: the smallest value with at least q of the values at or below it
        rank = max(0, math.ceil(q * self.count - 1e-9) - 1)
        if rank < self.zeros:
            return 0.0
        seen = self.zeros
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen > rank:
                value = 2 * self.gamma**k / (self.gamma + 1)
                return min(max(value, self.min), self.max)
        return self.max

    def summary(self, integer: bool = True) -> dict[str, Any]:
        """count, mean, min, p5..p99, max as a JSON-ready dict (values rounded for integers)."""
        if self.count == 0:
            return {"count": 0}

        def fmt(v: float) -> float | int:
            return round(v) if integer else round(v, 3)

        out: dict[str, Any] = {"count": self.count, "mean": round(self.total / self.count, 2)}
        out["min"] = fmt(self.min)
        for p in PERCENTILES:
            out[f"p{p}"] = fmt(self.quantile(p / 100))
        out["max"] = fmt(self.max)
        out["total"] = fmt(self.total)
        return out
