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

How it stays linear at millions of rows (docs/prepare.md has the figures):

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
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from draftdata.prepare.config import DedupConfig
from draftdata.records import Message

NEW, EXISTING, EXCLUDED = 0, 1, 2
_GROUP_NAMES = ("new", "existing", "excluded")
_MINHASH_SEED = 1234  # fixed: signatures must agree between runs for determinism
BATCH = 4096  # texts per batch: large enough for numpy to pay, small enough to resolve in order
_PAIRS = 1 << 15  # candidate pairs compared per numpy step

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


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


class _Rows:
    """A growable 2-D array, one row per indexed text (doubled when full: np.empty pages are
    only resident once written)."""

    def __init__(self, width: int, dtype: Any) -> None:
        self.data: npt.NDArray[Any] = np.empty((1024, width), dtype)
        self.n = 0

    def extend(self, block: npt.NDArray[Any]) -> None:
        need = self.n + len(block)
        if need > len(self.data):
            grown = np.empty((max(need, 2 * len(self.data)), self.data.shape[1]), self.data.dtype)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : need] = block
        self.n = need

    def view(self) -> npt.NDArray[Any]:
        return self.data[: self.n]


_TOMB = np.uint32(0xFFFFFFFF)  # a slot whose rows moved to a big bucket: probe on past it
_BIG = np.uint32(0x80000000)  # flag: the slot points at big bucket (value & ~_BIG)
_SMALL = 4  # rows of one band hash kept in the probe run; one more moves them to a big bucket


