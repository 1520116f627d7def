"""Path options: what a file or folder option must be, checked before any work is done.

Every command checks its local path options with these functions first (``cli/``), so a wrong
path is one line naming the option and the path (ConfigError, exit 1) instead of a traceback
from deep inside a stage, and is found before a fleet is booked or a dataset read:

- an **input file** exists and is a file; an **input folder** exists and is a folder; an
  **input** of either kind exists;
- an **output file** is not a folder (nor a device), lies in a folder (missing folders are
  created on write; a file on the way is refused), and that folder can be written: probed with
  an unnamed temporary file (root passes permission bits, so ``os.access`` would not tell a
  read-only mount or ``/proc`` apart); ``replace=False`` also refuses an existing file;
- an **output folder** is not a file, and it, or its nearest existing parent, can be written.

``s3://`` URLs pass through unchecked (the store answers for them). What a command does with
an existing output folder (resume, refuse, finish) stays the command's business. This module
reads and writes nothing but the probe.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from draftdata.errors import ConfigError


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a URL (``s3://``, ``file://`` ...) rather than a local path."""
    return "://" in str(path)


def _label(flag: str, path: str | os.PathLike[str]) -> str:
    return f"{flag} {path}" if flag else str(path)


def _nearest(path: Path) -> Path:
    """The nearest existing ancestor of ``path`` (``path`` itself when it exists)."""
    p = path
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _blocker(path: Path) -> Path | None:
    """The first existing non-folder among ``path``'s parents (a file where a folder must be)."""
    p = _nearest(path.parent)
    return None if p.is_dir() else p


def _probe(folder: Path, what: str) -> None:
    """ConfigError unless a file can be created in ``folder`` (made and removed at once)."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".draftdata-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{what}: cannot write in {folder} ({reason}); choose a writable place"
        ) from None


def _missing(path: str | os.PathLike[str], flag: str, hint: str) -> ConfigError:
    p = Path(path).expanduser()
    blocker = _blocker(p)
    why = f" ({blocker} is not a folder)" if blocker is not None else ""
    head = f"{flag}: " if flag else ""
    return ConfigError(
        f"{head}{path} does not exist (no such file or directory){why}"
        + (f"; {hint}" if hint else "")
    )


def input_file(path: str | os.PathLike[str], flag: str = "", hint: str = "") -> None:
    """ConfigError unless the local ``path`` is an existing file (URLs pass); ``hint`` says
    how to get one."""
    if is_remote(path):
        return
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"{_label(flag, path)}: a folder; give a file")
    if not p.exists():
        raise _missing(path, flag, hint)


def input_folder(path: str | os.PathLike[str], flag: str = "", hint: str = "") -> None:
    """ConfigError unless the local ``path`` is an existing folder (URLs pass)."""
    if is_remote(path):
        return
    p = Path(path).expanduser()
    if p.is_dir():
        return
    if p.exists():
        raise ConfigError(f"{_label(flag, path)}: a file, not a folder; give a folder")
    raise _missing(path, flag, hint)


def input_path(path: str | os.PathLike[str], flag: str = "", hint: str = "") -> None:
    """ConfigError unless the local ``path`` exists, as a file or a folder (URLs pass)."""
    if is_remote(path):
        return
    if not Path(path).expanduser().exists():
        raise _missing(path, flag, hint)


def output_file(path: str | os.PathLike[str], flag: str = "", *, replace: bool = True) -> None:
    """ConfigError unless a file can be written at the local ``path`` (URLs pass): not a
    folder or a device, no file on the way, its folder writable; with ``replace=False`` it
    must not exist yet (nothing is overwritten)."""
    if is_remote(path):
        return
    p = Path(path).expanduser()
    what = _label(flag, path)
    if p.is_dir():
        raise ConfigError(f"{what}: a folder; give a file name, e.g. {Path(path) / 'NAME'}")
    if os.path.lexists(p):
        if not p.is_file():
            raise ConfigError(f"{what}: exists and is not a regular file; give a file name")
        if not replace:
            raise ConfigError(f"{what}: already exists; choose a new name (never overwritten)")
    blocker = _blocker(p)
    if blocker is not None:
        raise ConfigError(f"{what}: {blocker} is not a folder; give a path in a folder")
    _probe(_nearest(p.parent), what)


def output_folder(path: str | os.PathLike[str], flag: str = "") -> None:
    """ConfigError unless the local ``path`` is, or can be created as, a writable folder
    (URLs pass). Whether an existing folder may be used is the command's rule."""
    if is_remote(path):
        return
    p = Path(path).expanduser()
    what = _label(flag, path)
    if os.path.lexists(p) and not p.is_dir():
        raise ConfigError(f"{what}: a file, not a folder; give a folder")
    blocker = _blocker(p) if not p.is_dir() else None
    if blocker is not None:
        raise ConfigError(f"{what}: {blocker} is not a folder; give a path in a folder")
    _probe(_nearest(p), what)
