"""Exact and near-duplicate detection over prompt text, with reference sets.

``Deduper`` keeps one index over three groups of texts: ``new`` prompts (added as they pass),
the ``existing`` dataset and the ``excluded`` benchmark prompts (added up front). ``check_add``
answers whether a new prompt duplicates anything seen so far and, if not, adds it:

- exact: an 8-byte BLAKE2 hash of ``records.normalise_text`` (whitespace-collapsed, case-folded);
- near: MinHash (``rensa``, a maintained Rust implementation) over word n-gram shingles of the
  normalised text, an LSH index for candidates, and a MinHash Jaccard check against
  ``threshold`` so a candidate is only a duplicate when its estimated similarity is high enough.

The text of a prompt is its user and tool turns (``dedup_text``): system prompts are shared
boilerplate in many sources (every Hermes row has the same one) and would make unrelated prompts
look alike. The first occurrence wins, so results depend on the order prompts arrive in, which
the stage keeps fixed (config order, then row order). Nothing here reads files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from draftdata.prepare.config import DedupConfig
from draftdata.records import Message, normalise_text

NEW, EXISTING, EXCLUDED = 0, 1, 2
_GROUP_NAMES = ("new", "existing", "excluded")
_MINHASH_SEED = 1234  # fixed: signatures must agree between runs for determinism


def dedup_text(messages: Sequence[Message]) -> str:
    """The text duplicates are judged on: the user and tool turns, joined by newlines."""
    return "\n".join(m.content or "" for m in messages if m.role in ("user", "tool"))


def _bands(threshold: float, num_perm: int) -> int:
    # The (bands, rows) split whose S-curve midpoint (1/b)^(1/r) is closest to the threshold,
    # shifted a little lower so candidates near the threshold are not missed (recall first;
    # the Jaccard check then removes false candidates).
    best, best_err = 1, 9.0
    for b in range(1, num_perm + 1):
        if num_perm % b:
            continue
        r = num_perm // b
        err = abs((1.0 / b) ** (1.0 / r) - (threshold - 0.1))
        if err < best_err:
            best, best_err = b, err
    return best


class Deduper:
    """One exact + near-duplicate index over new, existing and excluded texts."""

    def __init__(self, config: DedupConfig) -> None:
        self.config = config
        self._exact: dict[bytes, int] = {}  # text hash -> group
        self._groups: list[int] = []  # LSH key -> group
        self._signatures: list[object] = []  # LSH key -> RMinHash
        self._lsh: object | None = None
        if config.near:
            import rensa

            self._lsh = rensa.RMinHashLSH(
                threshold=config.threshold,
                num_perm=config.num_perm,
                num_bands=_bands(config.threshold, config.num_perm),
            )

    def _minhash(self, norm: str) -> object:
        import rensa

        words = norm.split()
        n = self.config.ngram
        if len(words) <= n:
            shingles = [" ".join(words)]
        elif n == 1:
            shingles = words  # unigrams: the words themselves (no join per word)
        else:
            shingles = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
        mh = rensa.RMinHash(num_perm=self.config.num_perm, seed=_MINHASH_SEED)
        mh.update(shingles)
        return mh

    def _near(self, mh: object) -> int | None:
        assert self._lsh is not None
        best: int | None = None
        for key in sorted(self._lsh.query(mh)):  # type: ignore[attr-defined]
            if mh.jaccard(self._signatures[key]) >= self.config.threshold:  # type: ignore[attr-defined]
                group = self._groups[key]
                if best is None or group > best:
                    best = group  # report "excluded" over "existing" over "new"
        return best

    def _insert(self, mh: object, group: int) -> None:
        assert self._lsh is not None
        key = len(self._signatures)
        self._signatures.append(mh)
        self._groups.append(group)
        self._lsh.insert(key, mh)  # type: ignore[attr-defined]

    def add_reference(self, text: str, group: int) -> None:
        """Index a text of the existing dataset (EXISTING) or an exclusion list (EXCLUDED)."""
        norm = normalise_text(text)
        if not norm:
            return
        digest = hashlib.blake2b(norm.encode(), digest_size=8).digest()
        if self.config.exact or self.config.near:
            self._exact[digest] = max(group, self._exact.get(digest, group))
        if self._lsh is not None:
            self._insert(self._minhash(norm), group)

    def check_add(self, text: str) -> str | None:
        """None if ``text`` is new (and index it), else the kind of duplicate it is.

        Kinds: ``exact``/``near`` (another new prompt), ``existing_exact``/``existing_near``
        (the existing dataset), ``excluded_exact``/``excluded_near`` (an exclusion list).
        """
        norm = normalise_text(text)
        digest = hashlib.blake2b(norm.encode(), digest_size=8).digest()
        group = self._exact.get(digest)
        if group is not None and (self.config.exact or group != NEW):
            return _kind(group, "exact")
        mh = None
        if self._lsh is not None:
            mh = self._minhash(norm)
            near = self._near(mh)
            if near is not None:
                return _kind(near, "near")
        self._exact.setdefault(digest, NEW)
        if mh is not None:
            self._insert(mh, NEW)
        return None

    def __len__(self) -> int:
        return len(self._exact)


def _kind(group: int, match: str) -> str:
    return match if group == NEW else f"{_GROUP_NAMES[group]}_{match}"


DUPLICATE_KINDS = tuple(_kind(g, m) for g in (NEW, EXISTING, EXCLUDED) for m in ("exact", "near"))
