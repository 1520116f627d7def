"""The exactly-once check shared by the kill -9 tests."""

from __future__ import annotations

from collections import Counter

from draftdata.shared.formats import COMPLETION_FORMAT, FAILURE_FORMAT
from draftdata.store import open_store
from draftdata.store.read import read_shard, shard_keys


def check_exactly_once(url: str, expected_ids: set[str]) -> tuple[int, int]:
    """Every shard reads whole; every id is once in completions or once in failures.

    Returns (completions, failures) counts.
    """
    store = open_store(url)
    comp: Counter[str] = Counter()
    for key in shard_keys(store, "completions/"):
        table = read_shard(store, key, COMPLETION_FORMAT)  # whole file, every column
        assert table.num_rows > 0
        comp.update(table.column("id").to_pylist())
    fail: Counter[str] = Counter()
    for key in shard_keys(store, "failures/"):
        fail.update(read_shard(store, key, FAILURE_FORMAT).column("id").to_pylist())
    dup_c = {k: v for k, v in comp.items() if v > 1}
    dup_f = {k: v for k, v in fail.items() if v > 1}
    assert not dup_c, f"duplicated completions: {sorted(dup_c)[:5]}"
    assert not dup_f, f"duplicated failures: {sorted(dup_f)[:5]}"
    assert not set(comp) & set(fail), "an id is both completed and failed"
    assert set(comp) | set(fail) == expected_ids
    return len(comp), len(fail)
