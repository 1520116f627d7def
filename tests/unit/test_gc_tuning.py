"""The collector settings of a long batch loop (generate's engine, prepare): raised and frozen
during a run, restored after it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from draftdata.support.gc_tuning import YOUNG_THRESHOLD, fewer_collections


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_thresholds_raised_and_restored(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0  # what was alive at the start is not walked
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_restored_when_the_run_fails(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(1000, 5, 5)
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (1000, 5, 5)
    assert gc.get_freeze_count() == 0


def test_a_switched_off_collector_stays_off(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(0)
    with fewer_collections():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold()[0] == 0


def test_a_higher_threshold_is_kept(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 2, 10, 10)
    with fewer_collections():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD * 2


def test_cyclic_garbage_is_still_collected(thresholds: tuple[int, int, int]) -> None:
    import weakref

    class Node:
        pass

    with fewer_collections():
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        ref = weakref.ref(a)
        del a, b
        gc.collect(0)
        assert ref() is None
