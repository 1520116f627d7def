"""Stable partitioning of prompts by id: part of the prompt stream generate reads.

A prompt belongs to partition ``blake2b(id, 8 bytes) mod P`` (big-endian): the same id lands
in the same partition on every machine, Python version and run, so a rerun of partition I/P
resumes exactly the prompts it owned, and the P partitions together cover every prompt once.
The hash depends only on the id, never on the file order or on other prompts.

``generate --partition`` reads one partition, and ``distributed`` (above generate) runs one
generate per partition. This module computes and parses partitions and counts a prompts file
per partition (for the Ray driver's totals), all through the one hash ``id_hash``; it does not
filter prompts inside the engine (the prompt reader does that) and it starts nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from draftdata.errors import ConfigError
from draftdata.records import prompt_id
from draftdata.store.prompts import iter_prompt_lines


class Partition(msgspec.Struct, frozen=True):
    """Partition ``index`` of ``count`` (0 <= index < count)."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def contains(self, prompt_id: str) -> bool:
        """Whether the prompt with ``prompt_id`` belongs to this partition."""
        return self.count == 1 or partition_of(prompt_id, self.count) == self.index


def id_hash(prompt_id: str) -> int:
    """The 64-bit hash partitions are cut by: blake2b-64 of the id's UTF-8 bytes, big-endian."""
    digest = hashlib.blake2b(prompt_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def partition_of(prompt_id: str, count: int) -> int:
    """The partition (0..count-1) of ``prompt_id``: ``id_hash`` mod count."""
    if count < 1:
        raise ConfigError(f"partitions: {count}; must be at least 1")
    return id_hash(prompt_id) % count


def parse_partition(value: str, option: str = "--partition") -> Partition:
    """``"I/P"`` -> Partition(I, P); ConfigError naming ``option`` on anything else."""
    text = value.strip()
    index_s, sep, count_s = text.partition("/")
    try:
        index, count = int(index_s), int(count_s)
    except ValueError:
        index = count = -1
    if not sep or count < 1 or not 0 <= index < count:
        raise ConfigError(
            f"{option}: {value!r}; use I/P with 0 <= I < P, e.g. 0/4 for the first of four"
        )
    return Partition(index, count)


def iter_prompt_ids(path: Path | str) -> Iterator[str]:
    """The ids of a prompts JSONL file, in order, decoding nothing but ``id`` (fast).

    A line that is not JSON or has no id is skipped here: the generate stage rejects it with
    its file and line, this reader only counts.
    """
    for _lineno, raw in iter_prompt_lines(path):
        pid = prompt_id(raw)
        if pid:
            yield pid


def count_by_partition(paths: Path | str | Sequence[Path | str], count: int) -> list[int]:
    """How many prompts of the JSONL file(s) ``paths`` fall in each of ``count`` partitions
    (duplicates counted once, as the engine answers each id once)."""
    if count < 1:
        raise ConfigError(f"--partitions: {count}; must be at least 1")
    files = [paths] if isinstance(paths, str | Path) else list(paths)
    counts = [0] * count
    seen: set[int] = set()  # id hashes (a 64-bit collision would merge two ids: ~1e-9 at 193K)
    for pid in (p for f in files for p in iter_prompt_ids(f)):
        key = id_hash(pid)
        if key in seen:
            continue
        seen.add(key)
        counts[key % count] += 1
    return counts