class _BandTables:
    """Per band an open-addressing multimap band hash -> indexed rows, with linear probing.

    All bands live in one flat array (band b's table is slots[b * size : (b + 1) * size]) so a
    batch's lookups for every band run as one numpy pass. A slot holds row + 1 (0 = empty, so
    np.zeros tables cost no memory until used), with the row's band hash read back from the
    rows' hashes; up to ``_SMALL`` rows of one hash sit in its probe run. A hash with more
    rows (templated text) gets a big bucket: one slot points at it, the run's other slots
    become tombstones, and its rows live in a numpy array, so a lookup walks a short run and
    takes the big bucket's rows in one step. Nothing is removed. The tables double when the
    fullest band is half full.
    """

    def __init__(self, bands: int) -> None:
        self.bands = bands
        self.bits = 12
        self.slots = np.zeros(bands << self.bits, np.uint32)
        self.filled = np.zeros(bands, np.int64)  # used slots per band (tombstones included)
        self.big_keys = _Rows(1, np.uint64)  # big bucket -> its band hash
        self.big_rows: list[I64] = []  # big bucket -> its rows (an array with spare room)
        self.big_len: list[int] = []

    def _start(self, hashes: U64, band: I64) -> I64:
        home = (hashes >> np.uint64(64 - self.bits)).astype(np.int64)
        return (band << self.bits) + home

    def _next(self, pos: I64) -> I64:
        # the next slot of the same band's table, wrapping around at its end
        size = 1 << self.bits
        return (pos & ~(size - 1)) | ((pos + 1) & (size - 1))

    def _find(self, hashes: U64, band: I64, keys: U64) -> tuple[I64, I64, npt.NDArray[np.uint32]]:
        """(query, slot, slot value) for every slot holding a row or a big bucket of the query's
        band hash; ``keys`` is the indexed rows' band hashes, flattened."""
        big_keys = self.big_keys.view()[:, 0]
        idx = np.arange(len(hashes), dtype=np.int64)
        pos = self._start(hashes, band)
        found: list[tuple[I64, I64, npt.NDArray[np.uint32]]] = []
        while idx.size:
            v = self.slots[pos]
            live = v != 0
            idx, pos, v = idx[live], pos[live], v[live]
            big = (v & _BIG) != 0
            tomb = v == _TOMB
            key = np.zeros(len(v), np.uint64)
            small = ~big
            key[small] = keys[(v[small].astype(np.int64) - 1) * self.bands + band[idx[small]]]
            pointer = big & ~tomb
            key[pointer] = big_keys[(v[pointer] & ~_BIG).astype(np.int64)]
            hit = ~tomb & (key == hashes[idx])
            if hit.any():
                found.append((idx[hit], pos[hit], v[hit]))
            pos = self._next(pos)
        if not found:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint32)
        return (
            np.concatenate([f[0] for f in found]),
            np.concatenate([f[1] for f in found]),
            np.concatenate([f[2] for f in found]),
        )

    def lookup(self, queries: U64, keys: U64) -> tuple[I64, I64]:
        """(query index, row) for every indexed row whose band hash equals a query's, where
        ``queries`` is (m, bands), ``keys`` the indexed rows' band hashes and query index =
        i * bands + band."""
        band = np.tile(np.arange(self.bands, dtype=np.int64), len(queries))
        q, _, v = self._find(queries.ravel(), band, keys.ravel())
        big = (v & _BIG) != 0
        rows = v[~big].astype(np.int64) - 1
        if not big.any():
            return q[~big], rows
        ids = (v[big] & ~_BIG).astype(np.int64).tolist()
        members = [self.big_rows[i][: self.big_len[i]] for i in ids]
        lengths = np.fromiter(map(len, members), np.int64, len(members))
        return (
            np.concatenate([q[~big], np.repeat(q[big], lengths)]),
            np.concatenate([rows, *members]),
        )

    def insert(self, rows: I64, band: I64, keys: U64, fresh: npt.NDArray[np.bool_]) -> None:
        """Index row ``rows[i]`` under band ``band[i]``; ``keys`` holds every indexed row's
        band hashes (these rows' included). ``fresh[i]``: that band hash has no bucket yet and
        no other entry of this call has it (most entries; they go straight into a free slot)."""
        if not len(rows):
            return
        added = np.bincount(band, minlength=self.bands)
        need = int((self.filled + added).max())
        if need * 2 > (1 << self.bits):
            self._grow(keys, need)
        hashes = keys[rows, band]
        self._place((rows[fresh] + 1).astype(np.uint32), band[fresh], hashes[fresh])
        self.filled += np.bincount(band[fresh], minlength=self.bands)
        if fresh.all():
            return
        rows, band, hashes = rows[~fresh], band[~fresh], hashes[~fresh]
        # the rest by bucket: (band, hash) groups, each with the slots it holds already
        order = np.lexsort((hashes, band))
        rows, band, hashes = rows[order], band[order], hashes[order]
        start = np.ones(len(rows), bool)
        start[1:] = (hashes[1:] != hashes[:-1]) | (band[1:] != band[:-1])
        firsts = np.flatnonzero(start)
        ends = np.append(firsts[1:], len(rows)).tolist()
        q, at, v = self._find(hashes[firsts], band[firsts], keys.ravel())
        held: dict[int, list[tuple[int, int]]] = {}  # group -> its (slot, value)s
        for g, slot, value in zip(q.tolist(), at.tolist(), v.tolist(), strict=True):
            held.setdefault(g, []).append((slot, value))
        small: list[I64] = []  # entries that join a short probe run: placed all at once
        for g, (lo, hi) in enumerate(zip(firsts.tolist(), ends, strict=True)):
            mine = held.get(g, [])
            pointer = [value for _, value in mine if value & int(_BIG)]
            if pointer:
                self._grow_big(pointer[0] & ~int(_BIG), rows[lo:hi])
            elif len(mine) + hi - lo <= _SMALL:
                small.append(np.arange(lo, hi))
            else:
                self._make_big(rows[lo:hi], int(band[lo]), hashes[lo : lo + 1], mine)
        if small:
            at_once = np.concatenate(small)
            self._place((rows[at_once] + 1).astype(np.uint32), band[at_once], hashes[at_once])
            self.filled += np.bincount(band[at_once], minlength=self.bands)

    def _make_big(self, rows: I64, band: int, key: U64, held: list[tuple[int, int]]) -> None:
        """A big bucket for one band hash: the rows of its probe run (``held``: their slots)
        and ``rows`` move into it, and its first slot points at it."""
        big = len(self.big_len)
        self.big_keys.extend(key[:, None])
        self.big_rows.append(np.zeros(0, np.int64))
        self.big_len.append(0)
        old = np.array([value - 1 for _, value in held], np.int64)
        self._grow_big(big, np.concatenate([old, rows]))
        if held:
            slots = [slot for slot, _ in held]
            self.slots[slots[0]] = _BIG | np.uint32(big)
            self.slots[slots[1:]] = _TOMB
        else:
            self._place(np.array([_BIG | np.uint32(big)], np.uint32), np.array([band]), key)
            self.filled[band] += 1

    def _grow_big(self, big: int, rows: I64) -> None:
        n, have = self.big_len[big], self.big_rows[big]
        if n + len(rows) > len(have):
            grown = np.zeros(max(8, 2 * (n + len(rows))), np.int64)
            grown[:n] = have[:n]
            self.big_rows[big] = have = grown
        have[n : n + len(rows)] = rows
        self.big_len[big] = n + len(rows)

    def _place(self, values: npt.NDArray[np.uint32], band: I64, hashes: U64) -> None:
        """Put each value in the first free slot of its hash's probe run (values distinct)."""
        pos = self._start(hashes, band)
        while len(pos):
            free = self.slots[pos] == 0
            # several values may reach one free slot in a round: one of them takes it (which
            # one does not matter: a lookup collects a whole run), the others see it taken
            self.slots[pos[free]] = values[free]
            placed = free & (self.slots[pos] == values)
            keep = ~placed
            pos, values = self._next(pos[keep]), values[keep]

    def _grow(self, keys: U64, need: int) -> None:
        old, old_bits = self.slots, self.bits
        while need * 2 > (1 << self.bits):
            self.bits += 1
        self.slots = np.zeros(self.bands << self.bits, np.uint32)
        big_keys = self.big_keys.view()[:, 0]
        for b in range(self.bands):  # band by band: the temporaries stay a band's size
            values = old[b << old_bits : (b + 1) << old_bits]
            values = values[(values != 0) & (values != _TOMB)]
            big = (values & _BIG) != 0
            hashes = np.empty(len(values), np.uint64)
            hashes[~big] = keys[values[~big].astype(np.int64) - 1, b]
            hashes[big] = big_keys[(values[big] & ~_BIG).astype(np.int64)]
            self._place(values, np.full(len(values), b, np.int64), hashes)
            self.filled[b] = len(values)


