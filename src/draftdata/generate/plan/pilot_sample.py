"""The pilot's sample: a stratified, seeded draw of the prompts in scope (``generate --pilot``).

``--pilot F`` (0 < F < 1) takes about F of the prompts in scope (within ``--limit`` and
``--partition``); ``--pilot N`` (an integer >= 2) takes N. The sample is stratified by
(source, domain): each stratum gets its proportional share, with at least one prompt for each
stratum while the sample has room for one each (a rare source still gets measured); the
integers come from the largest-remainder rule. Within a stratum the prompts with the smallest
keyed ``blake2b(id)`` (the key is the seed) are taken, so the draw depends on the ids and the
seed only, not on the file order: a rerun draws the same sample (an interrupted pilot resumes
its own), and a larger pilot with the same seed holds the smaller one.

Two passes over the prompt lines, decoding only ``id``, ``source`` and ``domain``; memory holds
the sample and one counter per stratum, never the prompts. Lines without a string id are in
no sample (the reader rejects them).
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from draftdata.errors import ConfigError
from draftdata.generate.prompts.partition import Partition
from draftdata.records import strip_bom
from draftdata.shared.mix import largest_remainder
from draftdata.store.doneset import DoneSet
from draftdata.store.prompts import iter_prompt_lines

Stratum = tuple[str, str]  # (source, domain)

_HOW = (
    "give a fraction of the prompts between 0 and 1 (e.g. --pilot 0.01) or a number of "
    "prompts of at least 2 (e.g. --pilot 1500)"
)


class PilotSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How big a pilot: a ``fraction`` of the prompts in scope, or a ``count``."""

    fraction: float | None = None
    count: int | None = None

    def size(self, total: int) -> int:
        """The sample size for ``total`` prompts in scope (at least 1 when there are any)."""
        if total <= 0:
            return 0
        if self.count is not None:
            return min(total, self.count)
        return min(total, max(1, round((self.fraction or 0.0) * total)))

    def text(self) -> str:
        """The size as given: ``0.01`` or ``1500``."""
        return str(self.count) if self.count is not None else f"{self.fraction:g}"


def parse_pilot(value: str) -> PilotSpec:
    """``--pilot F`` (a fraction, 0 < F < 1) or ``--pilot N`` (an integer >= 2); ConfigError
    (one line) for anything else."""
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        raise ConfigError(f"--pilot {value!r}: not a number; {_HOW}") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"--pilot {value!r}: must be above 0; {_HOW}")
    if number < 1:
        return PilotSpec(fraction=number)
    if number == 1:
        raise ConfigError(
            f"--pilot {value!r}: 1 is neither a fraction below 1 nor a count of at least 2; " + _HOW
        )
    if not number.is_integer():
        raise ConfigError(f"--pilot {value!r}: a count is a whole number; {_HOW}")
    return PilotSpec(count=int(number))


class _Keys(msgspec.Struct):
    id: Any = ""
    source: Any = ""
    domain: Any = ""


_keys_decoder = msgspec.json.Decoder(_Keys)


def line_keys(line: bytes) -> tuple[str, str, str] | None:
    """(id, source, domain) of one prompts line; None when it has no string id. A source or
    domain that is not a string counts as ''."""
    try:
        k = _keys_decoder.decode(strip_bom(line))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if not isinstance(k.id, str) or not k.id:
        return None
    source = k.source if isinstance(k.source, str) else ""
    domain = k.domain if isinstance(k.domain, str) else ""
    return k.id, source, domain


def scope_keys(
    files: list[Any], *, limit: int | None, partition: Partition | None
) -> Iterator[tuple[str, str, str]]:
    """(id, source, domain) of every prompt line in scope (the first ``limit`` non-blank
    lines, within the partition), in file order; lines without an id are left out."""
    seen = 0
    part = partition if partition is not None and partition.count > 1 else None
    for f in files:
        for _, line in iter_prompt_lines(f):
            seen += 1
            if limit is not None and seen > limit:
                return
            keys = line_keys(line)
            if keys is None or (part is not None and not part.contains(keys[0])):
                continue
            yield keys


