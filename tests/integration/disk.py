"""A real full (or read-only) disk for tests: a small tmpfs, mounted and unmounted around a test
(root only: the caller skips elsewhere), filled until the kernel answers ENOSPC."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


def can_mount() -> str | None:
    """None when this process may mount a tmpfs, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    return None


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (created), unmounted afterwards (RuntimeError if the
    mount is refused)."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs at {path}: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill ``disk`` until the kernel says ENOSPC, then give back ``leave`` bytes (about)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))


def read_only(disk: Path) -> None:
    """Remount the tmpfs at ``disk`` read-only (EROFS on every write)."""
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, capture_output=True)