class _ExactTable:
    """Open-addressing map text hash -> group (stored as group + 1; 0 = empty slot)."""

    def __init__(self) -> None:
        self.bits = 12
        self.keys = np.zeros(1 << self.bits, np.uint64)
        self.groups = np.zeros(1 << self.bits, np.uint8)
        self.filled = 0

    def _home(self, keys: U64) -> I64:
        return ((keys * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - self.bits)).astype(
            np.int64
        )

    def lookup(self, keys: U64) -> npt.NDArray[np.int16]:
        """The group of each key, -1 where absent."""
        out = np.full(len(keys), -1, np.int16)
        mask = (1 << self.bits) - 1
        idx = np.arange(len(keys), dtype=np.int64)
        pos = self._home(keys)
        while idx.size:
            g = self.groups[pos]
            live = g > 0
            hit = live & (self.keys[pos] == keys[idx])
            out[idx[hit]] = g[hit].astype(np.int16) - 1
            more = live & ~hit
            idx, pos = idx[more], (pos[more] + 1) & mask
        return out

    def raise_to(self, keys: U64, groups: npt.NDArray[np.uint8]) -> None:
        """Set each key's group to the larger of ``groups`` and its present one (insert when
        absent). ``keys`` must be distinct."""
        if (self.filled + len(keys)) * 2 > (1 << self.bits):
            self._grow(self.filled + len(keys))
        added = self._place(keys, groups + np.uint8(1))
        self.filled += added

    def _place(self, keys: U64, stored: npt.NDArray[np.uint8]) -> int:
        mask = (1 << self.bits) - 1
        idx = np.arange(len(keys), dtype=np.int64)
        pos = self._home(keys)
        added = 0
        while idx.size:
            g = self.groups[pos]
            same = (g > 0) & (self.keys[pos] == keys[idx])
            self.groups[pos[same]] = np.maximum(g[same], stored[idx[same]])
            free = g == 0
            # keys that reach one free slot in a round: one takes it, the others see it taken
            self.keys[pos[free]] = keys[idx[free]]
            won = free & (self.keys[pos] == keys[idx])
            self.groups[pos[won]] = stored[idx[won]]
            added += int(won.sum())
            keep = ~(same | won)
            idx, pos = idx[keep], (pos[keep] + 1) & mask
        return added

    def _grow(self, need: int) -> None:
        live = self.groups > 0
        keys, stored = self.keys[live], self.groups[live]
        while need * 2 > (1 << self.bits):
            self.bits += 1
        self.keys = np.zeros(1 << self.bits, np.uint64)
        self.groups = np.zeros(1 << self.bits, np.uint8)
        self._place(keys, stored)

    def __len__(self) -> int:
        return self.filled


