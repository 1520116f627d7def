"""The commit layer: a file's name is taken once and never rewritten, the done-set is the
listing, and staging never holds more than its bound."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import DiskError
from draftdata.hidden.commit import Commits, Uploader
from draftdata.hidden.writers import writer_for
from draftdata.store.local import LocalStore


def test_a_taken_name_is_never_rewritten(tmp_path: Path) -> None:
    commits = Commits(LocalStore(tmp_path), writer_for("speculators"))
    assert commits.commit(5, b"first")
    path = tmp_path / "hidden_states" / "hs_5.safetensors"
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # a rewrite would give it today's time
    before = os.stat(path)
    assert not commits.commit(5, b"other bytes")  # taken: refused, not replaced
    commits.commit(5, b"first")  # the same bytes: done (the store's retry rule), not written
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )
    assert path.read_bytes() == b"first"
    assert commits.done_rows() == {5: 5}


def test_the_done_set_is_the_listing_of_this_formats_names(tmp_path: Path) -> None:
    folder = tmp_path / "hidden_states"
    folder.mkdir()
    for name in (
        "data_1.ckpt",
        "data_2.ckpt.gz",
        ".data_3.ckpt.tmp-0a1b",
        "data_x.ckpt",
        "hs_4.safetensors",
    ):
        (folder / name).write_bytes(b"1234")
    assert Commits(LocalStore(tmp_path), writer_for("specforge")).done_rows() == {1: 4}
    gz = writer_for("specforge", compress="gzip")
    assert Commits(LocalStore(tmp_path), gz).done_rows() == {2: 4}
    assert Commits(LocalStore(tmp_path), writer_for("speculators")).done_rows() == {4: 4}


class _SlowStore(LocalStore):
    """A local store whose writes take a while (an S3 upload's latency)."""

    def _put_new(self, key: str, data: bytes) -> None:
        time.sleep(0.005)
        super()._put_new(key, data)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40), st.integers(1, 4))
def test_staging_never_holds_more_than_its_bound(sizes: list[int], threads: int) -> None:
    import tempfile

    limit = 4000
    with tempfile.TemporaryDirectory() as tmp:
        commits = Commits(_SlowStore(Path(tmp)), writer_for("speculators"))
        done: list[int] = []
        up = Uploader(commits, limit, threads=threads, on_done=lambda r, s, c: done.append(r))
        peak = 0
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, up.staged)

        t = threading.Thread(target=watch)
        t.start()
        for row, size in enumerate(sizes):
            up.submit(row, b"x" * size)
            peak = max(peak, up.staged)
        up.close()
        stop.set()
        t.join()
        assert sorted(done) == list(range(len(sizes)))
        assert peak <= limit
        assert up.staged == 0


def test_a_full_disk_is_one_line_naming_the_file(tmp_path: Path) -> None:
    import errno

    class Full(LocalStore):
        def _put_new(self, key: str, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    commits = Commits(Full(tmp_path), writer_for("specforge"))
    up = Uploader(commits, 1 << 20)
    up.submit(0, b"abc")
    with pytest.raises(
        DiskError, match=r"data_0\.ckpt: cannot write: no space left on the device; .*--out"
    ):
        up.close()
