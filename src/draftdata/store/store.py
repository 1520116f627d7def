"""A create-only object store over local directories and ``s3://`` URLs.

The run store never overwrites and never deletes data: the only write is ``put_new``, which
creates an object that did not exist, atomically (a reader sees the whole object or nothing);
``put_new_file`` does the same from a local file, streamed (exports use it).

- Local: the bytes go to a temp file beside the target (``.<name>.tmp-<random>``), are fsynced,
  then hard-linked to the final name with ``os.link`` (which fails if the name exists: no
  replace), and the directory is fsynced. Names starting with ``.`` are never listed, so a temp
  file left by a killed process is invisible.
- S3 (``s3.py``): a conditional ``PutObject`` with ``If-None-Match: *``; 412 means the key exists.

In both, a ``put_new`` that finds the key holding exactly its own bytes counts as done: that is
how a retried write whose first attempt did land (response lost) succeeds. Different bytes raise
AlreadyExistsError. A store may carry protected prefixes; a write under one is refused.

Keys are relative and ``/``-separated. This module knows nothing about runs or parquet.
"""

from __future__ import annotations

import builtins
import filecmp
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from draftdata.errors import DISK_ERRNOS, AlreadyExistsError, ConfigError, DiskError, StoreError

_COPY_CHUNK = 1 << 20


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"invalid store key {key!r}: keys are relative, '/'-separated names")
    return key


class Store:
    """A create-only object store rooted at ``url`` (a local directory or ``s3://bucket/prefix``).

    Subclasses implement the raw operations; this base adds key checks and protected prefixes.
    """

    url: str

    def __init__(self, url: str, protect: Sequence[str] = ()) -> None:
        self.url = url
        self.protect = tuple(protect)

    # -- the public API -------------------------------------------------------------------------

    def key_url(self, key: str) -> str:
        """The full URL (or path) of ``key``, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    def child(self, prefix: str) -> Store:
        """A store rooted at ``prefix`` inside this one (same protections)."""
        raise NotImplementedError

    def put_new(self, key: str, data: bytes) -> None:
        """Create ``key`` holding ``data``; AlreadyExistsError if it holds anything else."""
        _check_key(key)
        if self.protect:
            from draftdata.store.protect import check_not_protected

            check_not_protected(self.key_url(key), self.protect, what="write")
        self._put_new(key, data)

    def put_new_file(self, key: str, path: Path | str) -> None:
        """Create ``key`` from the local file ``path``, streamed (never read whole into memory).

        Same contract as ``put_new``: create-only, atomic, a key already holding exactly these
        bytes counts as done, anything else raises AlreadyExistsError.
        """
        _check_key(key)
        if self.protect:
            from draftdata.store.protect import check_not_protected

            check_not_protected(self.key_url(key), self.protect, what="write")
        self._put_new_file(key, Path(path))

    def read(self, key: str) -> bytes:
        """The whole object at ``key``; StoreError if it does not exist."""
        return self._read(_check_key(key))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from offset ``start`` (fewer at the end of the object)."""
        if start < 0 or length < 0:
            raise StoreError(f"{self.key_url(key)}: invalid range {start}+{length}")
        if length == 0:
            return b""
        return self._read_range(_check_key(key), start, length)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Sorted relative keys that start with ``prefix`` (a string prefix, not only folders)."""
        return sorted(self._list(prefix))

    def exists(self, key: str) -> bool:
        """Whether an object exists at ``key``."""
        return self._exists(_check_key(key))

    def size(self, key: str) -> int:
        """The object's size in bytes; StoreError if it does not exist."""
        return self._size(_check_key(key))

    def open_input(self, key: str) -> BinaryIO:
        """A seekable binary reader of ``key`` (pyarrow.parquet reads footers and columns)."""
        return self._open_input(_check_key(key))

    def local_path(self, key: str) -> str | None:
        """The local filesystem path of ``key``, or None for a remote store."""
        return None

    # -- what subclasses provide ----------------------------------------------------------------

    def _put_new(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _put_new_file(self, key: str, path: Path) -> None:
        raise NotImplementedError

    def _read(self, key: str) -> bytes:
        raise NotImplementedError

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        raise NotImplementedError

    def _list(self, prefix: str) -> builtins.list[str]:
        raise NotImplementedError

    def _exists(self, key: str) -> bool:
        raise NotImplementedError

    def _size(self, key: str) -> int:
        raise NotImplementedError

    def _open_input(self, key: str) -> BinaryIO:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


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
        return LocalStore(self.root / _check_key(prefix.strip("/")), self.protect)

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
            tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(6)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as fh:
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
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            full = DiskError.of(exc, str(path), "write to another place")
            if full is not None:
                raise full from exc
            raise StoreError(
                f"{path}: cannot write ({exc.strerror or exc}); check the directory exists "
                "and is writable"
            ) from exc

    def _settle_existing(self, path: Path, size: int, same: Callable[[Path], bool]) -> None:
        try:
            ok = path.stat().st_size == size and same(path)
        except OSError:
            ok = False
        if not ok:
            raise AlreadyExistsError(f"{path}: already exists; the store never overwrites")

    def _read(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from exc

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        path = self._path(key)
        try:
            with path.open("rb") as fh:
                fh.seek(start)
                return fh.read(length)
        except OSError as exc:
            raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from exc

    def _list(self, prefix: str) -> builtins.list[str]:
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        if not base.is_dir():
            return []
        out: builtins.list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
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
            raise StoreError(f"{path}: cannot stat ({exc.strerror or exc})") from exc

    def _open_input(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return path.open("rb")
        except OSError as exc:
            raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``; ConfigError if there is no bucket."""
    parsed = urlparse(url)
    bucket = parsed.netloc
    if parsed.scheme != "s3" or not bucket:
        raise ConfigError(f"{url}: not an s3://BUCKET/PREFIX URL")
    return bucket, parsed.path.strip("/")


def normalise_url(url: str) -> str:
    """The canonical form of a store URL: ``s3://bucket/prefix`` or an absolute local path."""
    url = url.strip()
    if not url:
        raise ConfigError("empty store location; give a directory or an s3://BUCKET/PREFIX URL")
    if url.startswith("s3://"):
        bucket, prefix = split_s3_url(url)
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if "://" in url:
        parsed = urlparse(url)
        if parsed.scheme != "file":
            raise ConfigError(
                f"{url}: unsupported store scheme {parsed.scheme!r}; use s3:// or a path"
            )
        url = parsed.path
    return os.path.realpath(os.path.expanduser(url))


def open_store(url: str, *, protect: Sequence[str] = ()) -> Store:
    """Open the store at ``url``: a local directory (or ``file://``) or ``s3://bucket/prefix``.

    S3 credentials, region and endpoint come from the standard AWS configuration (environment,
    profiles, ``AWS_ENDPOINT_URL``). Writes under any of ``protect`` are refused.
    """
    canon = normalise_url(url)
    if canon.startswith("s3://"):
        from draftdata.store.s3 import S3Store

        bucket, prefix = split_s3_url(canon)
        return S3Store(bucket, prefix, protect=protect)
    return LocalStore(Path(canon), protect=protect)
