"""A local shard write that the file system fails for a moment after the shard landed (a
network mount that times out: ETIMEDOUT, EAGAIN) is retried under the same name, and the retry
finds its own bytes there: the shard is written once. Generated over where the file system
fails and how often: the directory's fsync after the link, and the stat and read that compare
the shard already there with the bytes being written."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draftdata.store.local as local
import draftdata.store.shards as shards
from draftdata.errors import TransientStoreError
from draftdata.store.local import LocalStore
from draftdata.store.shards import ShardWriter
from draftdata.support.metrics import StageStats

POINTS = ("fsync_dir", "stat", "read")


@settings(max_examples=60, deadline=None)
@given(
    fails=st.fixed_dictionaries({p: st.integers(0, 2) for p in POINTS}),
    code=st.sampled_from([errno.ETIMEDOUT, errno.EAGAIN]),
    data=st.binary(min_size=1, max_size=512),
)
def test_a_shard_that_landed_before_a_passing_fault_is_written_once(
    tmp_path_factory: pytest.TempPathFactory, fails: dict[str, int], code: int, data: bytes
) -> None:
    root = tmp_path_factory.mktemp("retry")
    store = LocalStore(root)
    left = dict(fails)
    shard_dir = root / "completions"

    def fault(point: str, path: Path) -> None:
        if (path.parent == shard_dir or path == shard_dir) and left[point] > 0:
            left[point] -= 1
            raise OSError(code, os.strerror(code), str(path))

    real_fsync_dir = local._fsync_dir
    real_stat = Path.stat
    real_read = Path.read_bytes

    def fsync_dir(path: Path) -> None:
        real_fsync_dir(path)
        fault("fsync_dir", path)

    def stat(self: Path, **kw: object) -> os.stat_result:
        if not self.name.startswith("."):
            fault("stat", self)
        return real_stat(self, **kw)  # type: ignore[arg-type]

    def read_bytes(self: Path) -> bytes:
        fault("read", self)
        return real_read(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local, "_fsync_dir", fsync_dir)
        mp.setattr(Path, "stat", stat)
        mp.setattr(Path, "read_bytes", read_bytes)
        mp.setattr(shards.time, "sleep", lambda _s: None)
        writer = ShardWriter(store, "w", [], StageStats("t"))
        try:
            key = writer.write_shard("completions", data)
        except TransientStoreError:
            key = None  # every attempt failed: the committer retries the flush later
    written = sorted(p.name for p in shard_dir.iterdir() if not p.name.startswith("."))
    assert len(written) == 1, (fails, written)  # landed once, never under a second name
    assert (shard_dir / written[0]).read_bytes() == data
    if key is not None:
        assert key == f"completions/{written[0]}"