class _Runs:
    """A batch's rows grouped by equal band hash, band by band (one stable sort for all bands):
    ``order[b]`` lists the rows by band-b hash, ``first[b, p]`` marks where a run of equal
    hashes starts in that order."""

    def __init__(self, keys: U64) -> None:
        by_band = keys.T
        self.order = np.argsort(by_band, axis=1, kind="stable")
        ordered = np.take_along_axis(by_band, self.order, axis=1)
        self.m, self.bands = keys.shape[0], keys.shape[1]
        self.first: npt.NDArray[np.bool_] = np.ones((self.bands, self.m), bool)
        self.first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]

    def alone(self) -> npt.NDArray[np.bool_]:
        """(row, band) -> no other batch row has the row's band-b hash."""
        last = np.ones_like(self.first)
        last[:, :-1] = self.first[:, 1:]
        out = np.zeros((self.bands, self.m), bool)
        np.put_along_axis(out, self.order, self.first & last, axis=1)
        return out.T

    def shared(self, sizes: I64) -> dict[int, list[tuple[int, int]]]:
        """row -> [(run id, bucket size in the index)] for each band where the row's hash is
        also another batch row's."""
        bands, m = self.bands, self.m
        last = np.ones_like(self.first)
        last[:, :-1] = self.first[:, 1:]
        band, at = np.nonzero(~(self.first & last))
        run = np.cumsum(self.first.ravel()).reshape(bands, m)[band, at]
        rows = self.order[band, at]
        out: dict[int, list[tuple[int, int]]] = {}
        columns = (rows.tolist(), run.tolist(), sizes[rows, band].tolist())
        for r, rid, size in zip(*columns, strict=True):
            out.setdefault(r, []).append((rid, size))
        return out

    def room(self, sizes: I64, kept: npt.NDArray[np.bool_], cap: int) -> npt.NDArray[np.bool_]:
        """(row, band) -> the kept row joins its band bucket: a bucket takes rows (the index's
        first, then the batch's in order) until it holds ``cap``."""
        bands, m = self.bands, self.m
        k = kept[self.order].astype(np.int64)
        upto = np.cumsum(k, axis=1)
        start = np.maximum.accumulate(np.where(self.first, np.arange(m), 0), axis=1)
        before = upto - k - (np.take_along_axis(upto - k, start, axis=1))
        size = np.take_along_axis(sizes.T, self.order, axis=1)
        ok = np.zeros((bands, m), bool)
        np.put_along_axis(ok, self.order, (k > 0) & (size + before < cap), axis=1)
        return ok.T


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
        self._exact = _ExactTable()
        self._pending_refs: list[tuple[str, int]] = []
        self._workdir = workdir
        self._near = config.near
        self._perm = config.num_perm
        self._bands = _bands(config.threshold, config.num_perm)
        self._min_equal = _min_equal(config.threshold, config.num_perm)
        self._keys = _Rows(self._bands, np.uint64)  # indexed row -> its band hashes
        self._folded = _Rows(self._perm, np.uint8)  # indexed row -> folded signature
        self._groups = _Rows(1, np.uint8)  # indexed row -> group
        self._tables = _BandTables(self._bands)
        self._file: BinaryIO | None = None  # indexed row -> full signature, row after row
        self.compared = 0  # candidate signatures compared so far (the work the cap bounds)

    # -- public --------------------------------------------------------------------------

    def add_reference(self, text: str, group: int) -> None:
        """Index a text of the existing dataset (EXISTING) or an exclusion list (EXCLUDED)."""
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
        self._flush_refs()
        out: list[str | None] = []
        for start in range(0, len(texts), self.batch):
            out.extend(self._check_batch(texts[start : start + self.batch]))
        return out

    def close(self) -> None:
        """Delete the temporary signature file (also done when the process ends)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __len__(self) -> int:
        self._flush_refs()
        return len(self._exact)

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
        close = np.zeros(len(brow), bool)
        for s in range(0, len(brow), _PAIRS):  # bounded temporaries on templated text
            mine = np.take(folded, brow[s : s + _PAIRS], axis=0)
            theirs = np.take(indexed, irow[s : s + _PAIRS], axis=0)
            close[s : s + _PAIRS] = _equal_counts(mine, theirs) >= self._min_equal
        pairs = np.unique(brow[close] * (self._keys.n + 1) + irow[close])  # few: the matches
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
        runs = _Runs(keys)
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
            runs = _Runs(keys)
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