def draw_rank(seed: int, pid: str) -> int:
    """The seeded rank of a prompt id within its stratum: the smallest ranks are drawn."""
    key = str(seed).encode()[:64]
    return int.from_bytes(hashlib.blake2b(pid.encode(), digest_size=8, key=key).digest(), "big")


def allocate(counts: dict[Stratum, int], size: int) -> dict[Stratum, int]:
    """Split ``size`` over the strata in proportion to ``counts``: at least one each while
    ``size`` covers every non-empty stratum, never above a stratum's count."""
    counts = dict(sorted(counts.items()))  # the same sums whatever order the strata came in
    size = min(size, sum(counts.values()))
    if size <= 0:
        return dict.fromkeys(counts, 0)
    floor = 1.0 if size >= sum(1 for n in counts.values() if n > 0) else 0.0

    def shares(lam: float) -> dict[Stratum, float]:
        return {s: min(float(n), max(floor if n else 0.0, lam * n)) for s, n in counts.items()}

    lo, hi = 0.0, 1.0
    for _ in range(100):  # the multiplier at which the floored shares add up to ``size``
        mid = (lo + hi) / 2
        if sum(shares(mid).values()) < size:
            lo = mid
        else:
            hi = mid
    names = {s: f"{s[0]}\x00{s[1]}" for s in counts}  # largest_remainder's keys are strings
    # rounded, so that equal remainders are equal (ties go to the smaller stratum name)
    real = {names[s]: round(v, 9) for s, v in shares(hi).items()}
    got = largest_remainder(real, size, {names[s]: n for s, n in counts.items()})
    return {s: got[names[s]] for s in counts}


@dataclass(frozen=True)
class PilotSample:
    """A drawn sample: its ids, and per stratum the prompts in scope and the ids drawn."""

    spec: PilotSpec
    seed: int
    ids: frozenset[str]
    strata: dict[Stratum, int]  # prompts in scope per (source, domain)
    drawn: dict[Stratum, list[str]]  # the sample's ids per stratum

    @property
    def in_scope(self) -> int:
        """Prompts in scope (distinct lines with an id)."""
        return sum(self.strata.values())


def draw(
    files: list[Any],
    spec: PilotSpec,
    *,
    seed: int = 0,
    limit: int | None = None,
    partition: Partition | None = None,
) -> PilotSample:
    """The pilot's stratified sample of the prompts in scope (module docstring)."""
    counts: dict[Stratum, int] = {}
    seen = DoneSet()  # a repeated id is one prompt (the reader rejects the repeat): 8 B/id
    for pid, source, domain in scope_keys(files, limit=limit, partition=partition):
        if seen.add(pid):
            counts[(source, domain)] = counts.get((source, domain), 0) + 1
    del seen
    quota = allocate(counts, spec.size(sum(counts.values())))
    # per stratum, a max-heap (ranks negated) of the ``quota`` smallest ranks, and its ids
    heaps: dict[Stratum, list[tuple[int, str]]] = {s: [] for s in counts}
    members: dict[Stratum, set[str]] = {s: set() for s in counts}
    for pid, source, domain in scope_keys(files, limit=limit, partition=partition):
        s = (source, domain)
        k = quota[s]
        if k == 0 or pid in members[s]:
            continue
        item = (-draw_rank(seed, pid), pid)
        heap = heaps[s]
        if len(heap) < k:
            heapq.heappush(heap, item)
            members[s].add(pid)
        elif item > heap[0]:
            members[s].discard(heapq.heapreplace(heap, item)[1])
            members[s].add(pid)
    drawn: dict[Stratum, list[str]] = {}
    taken: set[str] = set()
    for s in sorted(heaps):
        ids = [pid for _, pid in sorted(heaps[s], reverse=True) if pid not in taken]
        taken.update(ids)
        drawn[s] = ids
    return PilotSample(
        spec=spec, seed=seed, ids=frozenset(taken), strata=dict(sorted(counts.items())),
        drawn=drawn,
    )  # fmt: skip
