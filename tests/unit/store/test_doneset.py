"""The compact done-set."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.store import doneset
from draftdata.store.doneset import DoneSet, hash_pairs


@given(
    done=st.sets(st.text(min_size=1, max_size=12), max_size=50),
    others=st.sets(st.text(min_size=1, max_size=12), max_size=50),
)
def test_membership_matches_a_python_set(done: set[str], others: set[str]) -> None:
    ds = DoneSet(hash_pairs(sorted(done)))
    for x in done:
        assert ds.contains(x)
    for x in others - done:
        assert not ds.contains(x)
        assert ds.add(x)
        assert not ds.add(x)
    assert len(ds) == len(done | others)


def test_samples_are_distinct_and_folding_keeps_members(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = DoneSet()
    assert ds.add("a", 0) and ds.add("a", 1) and not ds.add("a", 1)
    monkeypatch.setattr(doneset, "_FOLD_AT", 4)  # force folds in a small test
    for i in range(20):
        ds.add(f"x{i}")
    assert all(ds.contains(f"x{i}") for i in range(20)) and ds.contains("a", 1)
    assert len(ds) == 22 and len(ds.hashes()) == 22


@given(
    done=st.sets(st.text(min_size=1, max_size=12), max_size=50),
    added=st.sets(st.text(min_size=1, max_size=12), max_size=20),
    queries=st.lists(st.text(min_size=1, max_size=12), max_size=50),
)
def test_contains_many_matches_contains(
    done: set[str], added: set[str], queries: list[str]
) -> None:
    ds = DoneSet(hash_pairs(sorted(done)))
    for x in added:
        ds.add(x)
    got = ds.contains_many(hash_pairs(queries + sorted(done)))
    assert got.tolist() == [ds.contains(q) for q in queries + sorted(done)]
