"""Two plain one-text-at-a-time dedupers the batched numpy ``Deduper`` is checked against.

- ``OldDeduper``: the implementation before the index was rebuilt for millions of rows
  (rensa ``RMinHash`` objects, rensa's ``RMinHashLSH`` for candidates, one Python Jaccard per
  candidate), kept here as the reference for "the same duplicates found". It counts the
  candidates it compares, like ``Deduper.compared``.
- ``CappedModel``: the same rules with band buckets held as Python lists that stop taking rows
  at ``cap`` (the ``bucket_cap`` rule), in the simplest form: what the batches, the numpy
  tables, the folded signatures and the signature file must add up to, for any cap.

Both build each text's signature with its own ``RMinHash`` object, so they also check that the
batched signatures equal the one-object ones.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rensa

from draftdata.prepare.config import DedupConfig
from draftdata.prepare.dedup import NEW, _bands, _kind, _min_equal
from draftdata.records import normalise_text

SEED = 1234  # the deduper's MinHash seed


def _minhash(norm: str, config: DedupConfig) -> Any:
    words = norm.split()
    n = config.ngram
    if len(words) <= n:
        shingles = [" ".join(words)]
    else:
        shingles = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
    mh = rensa.RMinHash(num_perm=config.num_perm, seed=SEED)
    mh.update(shingles)
    return mh


def _digest(norm: str) -> bytes:
    return hashlib.blake2b(norm.encode(), digest_size=8).digest()


class OldDeduper:
    """The pre-numpy implementation (rensa LSH + one Jaccard per candidate)."""

    def __init__(self, config: DedupConfig) -> None:
        self.config = config
        self._exact: dict[bytes, int] = {}
        self._groups: list[int] = []
        self._signatures: list[Any] = []
        self.compared = 0
        self._lsh: Any = None
        if config.near:
            self._lsh = rensa.RMinHashLSH(
                threshold=config.threshold,
                num_perm=config.num_perm,
                num_bands=_bands(config.threshold, config.num_perm),
            )

    def _near(self, mh: Any) -> int | None:
        best: int | None = None
        for key in sorted(self._lsh.query(mh)):
            self.compared += 1
            if mh.jaccard(self._signatures[key]) >= self.config.threshold:
                group = self._groups[key]
                if best is None or group > best:
                    best = group
        return best

    def _insert(self, mh: Any, group: int) -> None:
        key = len(self._signatures)
        self._signatures.append(mh)
        self._groups.append(group)
        self._lsh.insert(key, mh)

    def add_reference(self, text: str, group: int) -> None:
        norm = normalise_text(text)
        if not norm:
            return
        digest = _digest(norm)
        if self.config.exact or self.config.near:
            self._exact[digest] = max(group, self._exact.get(digest, group))
        if self._lsh is not None:
            self._insert(_minhash(norm, self.config), group)

    def check_add(self, text: str) -> str | None:
        norm = normalise_text(text)
        digest = _digest(norm)
        group = self._exact.get(digest)
        if group is not None and (self.config.exact or group != NEW):
            return _kind(group, "exact")
        mh = None
        if self._lsh is not None:
            mh = _minhash(norm, self.config)
            near = self._near(mh)
            if near is not None:
                return _kind(near, "near")
        self._exact.setdefault(digest, NEW)
        if mh is not None:
            self._insert(mh, NEW)
        return None


class CappedModel:
    """The bucket-cap rule in plain Python: a band bucket keeps its first ``cap`` rows."""

    def __init__(self, config: DedupConfig, cap: int) -> None:
        self.config, self.cap = config, cap
        self.bands = _bands(config.threshold, config.num_perm)
        self.rows = config.num_perm // self.bands
        self.need = _min_equal(config.threshold, config.num_perm)
        self._exact: dict[bytes, int] = {}
        self._buckets: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        self._signatures: list[list[int]] = []
        self._groups: list[int] = []

    def _bucket_keys(self, sig: list[int]) -> list[tuple[int, tuple[int, ...]]]:
        r = self.rows
        return [(b, tuple(sig[b * r : (b + 1) * r])) for b in range(self.bands)]

    def _insert(self, sig: list[int], group: int) -> None:
        row = len(self._signatures)
        self._signatures.append(sig)
        self._groups.append(group)
        for key in self._bucket_keys(sig):
            members = self._buckets.setdefault(key, [])
            if len(members) < self.cap:
                members.append(row)

    def add_reference(self, text: str, group: int) -> None:
        norm = normalise_text(text)
        if not norm:
            return
        digest = _digest(norm)
        if self.config.exact or self.config.near:
            self._exact[digest] = max(group, self._exact.get(digest, group))
        if self.config.near:
            self._insert(_minhash(norm, self.config).digest(), group)

    def check_add(self, text: str) -> str | None:
        norm = normalise_text(text)
        digest = _digest(norm)
        group = self._exact.get(digest)
        if group is not None and (self.config.exact or group != NEW):
            return _kind(group, "exact")
        sig = None
        if self.config.near:
            sig = _minhash(norm, self.config).digest()
            best = -1
            for key in self._bucket_keys(sig):
                for row in self._buckets.get(key, ()):
                    equal = sum(a == b for a, b in zip(sig, self._signatures[row], strict=True))
                    if equal >= self.need:
                        best = max(best, self._groups[row])
            if best >= 0:
                return _kind(best, "near")
        self._exact.setdefault(digest, NEW)
        if sig is not None:
            self._insert(sig, NEW)
        return None
