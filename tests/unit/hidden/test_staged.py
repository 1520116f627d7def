"""Reading the files a hidden-states fleet writes (hidden/staged.py): the connector's lock, the
checks of what a file holds, and the removal of staged files."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from draftdata.errors import ImpossibleAnswerError, MalformedAnswerError
from draftdata.hidden.staged import (
    read_staged,
    remove_staged,
    sweep,
)
from draftdata.sim.hidden import file_bytes, states_for

LAYERS = (0, 2, 4)
HIDDEN = 8


def _lock(path: Path) -> int:
    """Hold the writer's side of the protocol: PATH.lock created, LOCK_EX taken."""
    fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _staged(tmp_path: Path, ids: list[int], stored: list[int] | None = None) -> Path:
    path = tmp_path / "cmpl-1-0-a.safetensors"
    os.close(_lock(path))  # written and released
    path.write_bytes(file_bytes(ids, LAYERS, HIDDEN, stored_ids=ids if stored is None else stored))
    return path


def test_a_file_is_read_only_after_its_writer_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import draftdata.hidden.staged as staged

    ids = [5, 9, 2, 7]
    path = tmp_path / "cmpl-2-0-b.safetensors"
    fd = _lock(path)  # the answer has left; the write is still to come
    waiting = threading.Event()  # the reader found the lock held and waits for it

    class _Time:
        """staged's clock, saying when the reader first sleeps on the held lock."""

        monotonic = staticmethod(time.monotonic)
        time = staticmethod(time.time)

        @staticmethod
        def sleep(seconds: float) -> None:
            waiting.set()
            time.sleep(seconds)

    monkeypatch.setattr(staged, "time", _Time)

    def write_later() -> None:
        waiting.wait(10)  # written once the reader waits (or, if it never does, after 10 s)
        path.write_bytes(file_bytes(ids, LAYERS, HIDDEN, stored_ids=ids))
        os.close(fd)

    t = threading.Thread(target=write_later)
    t.start()
    states = read_staged(str(path), np.asarray(ids, dtype=np.int64), timeout_s=30)
    t.join()
    assert waiting.is_set()  # it slept on the lock instead of finding no file
    assert np.array_equal(states.float().numpy(), states_for(ids, LAYERS, HIDDEN))


def test_a_lock_held_past_the_timeout_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "cmpl-3-0-c.safetensors"
    fd = _lock(path)
    try:
        with pytest.raises(MalformedAnswerError, match="still being written"):
            read_staged(str(path), np.asarray([1, 2], dtype=np.int64), timeout_s=0.2)
    finally:
        os.close(fd)


def test_a_released_lock_with_no_file_is_missing(tmp_path: Path) -> None:
    """What a vLLM engine that died after answering leaves (docs/engines.md)."""
    path = tmp_path / "cmpl-4-0-d.safetensors"
    os.close(_lock(path))
    with pytest.raises(MalformedAnswerError, match="wrote no file"):
        read_staged(str(path), np.asarray([1, 2], dtype=np.int64), timeout_s=1)


def test_no_lock_file_is_missing(tmp_path: Path) -> None:
    with pytest.raises(MalformedAnswerError, match="not visible here"):
        read_staged(str(tmp_path / "nowhere.safetensors"), np.asarray([1]), timeout_s=1)


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=0, max_value=400))
def test_a_torn_file_is_missing_never_read(
    tmp_path_factory: pytest.TempPathFactory, cut: int
) -> None:
    tmp = tmp_path_factory.mktemp("torn")
    ids = list(range(3, 13))
    path = _staged(tmp, ids)
    data = path.read_bytes()
    path.write_bytes(data[: min(cut, len(data) - 1)])
    with pytest.raises(MalformedAnswerError):
        read_staged(str(path), np.asarray(ids, dtype=np.int64), timeout_s=1)


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
    other=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
)
def test_states_of_other_tokens_are_refused(
    tmp_path_factory: pytest.TempPathFactory, ids: list[int], other: list[int]
) -> None:
    """Whatever token ids a file holds, it is taken only when they are exactly those sent."""
    path = _staged(tmp_path_factory.mktemp("ids"), ids, stored=other)
    expect = np.asarray(ids, dtype=np.int64)
    if other == ids:
        assert read_staged(str(path), expect, timeout_s=1).shape == (len(ids), len(LAYERS), HIDDEN)
    else:
        with pytest.raises(ImpossibleAnswerError, match="not the ids sent"):
            read_staged(str(path), expect, timeout_s=1)


def test_states_of_another_length_are_refused(tmp_path: Path) -> None:
    ids = [1, 2, 3, 4]
    path = tmp_path / "cmpl-5-0-e.safetensors"
    os.close(_lock(path))
    # a file for three tokens that claims the four ids: states of another shape
    from draftdata.sim.hidden import _bf16_bytes, safetensors_bytes

    states = states_for(ids[:3], LAYERS, HIDDEN)
    arr = np.asarray(ids, dtype="<i8")
    path.write_bytes(
        safetensors_bytes(
            {
                "hidden_states": ("BF16", states.shape, _bf16_bytes(states)),
                "token_ids": ("I64", (4,), arr.tobytes()),
            }
        )
    )
    with pytest.raises(ImpossibleAnswerError, match="shape"):
        read_staged(str(path), np.asarray(ids, dtype=np.int64), timeout_s=1)


def test_remove_staged_removes_the_file_and_its_lock(tmp_path: Path) -> None:
    path = _staged(tmp_path, [1, 2, 3])
    remove_staged(str(path))
    remove_staged(str(path))  # twice: nothing left, no error
    assert list(tmp_path.iterdir()) == []


def test_sweep_removes_old_unlocked_files_only(tmp_path: Path) -> None:
    old = _staged(tmp_path, [1, 2])
    held = tmp_path / "cmpl-6-0-f.safetensors"
    fd = _lock(held)  # a writer still at work
    young = tmp_path / "cmpl-7-0-g.safetensors"
    os.close(_lock(young))
    young.write_bytes(b"x")
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    past = time.time() - 7200
    for p in (old, Path(str(old) + ".lock"), held, Path(str(held) + ".lock")):
        if p.exists():
            os.utime(p, (past, past))
    try:
        removed = sweep(str(tmp_path), 3600)
    finally:
        os.close(fd)
    assert removed == 1
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [
            "cmpl-6-0-f.safetensors.lock",
            "cmpl-7-0-g.safetensors",
            "cmpl-7-0-g.safetensors.lock",
            "notes.txt",
        ]
    )
