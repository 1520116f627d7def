"""The simulator's hidden-state extraction: vLLM's ``extract_hidden_states`` protocol, no model.

A simulated server started with ``--hidden-states DIR`` (``SimConfig.hidden_states``) answers
``POST /v1/completions`` the way vLLM 0.32 does with the ``extract_hidden_states`` speculative
method and its ``ExampleHiddenStatesConnector`` (docs/engines.md): the request's ``prompt`` is
a list of token ids, it "prefills" them (``prefill_per_token_s`` a token), answers one token,
and returns ``kv_transfer_params.hidden_states_path`` = ``DIR/<request id>.safetensors``. The
file holds ``hidden_states`` ``[T, len(layers), hidden_size]`` bf16 and ``token_ids`` ``[T]``
int64. Before the answer leaves, ``PATH.lock`` exists with an exclusive ``flock`` held on it;
the file is written after the answer (``hidden_write_s`` later) and the lock is released then,
so a reader that takes a shared lock on ``PATH.lock`` sleeps until the file is whole. Neither
file is ever removed by the server.

The values are a pure function of the token ids, the position and the layer id
(``states_for``), each exactly representable in bf16, so a test can recompute what any sample's
file must hold. Position ``t`` depends only on tokens ``0..t`` (as a causal model's states do):
a file cut or mixed with another sample's tokens shows.

Faults (``FaultConfig``): ``hidden_missing`` answers with a path and never writes the file (the
lock is released with nothing behind it: what a vLLM engine that dies after answering leaves,
docs/engines.md); ``hidden_wrong_ids`` writes a file whose ``token_ids`` are not the prompt's
(the class of speculators' issue #279: states of another sample). A crash (``crash_after``,
``SimServer.crash``) drops every write not yet done, releasing its lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

SAFETENSORS_DTYPES = {"BF16": 2, "I64": 8, "F32": 4}


_P = 251  # the prime the simulated states are reduced modulo


def states_for(
    token_ids: Sequence[int] | npt.NDArray[np.int64], layers: Sequence[int], hidden_size: int
) -> npt.NDArray[np.float32]:
    """The simulated states ``[T, len(layers), hidden_size]`` (float32 holding bf16-exact
    values in [-2, 2)): at position ``t`` of layer ``l``, column ``h``, a hash of the tokens up
    to ``t`` (a running sum weighted by position), ``t``, ``l`` and ``h``.

    Two different tokens at a position give a different row there (with ``hidden_size`` >= 4,
    ids below 251**3): the token enters each column as a cubic in the column (its base-251
    digits the coefficients), reduced modulo the prime 251, and a cubic that vanishes at four
    points is zero. (A token term that did not depend on the column let 1 in 255 pairs of
    tokens give one row.)"""
    ids = np.asarray(token_ids, dtype=np.int64)
    pos = np.arange(len(ids), dtype=np.int64)
    prefix = np.cumsum((ids % 1009) * (pos % 13 + 1)) % 4093  # depends on tokens 0..t only
    lay = np.asarray(list(layers), dtype=np.int64)
    cols = np.arange(hidden_size, dtype=np.int64)
    x = (cols + 1) % _P
    digits = [(ids // _P**k) % _P for k in range(3)]
    token = np.zeros((len(ids), hidden_size), dtype=np.int64)
    for k, d in enumerate(digits):
        token += d[:, None] * (x[None, :] ** (k + 1) % _P)
    key = (
        prefix[:, None, None] * 131
        + token[:, None, :]
        + lay[None, :, None] * 29
        + cols[None, None, :] * 17
        + pos[:, None, None] * 3
    )
    return ((key % _P) - 125).astype(np.float32) / 64.0  # k/64, |k| <= 125: exact in bf16


def _bf16_bytes(values: npt.NDArray[np.float32]) -> bytes:
    """bf16 bytes of float32 values that bf16 holds exactly (the upper half of each float)."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4") >> 16
    return bits.astype("<u2").tobytes()


def safetensors_bytes(tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> bytes:
    """A safetensors file: an 8-byte little-endian header length, the JSON header (dtype,
    shape, data offsets per tensor, in the order given), then the tensors' bytes."""
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        size = SAFETENSORS_DTYPES[dtype] * int(np.prod(shape, dtype=np.int64))
        if size != len(data):
            raise ValueError(f"{name}: {len(data)} bytes for {dtype} {shape}")
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw + b"".join(d for _, _, d in tensors.values())


def file_bytes(
    token_ids: Sequence[int], layers: Sequence[int], hidden_size: int, *, stored_ids: Sequence[int]
) -> bytes:
    """The bytes of one request's file: the states of ``token_ids`` and, as ``token_ids``,
    ``stored_ids`` (the prompt's own unless a fault says otherwise)."""
    states = states_for(token_ids, layers, hidden_size)
    ids = np.asarray(stored_ids, dtype="<i8")
    return safetensors_bytes(
        {
            "hidden_states": ("BF16", states.shape, _bf16_bytes(states)),
            "token_ids": ("I64", (len(ids),), ids.tobytes()),
        }
    )


class PendingWrite:
    """One request's file on its way: the lock taken (``open``), then written and released
    (``finish``), or released with nothing written (``drop``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = Path(str(path) + ".lock")
        self._fd: int | None = None

    def open(self) -> None:
        """Create ``PATH.lock`` and hold an exclusive flock on it (before the answer leaves)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd

    def _write(self, data: bytes) -> None:
        tmp = self.path.with_name(self.path.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(self.path)

    async def finish(self, data: bytes | None, delay_s: float) -> None:
        """After ``delay_s``, write ``data`` (None: nothing) and release the lock."""
        try:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if data is not None:
                await asyncio.to_thread(self._write, data)
        finally:
            self.drop()

    def drop(self) -> None:
        """Release the lock (the file stays as it is: written, or never)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
