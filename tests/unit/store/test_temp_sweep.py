"""The local store's temp files: a killed writer's are swept, a live writer's never are.

Writers are real processes writing through ``LocalStore`` and stopped halfway through a file;
some are killed with SIGKILL, the others stay alive, and a sweep must remove exactly the dead
ones' temp files (the kernel drops a dead process's flock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import draftdata.store.local as local
from draftdata.store.local import TEMP_MARK, LocalStore

WRITER = """
import sys, time
from pathlib import Path
from draftdata.store.local import LocalStore
store = LocalStore(Path(sys.argv[1]))
def write(fh):
    fh.write(b"x" * int(sys.argv[3]))
    fh.flush()
    print("writing", flush=True)
    time.sleep(600)
store._create(sys.argv[2], 0, write, lambda p: False)
"""


def _temps(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.startswith(".") and TEMP_MARK in p.name)


def _start(root: Path, key: str, size: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), key, str(size)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    return child


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writers=st.lists(
        st.tuples(st.booleans(), st.integers(0, 200_000), st.sampled_from(["", "hidden_states/"])),
        min_size=1,
        max_size=4,
    )
)
def test_a_sweep_removes_what_killed_writers_left_and_nothing_a_live_one_holds(
    tmp_path_factory: pytest.TempPathFactory, writers: list[tuple[bool, int, str]]
) -> None:
    root = tmp_path_factory.mktemp("sweep")
    store = LocalStore(root)
    children = [
        _start(root, f"{folder}f{i}.bin", size) for i, (_, size, folder) in enumerate(writers)
    ]
    try:
        assert len(_temps(root)) == len(writers)
        for child, (killed, _, _) in zip(children, writers, strict=True):
            if killed:
                child.send_signal(signal.SIGKILL)
                child.wait()
        dead = [(size, folder) for killed, size, folder in writers if killed]
        assert store.sweep_temps() == (len(dead), sum(size for size, _ in dead))
        assert len(_temps(root)) == len(writers) - len(dead)  # the live writers' files stay
        assert store.sweep_temps() == (0, 0)
        assert store.list() == []  # no temp file was ever a key
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert store.sweep_temps()[0] == len(writers) - len(dead)
    assert _temps(root) == []


def test_a_sweep_that_locks_a_new_temp_file_first_costs_the_writer_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep may lock a temp file in the instant between its creation and its writer's lock:
    it unlinks it, and the writer starts another one instead of writing into the void."""
    store = LocalStore(tmp_path)
    real_flock = local.fcntl.flock
    swept: list[int | None] = []
    sweeping: list[bool] = []

    def sweep_first(fd: int, op: int) -> None:
        if not sweeping:  # the writer's first lock: a sweep gets there before it
            sweeping.append(True)
            name = os.readlink(f"/proc/self/fd/{fd}")
            swept.append(local._remove_unheld(Path(name)))
        real_flock(fd, op)

    monkeypatch.setattr(local.fcntl, "flock", sweep_first)
    store.put_new("hidden_states/a.bin", b"abc")
    assert swept == [0]  # the sweep took the writer's first (empty) temp file
    assert store.read("hidden_states/a.bin") == b"abc"
    assert _temps(tmp_path) == []


def test_a_sweep_of_a_store_without_temp_files_or_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "absent")
    assert store.sweep_temps("hidden_states/") == (0, 0)
    store.put_new("hidden_states/a.bin", b"abc")
    assert store.sweep_temps("hidden_states/") == (0, 0)
    assert store.read("hidden_states/a.bin") == b"abc"


@settings(max_examples=10, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=4096),
    key=st.sampled_from(["a.bin", "hidden_states/a.bin", "hidden_states/x/y.ckpt"]),
    as_file=st.booleans(),
)
def test_a_sweep_while_a_writer_links_its_finished_file_leaves_it_alone(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, key: str, as_file: bool
) -> None:
    """A sweep (another partition's command starting) that runs after a writer has written and
    fsynced its temp file, before the link that commits it: the writer still holds the file's
    lock, so the sweep leaves it and the write lands."""
    root = tmp_path_factory.mktemp("linking")
    store = LocalStore(root)
    real_link = os.link
    swept: list[tuple[int, int]] = []

    def sweep_then_link(src: str | Path, dst: str | Path) -> None:
        swept.append(store.sweep_temps())
        real_link(src, dst)

    src = root.parent / f"{root.name}.src"
    src.write_bytes(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local.os, "link", sweep_then_link)
        if as_file:
            store.put_new_file(key, src)
        else:
            store.put_new(key, data)
    assert swept == [(0, 0)]  # the writer's file was held: nothing swept
    assert store.read(key) == data
    assert _temps(root) == []


_NAME = st.text(alphabet="abc_-0", min_size=1, max_size=6)
_ENTRY = st.tuples(
    st.lists(st.sampled_from(["d", "e", ".hid"]), max_size=2),  # the folders it lies in
    st.sampled_from(["file", "dot", "temp", "held temp"]),
    _NAME,
    st.integers(0, 40),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(_ENTRY, max_size=25), prefix=st.sampled_from(["", "d/", "d/e/", "x/"]))
def test_one_walk_sweeps_and_lists_as_the_two_did(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[list[str], str, str, int]],
    prefix: str,
) -> None:
    """``sweep_and_list_sizes`` (the one walk of a hidden-state set's start) removes exactly
    the temp files ``sweep_temps`` removes and lists exactly what ``list_sizes`` lists, on any
    tree: nested and hidden folders, hidden files, temp files a writer holds or left."""
    import fcntl

    trees = [tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")]
    held: list[int] = []
    try:
        for root in trees:
            for i, (folders, kind, name, size) in enumerate(entries):
                where = root.joinpath(*folders)
                where.mkdir(parents=True, exist_ok=True)
                if kind == "file":
                    path = where / f"{name}.bin"
                elif kind == "dot":
                    path = where / f".{name}"
                else:
                    path = where / f".{name}{TEMP_MARK}{i}"
                path.write_bytes(b"x" * size)
                if kind == "held temp":  # a live writer's: its lock stays taken
                    fd = os.open(path, os.O_RDONLY)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    held.append(fd)
        two = LocalStore(trees[1])
        swept = two.sweep_temps(prefix)
        sizes = two.list_sizes(prefix)
        assert LocalStore(trees[0]).sweep_and_list_sizes(prefix) == (sizes, swept)
        left = [sorted(str(p.relative_to(r)) for p in r.rglob("*")) for r in trees]
        assert left[0] == left[1]
    finally:
        for fd in held:
            os.close(fd)
