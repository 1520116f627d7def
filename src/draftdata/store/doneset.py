"""The compact done-set: which (id, sample) pairs a run has already settled.

Each pair is hashed to 64 bits (blake2b of ``id`` + ``sample``). Committed pairs live in one
sorted ``numpy.uint64`` array (8 bytes each: 1M done prompts take 8 MB); pairs added during this
process go into a small Python set that is folded into the array when it grows. Membership is a
binary search. With 64-bit hashes the chance that any new prompt is wrongly taken as done is
about n_done * n_new / 2**64 (below 1e-7 for a million each).

This module does not read shards; ``run.py`` feeds it the id columns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

_FOLD_AT = 65536


def pair_hash(id_: str, sample: int = 0) -> int:
    """The 64-bit hash of one (id, sample) pair."""
    data = id_.encode() if sample == 0 else f"{id_}\x00{sample}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def hash_pairs(ids: Iterable[str], samples: Iterable[int] | None = None) -> npt.NDArray[np.uint64]:
    """The hashes of many pairs as a uint64 array (``samples`` None means all 0)."""
    if samples is None:
        values = [pair_hash(i) for i in ids]
    else:
        values = [pair_hash(i, s) for i, s in zip(ids, samples, strict=True)]
    return np.fromiter(values, dtype=np.uint64, count=len(values))


class DoneSet:
    """A set of (id, sample) pairs held as 64-bit hashes."""

    def __init__(self, hashes: npt.NDArray[np.uint64] | None = None) -> None:
        self._sorted: npt.NDArray[np.uint64] = (
            np.unique(hashes) if hashes is not None and len(hashes) else np.empty(0, np.uint64)
        )
        self._new: set[int] = set()

    @classmethod
    def from_chunks(cls, chunks: Iterable[npt.NDArray[np.uint64]]) -> DoneSet:
        """Build from several hash arrays (one per shard)."""
        parts = [c for c in chunks if len(c)]
        return cls(np.concatenate(parts) if parts else None)

    def __len__(self) -> int:
        return len(self._sorted) + len(self._new)

    def contains_hash(self, h: int) -> bool:
        """Whether the hash ``h`` is in the set."""
        if h in self._new:
            return True
        arr = self._sorted
        if not len(arr):
            return False
        i = int(np.searchsorted(arr, np.uint64(h)))
        return i < len(arr) and int(arr[i]) == h

    def contains(self, id_: str, sample: int = 0) -> bool:
        """Whether (id, sample) is in the set."""
        return self.contains_hash(pair_hash(id_, sample))

    def add_hash(self, h: int) -> bool:
        """Add ``h``; False if it was already there."""
        if self.contains_hash(h):
            return False
        self._new.add(h)
        if len(self._new) >= _FOLD_AT:
            self._fold()
        return True

    def add(self, id_: str, sample: int = 0) -> bool:
        """Add (id, sample); False if it was already there."""
        return self.add_hash(pair_hash(id_, sample))

    def _fold(self) -> None:
        if not self._new:
            return
        extra = np.fromiter(self._new, dtype=np.uint64, count=len(self._new))
        self._sorted = np.union1d(self._sorted, extra)
        self._new.clear()

    def hashes(self) -> npt.NDArray[np.uint64]:
        """All hashes as one sorted array."""
        self._fold()
        return self._sorted

    def minus(self, other: DoneSet) -> DoneSet:
        """A new set of the pairs here that are not in ``other``."""
        return DoneSet(np.setdiff1d(self.hashes(), other.hashes(), assume_unique=True))

    @property
    def nbytes(self) -> int:
        """Approximate memory held (array bytes plus ~60 bytes per unfolded entry)."""
        return int(self._sorted.nbytes) + 60 * len(self._new)
