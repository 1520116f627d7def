"""The flat numpy tables ``dedup.Deduper`` keeps its index in, and the batch grouping it
resolves a batch with. Nothing here knows about MinHash: rows are numbers, keys 64-bit hashes.

- ``Rows``: one row per indexed text (its band hashes, its folded signature, its group).
- ``BandTables``: per LSH band, band hash -> indexed rows (open addressing, linear probing;
  up to ``SMALL`` rows of one hash in the probe run, more in a "big bucket" array).
- ``ExactTable``: text hash -> group, for exact duplicates.
- ``BatchRuns``: a batch's rows grouped by equal band hash, band by band.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


class Rows:
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
SMALL = 4  # rows of one band hash kept in the probe run; one more moves them to a big bucket


class BandTables:
    """Per band an open-addressing multimap band hash -> indexed rows, with linear probing.

    All bands live in one flat array (band b's table is slots[b * size : (b + 1) * size]) so a
    batch's lookups for every band run as one numpy pass. A slot holds row + 1 (0 = empty, so
    np.zeros tables cost no memory until used), with the row's band hash read back from the
    rows' hashes; up to ``SMALL`` rows of one hash sit in its probe run. A hash with more
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
        self.big_keys = Rows(1, np.uint64)  # big bucket -> its band hash
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
            elif len(mine) + hi - lo <= SMALL:
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


class ExactTable:
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


class BatchRuns:
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
