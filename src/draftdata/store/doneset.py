"""The compact done-set: which (id, sample) pairs a run has already settled.

Each pair is hashed to 64 bits with Python's own keyed string hash (SipHash over ``id``, or
``id + NUL + sample`` for sample > 0): about 0.1 us per id, which matters when resume hashes a
million ids, and cached on the string. The key is random per process, so hashes are never
stored or compared across processes; every process rebuilds its set from the shards' id
columns. Committed pairs live in one sorted array of unsigned 64-bit values (8 bytes each: 1M
done prompts take 8 MB) with a small bucket index over the top bits, so a lookup is a bisect
over a handful of entries (~1 us, no numpy call per lookup). Pairs added during this process go
into a small Python set that is folded into the array when it grows. With 64-bit hashes the
chance that any new prompt is wrongly taken as done is about n_done * n_new / 2**64 (below 1e-7
for a million each).

This module does not read shards; ``run.py`` feeds it the id columns.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

_FOLD_AT = 65536
_MASK = (1 << 64) - 1
_PER_BUCKET = 8  # target entries per index bucket


def pair_hash(id_: str, sample: int = 0) -> int:
    """The 64-bit hash (0 <= h < 2**64) of one (id, sample) pair, valid in this process."""
    return hash(id_ if sample == 0 else f"{id_}\x00{sample}") & _MASK


def hash_pairs(ids: Iterable[str], samples: Iterable[int] | None = None) -> npt.NDArray[np.uint64]:
    """The hashes of many pairs as a uint64 array (``samples`` None means all 0)."""
    keys = ids if isinstance(ids, list) else list(ids)
    if samples is not None:
        nums = samples if isinstance(samples, list) else list(samples)
        if len(nums) != len(keys):
            raise ValueError(f"hash_pairs: {len(keys)} ids but {len(nums)} samples")
        if any(nums):  # the common all-zero case hashes the ids as they are
            keys = [i if s == 0 else f"{i}\x00{s}" for i, s in zip(keys, nums, strict=True)]
    # map(hash, ...) runs without a Python frame per id: ~0.1 us each
    return np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)).view(np.uint64)


def _sorted_unique(hashes: npt.NDArray[np.uint64] | None) -> npt.NDArray[np.uint64]:
    # a plain sort and a neighbour compare: faster than np.unique's hash-then-sort path here
    if hashes is None or not len(hashes):
        return np.empty(0, np.uint64)
    arr = np.sort(hashes)
    keep = np.empty(len(arr), dtype=bool)
    keep[0] = True
    np.not_equal(arr[1:], arr[:-1], out=keep[1:])
    return arr[keep]


class DoneSet:
    """A set of (id, sample) pairs held as 64-bit hashes."""

    def __init__(self, hashes: npt.NDArray[np.uint64] | None = None) -> None:
        self._new: set[int] = set()
        self._set_sorted(_sorted_unique(hashes))

    def _set_sorted(self, sorted_hashes: npt.NDArray[np.uint64]) -> None:
        # The values live once, in an array("Q") (fast Python-int indexing for bisect); numpy
        # sees the same memory through a zero-copy view for set operations.
        values = array("Q")
        values.frombytes(np.ascontiguousarray(sorted_hashes, dtype=np.uint64).tobytes())
        self._values = values
        self._sorted: npt.NDArray[np.uint64] = np.frombuffer(values, dtype=np.uint64)
        n = len(values)
        bits = max(0, min(24, (n // _PER_BUCKET).bit_length()))
        self._shift = 64 - bits
        bounds = np.arange(1 << bits, dtype=np.uint64) << np.uint64(self._shift % 64)
        starts = np.searchsorted(self._sorted, bounds) if bits else np.zeros(1, np.int64)
        self._index = array("Q", [*starts.tolist(), n])

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
        b = h >> self._shift
        lo, hi = self._index[b], self._index[b + 1]
        if lo == hi:
            return False
        i = bisect_left(self._values, h, lo, hi)
        return i < hi and self._values[i] == h

    def contains(self, id_: str, sample: int = 0) -> bool:
        """Whether (id, sample) is in the set."""
        return self.contains_hash(pair_hash(id_, sample))

    def contains_many(self, hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Membership of many hashes at once (one vectorised search, no Python loop)."""
        arr = self._sorted
        found: npt.NDArray[np.bool_] = np.zeros(len(hashes), dtype=bool)
        if len(arr):
            pos = np.searchsorted(arr, hashes)
            np.equal(arr[np.minimum(pos, len(arr) - 1)], hashes, out=found)
        if self._new:
            extra = np.fromiter(self._new, dtype=np.uint64, count=len(self._new))
            found |= np.isin(hashes, extra)
        return found

    def add_hash(self, h: int) -> bool:
        """Add ``h``; False if it was already there."""
        if self.contains_hash(h):
            return False
        self._new.add(h)
        if len(self._new) >= _FOLD_AT:
            self._fold()
        return True

    def first_seen(self, hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Add many hashes at once; True where one is new: not in the set before and not
        earlier in ``hashes`` (readers keep the first copy of a pair, in shard order)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        mask = ~self.contains_many(hashes)
        if len(hashes):
            _, first = np.unique(hashes, return_index=True)
            once = np.zeros(len(hashes), dtype=bool)
            once[first] = True
            mask &= once
        self._new.update(hashes[mask].tolist())
        if len(self._new) >= _FOLD_AT:
            self._fold()
        return mask

    def add(self, id_: str, sample: int = 0) -> bool:
        """Add (id, sample); False if it was already there."""
        return self.add_hash(pair_hash(id_, sample))

    def _fold(self) -> None:
        if not self._new:
            return
        extra = np.fromiter(self._new, dtype=np.uint64, count=len(self._new))
        self._set_sorted(np.union1d(self._sorted, extra))
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
        return 8 * (len(self._values) + len(self._index)) + 60 * len(self._new)
