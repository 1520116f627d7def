"""Partitioning by id hash: stable, complete, disjoint, and parsed with clear errors."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.generate.prompts.partition import (
    Partition,
    count_by_partition,
    iter_prompt_ids,
    parse_partition,
    partition_of,
)


def test_partition_is_blake2b_64_big_endian_mod_count() -> None:
    # The documented definition, so other tools (and other languages) can reproduce it.
    digest = hashlib.blake2b(b"prompt-42", digest_size=8).digest()
    assert partition_of("prompt-42", 7) == int.from_bytes(digest, "big") % 7
    assert partition_of("prompt-42", 1) == 0


@given(st.lists(st.text(min_size=1), min_size=1, max_size=50), st.integers(1, 9))
def test_partitions_cover_every_id_exactly_once(ids: list[str], count: int) -> None:
    for pid in ids:
        owners = [i for i in range(count) if Partition(i, count).contains(pid)]
        assert owners == [partition_of(pid, count)]


def test_spread_is_roughly_even() -> None:
    counts = [0] * 4
    for i in range(4000):
        counts[partition_of(f"id-{i}", 4)] += 1
    assert min(counts) > 800, counts


@pytest.mark.parametrize(
    ("text", "expected"), [("0/4", Partition(0, 4)), (" 3/4 ", Partition(3, 4))]
)
def test_parse_partition(text: str, expected: Partition) -> None:
    assert parse_partition(text) == expected
    assert str(expected) == text.strip()


@pytest.mark.parametrize("text", ["4/4", "-1/4", "1", "a/b", "0/0", "1/"])
def test_parse_partition_rejects_with_the_option_name(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--partition: .*0 <= I < P"):
        parse_partition(text)


def test_count_by_partition_skips_bad_lines_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [json.dumps({"id": f"p{i}", "messages": []}) for i in range(50)]
    rows += ["not json", json.dumps({"messages": []}), "", rows[0]]
    path.write_text("\n".join(rows) + "\n")
    assert len(list(iter_prompt_ids(path))) == 51  # p0 twice; bad lines skipped
    counts = count_by_partition(path, 3)
    assert sum(counts) == 50
    assert counts == [sum(partition_of(f"p{i}", 3) == k for i in range(50)) for k in range(3)]


@given(
    st.lists(st.text(min_size=1, max_size=12), min_size=0, max_size=40),
    st.integers(1, 9),
)
def test_count_by_partition_counts_by_the_same_rule_as_partition_of(
    ids: list[str], count: int
) -> None:
    # the driver's per-partition totals come from the one hash the prompt reader filters by
    expected = [0] * count
    for pid in set(ids):
        expected[partition_of(pid, count)] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        path.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids), encoding="utf-8")
        assert count_by_partition(path, count) == expected
