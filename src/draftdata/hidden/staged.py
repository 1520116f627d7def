"""The files a hidden-states fleet writes: read under the connector's lock, checked, removed.

vLLM's ``ExampleHiddenStatesConnector`` (and the simulator, ``sim/hidden.py``) answer a
prefill request with ``kv_transfer_params.hidden_states_path`` = ``PATH`` and write
``PATH`` (safetensors: ``hidden_states`` ``[T, layers, hidden]``, ``token_ids`` ``[T]``)
after the answer, holding an exclusive ``flock`` on ``PATH.lock`` until the write ends
(docs/engines.md). Here:

- ``read_staged(path, expect, timeout_s)`` takes a shared lock on ``PATH.lock`` (it waits, up
  to ``timeout_s``, while the server writes), reads ``PATH`` and checks it: the tensors are
  there, ``token_ids`` are exactly the ids sent, and ``hidden_states`` has one row per id.
  A missing lock or file, a torn file, a lock held past the timeout: ``MalformedAnswerError``
  (the server answered and then wrote nothing usable: its engine died, or its folder is not
  this one). Other ids or another shape: ``ImpossibleAnswerError`` (the server's fault: it is
  taken out).
- ``remove_staged(path)`` removes ``PATH`` and ``PATH.lock`` (vLLM never does): every file is
  removed as soon as it is read, whatever came of it, so the staging folder holds at most the
  requests in flight.
- ``sweep(folder, older_than_s)`` removes what earlier commands left (a request whose answer
  was lost, a killed reader): files older than ``older_than_s`` whose lock no writer holds.

No engine, no dispatch: plain files. torch and safetensors are imported when a file is read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from draftdata.errors import ImpossibleAnswerError, MalformedAnswerError

if TYPE_CHECKING:
    import torch

LOCK_SUFFIX = ".lock"
_POLL_S = 0.01


def _lock_path(path: str) -> str:
    return path + LOCK_SUFFIX


def _shared_lock(fd: int, timeout_s: float) -> bool:
    """Take a shared flock on ``fd``, waiting up to ``timeout_s``; whether it was taken."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def read_staged(path: str, expect: npt.NDArray[np.int64], timeout_s: float) -> torch.Tensor:
    """The ``hidden_states`` of ``path`` (``[T, layers, hidden]``, the dtype written), once its
    writer has released the lock and its ``token_ids`` are ``expect``; MalformedAnswerError or
    ImpossibleAnswerError otherwise (module docstring)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        fd = os.open(_lock_path(path), os.O_RDONLY)
    except FileNotFoundError:
        raise MalformedAnswerError(
            f"no {_lock_path(path)}: the server's hidden-states folder is not visible here, "
            "or the server did not take the request's lock"
        ) from None
    except OSError as exc:
        raise MalformedAnswerError(f"cannot open {_lock_path(path)}: {exc}") from exc
    try:
        if not _shared_lock(fd, timeout_s):
            raise MalformedAnswerError(f"{path}: still being written after {timeout_s:g} s")
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise MalformedAnswerError(
                f"{path}: the server answered with this path and wrote no file there (its "
                "engine died after answering?)"
            ) from None
        except OSError as exc:
            raise MalformedAnswerError(f"cannot read {path}: {exc}") from exc
    finally:
        os.close(fd)
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise MalformedAnswerError(
            f"{path}: a torn or unreadable safetensors file ({exc})"
        ) from exc
    states, ids = tensors.get("hidden_states"), tensors.get("token_ids")
    if states is None or ids is None:
        raise ImpossibleAnswerError(
            f"{path}: holds {sorted(tensors)}, not hidden_states and token_ids"
        )
    got = ids.reshape(-1).numpy().astype(np.int64, copy=False)
    if got.shape != expect.shape or not np.array_equal(got, expect):
        first = _first_difference(got, expect)
        raise ImpossibleAnswerError(
            f"{path}: token_ids are not the ids sent ({len(got)} ids for {len(expect)}, first "
            f"difference at position {first}): states of other tokens"
        )
    if states.dim() != 3 or states.shape[0] != len(expect):
        raise ImpossibleAnswerError(
            f"{path}: hidden_states of shape {tuple(states.shape)} for {len(expect)} tokens "
            "(expected [tokens, layers, hidden])"
        )
    return states


def _first_difference(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


def remove_staged(path: str) -> None:
    """Remove ``path`` and its lock file (either may be gone already)."""
    for p in (path, _lock_path(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _held(lock: str) -> bool:
    """Whether a writer holds ``lock`` now (an exclusive flock that ours cannot take)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def sweep(folder: str, older_than_s: float, *, now: float | None = None) -> int:
    """Remove the staged files (and locks) in ``folder`` last touched more than
    ``older_than_s`` ago whose lock no writer holds; how many files were removed."""
    root = Path(folder)
    if not root.is_dir():
        return 0
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = 0
    for entry in root.iterdir():
        name = entry.name
        if not (name.endswith(".safetensors") or name.endswith(".safetensors" + LOCK_SUFFIX)):
            continue
        data = str(entry)[: -len(LOCK_SUFFIX)] if name.endswith(LOCK_SUFFIX) else str(entry)
        try:
            if entry.stat().st_mtime > cutoff or _held(_lock_path(data)):
                continue
        except FileNotFoundError:
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed += not name.endswith(LOCK_SUFFIX)
    return removed
