"""The store's protocol and its rules: what every backend (``local.py``, ``s3.py``) builds on.

- ``Store``: the create-only object store's public API (``put_new``, ``put_new_file``, reads,
  listing); it checks every key and refuses a write under a protected prefix, then calls the
  backend's raw operation (``_put_new``, ``_read``, ...). The contract of each operation is in
  its docstring; ``opener.py`` (``open_store``) picks the backend for a URL.
- Key rules: ``check_key`` (relative, ``/``-separated, no empty, ``.`` or ``..`` part).
- Location rules: ``normalise_url`` (the canonical form of a store URL), ``split_s3_url``, and
  ``overlap`` / ``refuse_protected``, which compare two locations by path components (the
  protected-prefix rule; ``protect.py`` adds the start-up check that lists what is there).

This module imports nothing of the store, so the backends and ``protect`` import it and nothing
imports in a circle.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from draftdata.errors import ConfigError, ProtectedPrefixError, StoreError


def check_key(key: str) -> str:
    """``key`` if it is a valid store key (relative, ``/``-separated, no empty, ``.`` or ``..``
    part); StoreError otherwise."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"invalid store key {key!r}: keys are relative, '/'-separated names")
    return key


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


def _parts(url: str) -> tuple[str, ...]:
    canon = normalise_url(url)
    if canon.startswith("s3://"):
        return ("s3:", *[p for p in canon[5:].split("/") if p])
    return ("file:", *[p for p in canon.split("/") if p])


def overlap(a: str, b: str) -> str | None:
    """How location ``a`` relates to ``b``: 'equals', 'contains', 'lies inside', or None.

    By path components after ``normalise_url``: ``s3://b/a/`` equals ``s3://b/a``, and
    ``s3://b/completions_v2`` does not overlap ``s3://b/completions``."""
    pa, pb = _parts(a), _parts(b)
    if pa == pb:
        return "equals"
    if pb[: len(pa)] == pa:
        return "contains"
    if pa[: len(pb)] == pb:
        return "lies inside"
    return None


def refuse_protected(
    location: str,
    protect: Sequence[str],
    *,
    what: str = "output",
    found: Callable[[str], str] | None = None,
) -> None:
    """Raise ProtectedPrefixError if ``location`` equals, contains or lies inside one of
    ``protect``; ``found(prefix)``, if given, says what is stored there (in the message)."""
    for prot in protect:
        rel = overlap(location, prot)
        if rel is None:
            continue
        there = f"; {found(prot)}" if found is not None else ""
        raise ProtectedPrefixError(
            f"{what} {normalise_url(location)} {rel} the protected prefix "
            f"{normalise_url(prot)}{there}; choose an output prefix outside it "
            "(or remove it from --protect / protect: if that is really intended)"
        )


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
        check_key(key)
        refuse_protected(self.key_url(key), self.protect, what="write")
        self._put_new(key, data)

    def put_new_file(self, key: str, path: Path | str) -> None:
        """Create ``key`` from the local file ``path``, streamed (never read whole into memory).

        Same contract as ``put_new``: create-only, atomic, a key already holding exactly these
        bytes counts as done, anything else raises AlreadyExistsError.
        """
        check_key(key)
        refuse_protected(self.key_url(key), self.protect, what="write")
        self._put_new_file(key, Path(path))

    def read(self, key: str) -> bytes:
        """The whole object at ``key``; StoreError if it does not exist."""
        return self._read(check_key(key))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from offset ``start`` (fewer at the end of the object)."""
        if start < 0 or length < 0:
            raise StoreError(f"{self.key_url(key)}: invalid range {start}+{length}")
        if length == 0:
            return b""
        return self._read_range(check_key(key), start, length)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Sorted relative keys that start with ``prefix`` (a string prefix, not only folders)."""
        return sorted(self._list(prefix))

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        """key -> size in bytes of every key ``list(prefix)`` gives, from the listing itself
        where the backend has it (S3's listing carries sizes: no request per key)."""
        return {k: self.size(k) for k in self.list(prefix)}

    def exists(self, key: str) -> bool:
        """Whether an object exists at ``key``."""
        return self._exists(check_key(key))

    def size(self, key: str) -> int:
        """The object's size in bytes; StoreError if it does not exist."""
        return self._size(check_key(key))

    def open_input(self, key: str) -> BinaryIO:
        """A seekable binary reader of ``key`` (pyarrow.parquet reads footers and columns)."""
        return self._open_input(check_key(key))

    def sweep_temps(self, prefix: str = "") -> tuple[int, int]:
        """Remove what killed writers left under ``prefix`` and nobody holds: ``(files,
        bytes)``. Only a local store's are swept (its temp files). An S3 upload a kill cuts
        leaves no object; a multipart one (a file over 64 MiB) leaves its parts, billed until
        a bucket lifecycle rule (AbortIncompleteMultipartUpload) aborts them."""
        return 0, 0

    def sweep_and_list_sizes(self, prefix: str = "") -> tuple[dict[str, int], tuple[int, int]]:
        """``sweep_temps(prefix)`` and then ``list_sizes(prefix)`` for a folder ``prefix``
        (ending in ``/``), in one listing where the backend can (a local store walks the
        folder once: a hidden-state set's start over many thousand files): ``(key -> size,
        (files, bytes) swept)``."""
        swept = self.sweep_temps(prefix)
        return self.list_sizes(prefix), swept

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
