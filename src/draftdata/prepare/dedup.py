"""Exact and near-duplicate detection over prompt text, with reference sets.

``Deduper`` keeps one index over three groups of texts: ``new`` prompts (added as they pass),
the ``existing`` dataset and the ``excluded`` benchmark prompts (added up front).
``check_many`` answers, text by text in order, whether a new prompt duplicates anything seen
so far (earlier texts of the same call included) and, if not, adds it:

- exact: an 8-byte BLAKE2 hash of ``records.normalise_text`` (whitespace-collapsed, case-folded);
- near: MinHash (``rensa``, a maintained Rust implementation) over word n-gram shingles of the
  normalised text; LSH bands (rows sharing one band are candidates) and a MinHash Jaccard
  check against ``threshold`` so a candidate is only a duplicate when its estimated
  similarity is high enough.

The text of a prompt is its user and tool turns (``dedup_text``): system prompts are shared
boilerplate in many sources (every Hermes row has the same one) and would make unrelated prompts
look alike. The first occurrence wins, so results depend on the order prompts arrive in, which
the stage keeps fixed (config order, then row order).

How it stays linear at millions of rows (docs/prepare.md; figures in docs/benchmarks.md):

- Texts are handled a batch at a time: signatures for the whole batch in one rensa call, then
  every batch row's bands looked up in the index at once and all candidates checked at once
  with numpy. Only rows that share a band with an earlier row *of the same batch* are resolved
  one by one, because whether that earlier row was kept decides whether it is a candidate.
- The index is flat numpy: per band an open-addressing table of row numbers (4 bytes a slot;
  the key is read back from the rows' band hashes), one byte per signature value in memory
  (a fold of the 32-bit value) for the Jaccard check, and the full 32-bit signatures in a
  temporary file. A candidate whose one-byte count reaches the threshold (a superset of the
  true matches, since equal values fold equal) is confirmed on its full signature read back
  from that file, so the verdict is the 32-bit one the MinHash objects would give.
- A band bucket holds at most ``bucket_cap`` rows: on templated text (every MetaMathQA
  rephrasing of one question shares the bands made of the template's words) a bucket would
  otherwise grow with the index and every new row would be checked against all of it. The
  first ``bucket_cap`` rows of a bucket stay in it as its representatives; a later row is not
  added to that bucket, but it is still indexed under its other bands, so its own near
  duplicates, which share bands beyond the template's, are still found. Below the cap the
  result is the same as checking every row that shares a band.

Nothing here reads input files; the temporary signature file lives in ``workdir`` (the
system's temporary folder when None) and is deleted on ``close`` or when the process ends.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from array import array
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from draftdata.prepare.config import DedupConfig
from draftdata.prepare.dedup_index import I64, U64, BandTables, BatchRuns, ExactTable, Rows
from draftdata.records import Message

NEW, EXISTING, EXCLUDED = 0, 1, 2
_GROUP_NAMES = ("new", "existing", "excluded")
_MINHASH_SEED = 1234  # fixed: signatures must agree between runs for determinism
BATCH = 4096  # texts per batch: large enough for numpy to pay, small enough to resolve in order
_PAIRS = 1 << 15  # candidate pairs compared per numpy step


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


def _min_equal(threshold: float, num_perm: int) -> int:
    """The fewest equal signature values whose Jaccard estimate (equal / num_perm, as rensa
    computes it) reaches ``threshold``; num_perm + 1 when none does."""
    for count in range(num_perm + 1):
        if count / num_perm >= threshold:
            return count
    return num_perm + 1


def _words(text: str) -> list[str]:
    """The words of ``records.normalise_text(text)`` (which is " ".join of them), split once:
    case folding maps each character on its own and never makes or removes whitespace, so
    folding before splitting gives the same words."""
    return text.casefold().split()


def _shingles(words: list[str], n: int) -> list[str]:
    if len(words) <= n:
        return [" ".join(words)]
    if n == 1:
        return words  # unigrams: the words themselves (no join per word)
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def _digests(words: Sequence[list[str]]) -> U64:
    """The exact-dedup hash of each text: 8-byte BLAKE2 of its normalised form."""
    blake = hashlib.blake2b
    raw = b"".join([blake(" ".join(w).encode(), digest_size=8).digest() for w in words])
    return np.frombuffer(raw, np.uint64)


def _band_hashes(sig: npt.NDArray[np.uint32], bands: int) -> U64:
    """(rows, bands) 64-bit hashes of each band's values (FNV-1a over the 32-bit values, then
    a murmur finaliser so the top bits, which pick a table slot, are well mixed)."""
    rows = sig.shape[1] // bands
    v = sig.reshape(len(sig), bands, rows).astype(np.uint64)
    h = np.full((len(sig), bands), 0xCBF29CE484222325, np.uint64)
    prime = np.uint64(0x100000001B3)
    for k in range(rows):
        h ^= v[:, :, k]
        h *= prime
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


def _equal_counts(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> I64:
    """Per row, how many of the (folded) values of ``a`` and ``b`` are equal."""
    same = a == b
    width = same.shape[1]
    counts: I64
    if width % 8 or width > 255:
        counts = np.count_nonzero(same, axis=1).astype(np.int64)
        return counts
    # the 0/1 bytes as 64-bit words: add the words up (a byte stays <= width / 8), then add
    # up a word's bytes with one multiplication (the total, <= 255, lands in the top byte)
    words = same.view(np.uint64).sum(axis=1, dtype=np.uint64)
    counts = ((words * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)
    return counts


def _fold(sig: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint8]:
    """One byte per signature value; equal values fold equal (the in-memory Jaccard filter)."""
    return ((sig * np.uint32(0x9E3779B1)) >> np.uint32(24)).astype(np.uint8)


class Deduper:
    """One exact + near-duplicate index over new, existing and excluded texts.

    ``bucket_cap`` (default: the config's) bounds the rows kept per LSH band bucket (module
    docstring); ``workdir`` is where the temporary file of full signatures goes.
    """

    def __init__(
        self,
        config: DedupConfig,
        *,
        bucket_cap: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        batch: int = BATCH,
    ) -> None:
        self.config = config
        self.bucket_cap = config.bucket_cap if bucket_cap is None else bucket_cap
        self.batch = batch
        self._exact = ExactTable()
        self._pending_refs: list[tuple[str, int]] = []
        self._workdir = workdir
        self._near = config.near
        self._perm = config.num_perm
        self._bands = _bands(config.threshold, config.num_perm)
        self._min_equal = _min_equal(config.threshold, config.num_perm)
        self._keys = Rows(self._bands, np.uint64)  # indexed row -> its band hashes
        self._folded = Rows(self._perm, np.uint8)  # indexed row -> folded signature
        self._groups = Rows(1, np.uint8)  # indexed row -> group
        self._tables = BandTables(self._bands)
        self._file: BinaryIO | None = None  # indexed row -> full signature, row after row
        self.compared = 0  # candidate signatures compared so far (the work the cap bounds)
        self._closed = False

    # -- public --------------------------------------------------------------------------

    def add_reference(self, text: str, group: int) -> None:
        """Index a text of the existing dataset (EXISTING) or an exclusion list (EXCLUDED)."""
        self._usable()
        self._pending_refs.append((text, group))
        if len(self._pending_refs) >= self.batch:
            self._flush_refs()

    def check_add(self, text: str) -> str | None:
        """None if ``text`` is new (and index it), else the kind of duplicate it is.

        Kinds: ``exact``/``near`` (another new prompt), ``existing_exact``/``existing_near``
        (the existing dataset), ``excluded_exact``/``excluded_near`` (an exclusion list).
        One text at a time is slow; ``check_many`` is the same thing for a list.
        """
        return self.check_many([text])[0]

    def check_many(self, texts: Sequence[str]) -> list[str | None]:
        """``check_add`` of each text in order (a text sees the earlier ones of the list)."""
        self._usable()
        self._flush_refs()
        out: list[str | None] = []
        for start in range(0, len(texts), self.batch):
            out.extend(self._check_batch(texts[start : start + self.batch]))
        return out

    def close(self) -> None:
        """Delete the temporary signature file (also done when the process ends); the index
        cannot be used after this."""
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None

    def __len__(self) -> int:
        self._flush_refs()
        return len(self._exact)

    def _usable(self) -> None:
        if self._closed:
            raise RuntimeError("this Deduper is closed: its signature file is gone")

    # -- signatures and the index --------------------------------------------------------

    def _signatures(self, words: Sequence[list[str]]) -> npt.NDArray[np.uint32]:
        import rensa

        n = self.config.ngram
        tokens = [_shingles(w, n) for w in words]
        matrix = rensa.RMinHash.digest_matrix_from_token_sets(
            tokens, num_perm=self._perm, seed=_MINHASH_SEED
        )
        # array.array per row then one buffer: ~2x faster than np.array on a list of lists
        raw = b"".join([array("I", row).tobytes() for row in matrix.to_rows()])
        return np.frombuffer(raw, np.uint32).reshape(len(words), self._perm)

    def _candidates(self, keys: U64) -> tuple[I64, I64, I64]:
        """For batch rows with band hashes ``keys`` (m, bands): the (batch row, indexed row)
        pairs sharing a band (a pair once per band it shares: cheaper to compare twice than
        to sort them all), and per (row, band) how many indexed rows share that band hash
        (the bucket's size)."""
        m = len(keys)
        q, rows = self._tables.lookup(keys, self._keys.view())
        sizes = np.bincount(q, minlength=m * self._bands).reshape(m, self._bands)
        return q // self._bands, rows, sizes

    def _indexed_match(self, sig: npt.NDArray[np.uint32], keys: U64) -> tuple[I64, I64]:
        """Per batch row: the highest group among indexed rows that share a band with it and
        whose Jaccard estimate reaches the threshold (-1: none), and its bucket sizes."""
        best = np.full(len(sig), -1, np.int64)
        brow, irow, sizes = self._candidates(keys)
        self.compared += len(brow)
        if not len(brow):
            return best, sizes
        folded, indexed = _fold(sig), self._folded.view()
        near = np.zeros(len(brow), bool)
        for s in range(0, len(brow), _PAIRS):  # bounded temporaries on templated text
            mine = np.take(folded, brow[s : s + _PAIRS], axis=0)
            theirs = np.take(indexed, irow[s : s + _PAIRS], axis=0)
            near[s : s + _PAIRS] = _equal_counts(mine, theirs) >= self._min_equal
        pairs = np.unique(brow[near] * (self._keys.n + 1) + irow[near])  # few: the matches
        brow, irow = pairs // (self._keys.n + 1), pairs % (self._keys.n + 1)
        groups = self._groups.view()[irow, 0].astype(np.int64)
        order = np.lexsort((-groups, brow))  # per batch row, the highest group first
        assert self._file is not None
        fd, width = self._file.fileno(), self._perm * 4
        for i in order.tolist():
            r, g = int(brow[i]), int(groups[i])
            if int(best[r]) >= g:
                continue
            full = np.frombuffer(os.pread(fd, width, int(irow[i]) * width), np.uint32)
            if int((full == sig[r]).sum()) >= self._min_equal:
                best[r] = g
        return best, sizes

    def _index(
        self,
        sig: npt.NDArray[np.uint32],
        keys: U64,
        group: int | npt.NDArray[np.uint8],
        bucket_ok: npt.NDArray[np.bool_],
        fresh: npt.NDArray[np.bool_],
    ) -> None:
        """Add rows (signatures, band hashes, groups) to the index; ``bucket_ok[i, b]``: row i
        joins its band-b bucket (False where that bucket is full); ``fresh[i, b]``: that
        bucket does not exist yet and no other row here joins it."""
        if self._file is None:
            # open until close(): the file lives as long as the index
            self._file = tempfile.TemporaryFile(dir=self._workdir, prefix=".dedup-")  # noqa: SIM115
        first = self._keys.n
        self._file.seek(0, os.SEEK_END)
        self._file.write(np.ascontiguousarray(sig, np.uint32).tobytes())
        self._file.flush()
        self._keys.extend(keys)
        self._folded.extend(_fold(sig))
        self._groups.extend(np.broadcast_to(np.asarray(group, np.uint8), len(sig))[:, None])
        row, band = np.nonzero(bucket_ok)
        self._tables.insert(
            first + row.astype(np.int64),
            band.astype(np.int64),
            self._keys.view(),
            fresh[row, band],
        )

    def _flush_refs(self) -> None:
        if not self._pending_refs:
            return
        refs, self._pending_refs = self._pending_refs, []
        if not (self.config.exact or self.config.near):
            return
        words, groups = [], []
        for text, group in refs:
            w = _words(text)
            if w:
                words.append(w)
                groups.append(group)
        if not words:
            return
        digests = _digests(words)
        g = np.array(groups, np.uint8)
        order = np.lexsort((g, digests))  # one entry per digest, with its highest group
        last = np.append(digests[order][1:] != digests[order][:-1], True)
        self._exact.raise_to(digests[order][last], g[order][last])
        if not self._near:
            return
        sig = self._signatures(words)
        keys = _band_hashes(sig, self._bands)
        _, _, sizes = self._candidates(keys)
        runs = BatchRuns(keys)
        room = runs.room(sizes, np.ones(len(words), bool), self.bucket_cap)
        self._index(sig, keys, g, room, (sizes == 0) & runs.alone())

    # -- one batch of new texts ----------------------------------------------------------

    def _check_batch(self, texts: Sequence[str]) -> list[str | None]:
        config = self.config
        words = [_words(t) for t in texts]
        digests = _digests(words)
        known = self._exact.lookup(digests).tolist()
        kinds: list[str | None] = [None] * len(texts)
        # rows the exact index already settles never need a signature
        todo = [i for i, g in enumerate(known) if not (g >= 0 and (config.exact or g != NEW))]
        for i, g in enumerate(known):
            if g >= 0 and (config.exact or g != NEW):
                kinds[i] = _kind(g, "exact")
        kept = np.zeros(len(todo), bool)
        if self._near and todo:
            sig = self._signatures([words[i] for i in todo])
            keys = _band_hashes(sig, self._bands)
            best, sizes = (
                self._indexed_match(sig, keys)
                if self._keys.n
                else (np.full(len(todo), -1, np.int64), np.zeros(keys.shape, np.int64))
            )
            runs = BatchRuns(keys)
            self._resolve(todo, digests, best.tolist(), sig, runs.shared(sizes), kinds, kept)
            if kept.any():
                room = runs.room(sizes, kept, self.bucket_cap)
                fresh = (sizes == 0) & runs.alone()
                self._index(sig[kept], keys[kept], NEW, room[kept], fresh[kept])
        else:
            seen: set[int] = set()
            for j, i in enumerate(todo):
                d = int(digests[i])
                if d in seen and config.exact:
                    kinds[i] = "exact"
                    continue
                seen.add(d)
                kept[j] = True
        new = digests[np.array(todo, np.int64)[kept]] if todo else np.zeros(0, np.uint64)
        if not config.exact:
            new = np.unique(new)  # with exact dedup on, kept rows have distinct hashes
        fresh = new[self._exact.lookup(new) < 0]  # setdefault: a known hash keeps its group
        self._exact.raise_to(fresh, np.zeros(len(fresh), np.uint8))
        return kinds

    def _resolve(
        self,
        todo: list[int],
        digests: U64,
        best: list[int],
        sig: npt.NDArray[np.uint32],
        shared: dict[int, list[tuple[int, int]]],
        kinds: list[str | None],
        kept: npt.NDArray[np.bool_],
    ) -> None:
        """Decide the batch rows in order. Matches in the index are known (``best``); what is
        left is an exact match, or a near one through a shared band bucket (``shared``: row ->
        [(bucket id, its size in the index)]), with an earlier row of this batch that was
        kept."""
        buckets: dict[int, list[int]] = {}  # bucket id -> kept rows of the batch in it
        seen: set[int] = set()
        cap, need, exact = self.bucket_cap, self._min_equal, self.config.exact
        hashes = digests.tolist()
        for j, i in enumerate(todo):
            d = hashes[i]
            if exact and d in seen:
                kinds[i] = "exact"
                continue
            group = best[j]
            mine = shared.get(j)
            if group < 0 and mine:
                earlier = {r for rid, _ in mine for r in buckets.get(rid, ())}
                if earlier:
                    self.compared += len(earlier)
                    cands = np.fromiter(earlier, np.int64, len(earlier))
                    if (np.count_nonzero(sig[cands] == sig[j], axis=1) >= need).any():
                        group = NEW
            if group >= 0:
                kinds[i] = _kind(group, "near")
                continue
            seen.add(d)
            kept[j] = True
            for rid, size in mine or ():
                members = buckets.setdefault(rid, [])
                if size + len(members) < cap:
                    members.append(j)


def _kind(group: int, match: str) -> str:
    return match if group == NEW else f"{_GROUP_NAMES[group]}_{match}"


DUPLICATE_KINDS = tuple(_kind(g, m) for g in (NEW, EXISTING, EXCLUDED) for m in ("exact", "near"))
