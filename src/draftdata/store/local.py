"""The local side of the store: a directory, create-only by hard links.

The bytes go to a temp file beside the target (``.<name>.tmp-<random>``), are fsynced, then
hard-linked to the final name with ``os.link`` (which fails if the name exists: no replace),
and the directory is fsynced. Names starting with ``.`` are never listed, so a temp file left
by a killed process is invisible; it still holds disk (a hidden-states file can be gigabytes),
so a writer holds an exclusive ``flock`` on its temp file while it writes, and
``sweep_temps`` removes the temp files nobody holds: the ones a killed writer left (the kernel
drops a dead process's locks), never a live writer's, on this host or another one sharing the
file system. A ``put_new`` that finds the key holding exactly its own bytes
counts as done (a retried write whose first attempt landed); different bytes raise
AlreadyExistsError. The contract is ``base.Store``'s.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import filecmp
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from draftdata.errors import (
    DISK_ERRNOS,
    AlreadyExistsError,
    DiskError,
    StoreAccessError,
    StoreError,
    TransientStoreError,
)
from draftdata.store.base import Store, check_key

_COPY_CHUNK = 1 << 20
# folders a file system makes at its root, which its users may not list: a store there skips
# them (the store never makes a folder of these names: its keys are its own)
FOREIGN_FOLDERS = frozenset({"lost+found"})
TEMP_MARK = ".tmp-"  # a temp file's name: .<name>.tmp-<random>
# a file system that does not answer now (a network mount's server, a busy lock): an outage
_PASSING_ERRNOS = frozenset({errno.EAGAIN, errno.ETIMEDOUT, errno.EBUSY, errno.ENOLCK})
_DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


def os_error(exc: OSError, path: Path | str, doing: str, hint: str = "") -> StoreError:
    """The store error for ``exc`` met while ``doing`` (``read``, ``write``) ``path``: a
    permission problem (EACCES, EPERM) is StoreAccessError, which says so and that running
    again does not cure it; a file system that does not answer now is TransientStoreError;
    anything else a StoreError with the OS's reason (and ``hint``)."""
    # the OS's words for the errno (pyarrow's own OSErrors wrap them in a sentence)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno in _DENIED_ERRNOS:
        return StoreAccessError(
            f"{path}: permission denied: this user may not {doing} it; fix the permissions of "
            "it and its folders (ls -l, chmod, chown) or run as its owner; running the same "
            "command again does not help"
        )
    if exc.errno in _PASSING_ERRNOS:
        return TransientStoreError(f"{path}: cannot {doing} it now ({reason}); retried")
    return StoreError(f"{path}: cannot {doing} it ({reason}){hint}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(Store):
    """A store in a local directory; created on the first write."""

    def __init__(self, root: Path, protect: Sequence[str] = ()) -> None:
        self.root = root
        super().__init__(str(root), protect)

    def child(self, prefix: str) -> LocalStore:
        """A store rooted at ``prefix`` inside this one."""
        return LocalStore(self.root / check_key(prefix.strip("/")), self.protect)

    def local_path(self, key: str) -> str:
        """The filesystem path of ``key``."""
        return str(self.root / key)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _makedirs(self, path: Path) -> None:
        # Create missing parents one by one and fsync each new one's parent, so a crash right
        # after the write cannot lose the directory entry of a committed object.
        missing: list[Path] = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            _fsync_dir(d.parent)

    def _put_new(self, key: str, data: bytes) -> None:
        self._create(key, len(data), lambda fh: fh.write(data), lambda p: p.read_bytes() == data)

    def _put_new_file(self, key: str, path: Path) -> None:
        size = path.stat().st_size

        def copy(fh: BinaryIO) -> None:
            with path.open("rb") as src:
                shutil.copyfileobj(src, fh, _COPY_CHUNK)

        self._create(key, size, copy, lambda p: filecmp.cmp(p, path, shallow=False))

    def _create(
        self,
        key: str,
        size: int,
        write: Callable[[BinaryIO], object],
        same: Callable[[Path], bool],
    ) -> None:
        """Write a temp file beside ``key`` with ``write``, fsync it, link it to ``key``."""
        path = self._path(key)
        try:
            self._makedirs(path.parent)
            if path.exists():
                self._settle_existing(path, size, same)
                return
            tmp, fd = self._locked_temp(path)
            # the descriptor (and with it the flock that keeps a sweep off the temp file) stays
            # open until the temp name is gone: closed before the link, a sweep could unlink
            # the finished file and the link would fail
            try:
                with os.fdopen(fd, "wb", closefd=False) as fh:
                    write(fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    self._settle_existing(path, size, same)
                    return
                except OSError as exc:
                    if exc.errno in DISK_ERRNOS:
                        raise
                    raise StoreError(
                        f"{path}: cannot create it ({exc.strerror or exc}): the store needs "
                        "hard links (os.link), which this file system refuses; write to a "
                        "local disk or to s3://"
                    ) from exc
            finally:
                try:
                    tmp.unlink(missing_ok=True)
                finally:
                    os.close(fd)
            _fsync_dir(path.parent)
        except OSError as exc:
            full = DiskError.of(exc, str(path), "write to another place")
            if full is not None:
                raise full from exc
            raise os_error(
                exc, path, "write", "; check the directory exists and is writable"
            ) from exc

    @staticmethod
    def _locked_temp(path: Path) -> tuple[Path, int]:
        """A new temp file beside ``path``, opened for writing under this process's exclusive
        flock. A sweep can lock a file in the instant between its creation and the writer's
        lock; it unlinks it before letting go, so a writer that finds its file unlinked once
        it holds the lock starts another one."""
        while True:
            tmp = path.parent / f".{path.name}{TEMP_MARK}{secrets.token_hex(6)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink > 0:
                    return tmp, fd
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
            os.close(fd)  # swept before it was ours: take another name

    def sweep_temps(self, prefix: str = "") -> tuple[int, int]:
        """Remove the temp files under ``prefix`` that no writer holds (see the module
        docstring): ``(files, bytes)`` removed. A file a live writer holds is left alone."""
        base = self._path(prefix.strip("/")) if prefix.strip("/") else self.root
        files = size = 0
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                if not (name.startswith(".") and TEMP_MARK in name):
                    continue
                removed = _remove_unheld(Path(dirpath) / name)
                if removed is not None:
                    files, size = files + 1, size + removed
        return files, size

    def sweep_and_list_sizes(self, prefix: str = "") -> tuple[dict[str, int], tuple[int, int]]:
        """One walk of the folder ``prefix`` that removes the temp files nobody holds (as
        ``sweep_temps``) and lists the objects' sizes (as ``list_sizes``): a hidden-state set's
        start lists its folder once, not twice."""
        sizes: dict[str, int] = {}
        swept = [0, 0]

        def on_file(entry: os.DirEntry[str], key: str | None) -> None:
            if key is not None:
                sizes[key] = _entry_size(entry)
                return
            if TEMP_MARK not in entry.name:
                return
            removed = _remove_unheld(Path(entry.path))
            if removed is not None:
                swept[0], swept[1] = swept[0] + 1, swept[1] + removed

        self._walk(prefix, on_file)
        return sizes, (swept[0], swept[1])

    def _walk(self, prefix: str, on_file: Callable[[os.DirEntry[str], str | None], None]) -> None:
        """Call ``on_file(entry, key)`` for every file under the folder of ``prefix`` (its part
        up to the last ``/``): ``key`` the file's key where it is one that starts with
        ``prefix``, None for a hidden one (a name or a folder starting with ``.``: a temp file
        among them; never listed). A folder that cannot be listed is a StoreError (the file
        system's own, ``lost+found``, is skipped)."""
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        folders = [(base, "" if not head else head + "/", False)]  # (folder, its keys', hidden)
        while folders:
            folder, rel, hidden = folders.pop()
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        dot = hidden or entry.name.startswith(".")
                        if entry.is_dir():  # a link to a folder is not entered (os.walk)
                            if not entry.is_symlink():
                                folders.append((Path(entry.path), f"{rel}{entry.name}/", dot))
                        elif dot:
                            on_file(entry, None)
                        elif (key := rel + entry.name).startswith(prefix):
                            on_file(entry, key)
            except FileNotFoundError:
                if folder == base:
                    return  # no folder yet: nothing in it
                continue  # removed while walked
            except NotADirectoryError:
                continue
            except OSError as exc:
                if folder.name in FOREIGN_FOLDERS:
                    continue
                raise os_error(exc, folder, "list") from exc

    def _settle_existing(self, path: Path, size: int, same: Callable[[Path], bool]) -> None:
        try:
            ok = path.stat().st_size == size and same(path)
        except OSError as exc:
            # a file system that does not answer now cannot tell our bytes from another's:
            # retried, never taken for another writer's object (the caller would then write
            # the same records again under the next name)
            if exc.errno in _PASSING_ERRNOS:
                raise os_error(exc, path, "read") from exc
            ok = False
        if not ok:
            raise AlreadyExistsError(f"{path}: already exists; the store never overwrites")

    def _read(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise os_error(exc, path, "read") from exc

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        path = self._path(key)
        try:
            with path.open("rb") as fh:
                fh.seek(start)
                return fh.read(length)
        except OSError as exc:
            raise os_error(exc, path, "read") from exc

    def _list(self, prefix: str) -> builtins.list[str]:
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        if not base.is_dir():
            return []
        out: builtins.list[str] = []

        def unlisted(exc: OSError) -> None:  # a folder it cannot list is no empty folder
            if exc.filename and Path(exc.filename).name in FOREIGN_FOLDERS:
                return  # the file system's own (a store at a mount's root), never a key's
            raise os_error(exc, exc.filename or base, "list") from exc

        for dirpath, dirnames, filenames in os.walk(base, onerror=unlisted):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith("."):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    out.append(key)
        return out

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _size(self, key: str) -> int:
        path = self._path(key)
        try:
            return path.stat().st_size
        except OSError as exc:
            raise os_error(exc, path, "read") from exc

    def _open_input(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return path.open("rb")
        except OSError as exc:
            raise os_error(exc, path, "read") from exc


def _entry_size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_size
    except OSError as exc:
        raise os_error(exc, entry.path, "read") from exc


def _remove_unheld(path: Path) -> int | None:
    """Unlink ``path`` if no process holds its flock (its size), else None. The lock is taken
    before the unlink and let go after it, so a writer never loses a file it holds."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # gone meanwhile (committed and unlinked by its writer) or unreadable
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None  # a live writer holds it
            raise
        size = os.fstat(fd).st_size
        try:
            path.unlink()
        except FileNotFoundError:
            return None
        return size
    finally:
        os.close(fd)
