"""The bill before the run: the bytes a set will take, and with a pilot how long it will run.

Arithmetic only, from the plan and the model's config (no weights, no forward pass)::

    bytes = Σ over samples of the writer's file size
          ≈ tokens × layers × hidden × bytes per value  (+ the token ids and each file's header)

printed as ``53,120 samples, 171M tokens, 4 layers × 5,120 × bf16 → 7.0 TB`` and, after a
pilot, ``at the pilot's 41K tok/s on 8 GPUs: 1 h 10 min``. ``--max-bytes`` refuses a job
whose bill is larger, naming both sizes. Sizes are decimal (1 TB = 10^12 bytes), as disks are
sold; ``parse_size`` reads ``7TB``, ``500G``, ``1.5TiB`` or a plain byte count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from draftdata.errors import ConfigError
from draftdata.hidden.writer import Writer
from draftdata.support.tables import human_bytes as human_bytes

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str, option: str = "--max-bytes") -> int:
    """Bytes from ``7TB``, ``500G``, ``1.5TiB``, ``123456``; ConfigError naming ``option``."""
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"{option} {text!r}: give a size such as 7TB, 500GB or 1.5TiB")
    value, unit, binary = float(m.group(1)), m.group(2).lower(), m.group(3)
    scale = 1024 ** ("kmgtp".index(unit) + 1) if binary and unit else _UNITS[unit]
    size = int(value * scale)
    if size < 1:
        raise ConfigError(f"{option} {text!r}: must be at least 1 byte")
    return size


def human_count(n: float) -> str:
    """``171M``, ``41K``, ``2.3B``, ``870``."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 10 else f"{v:,.0f}{unit}"
    return f"{n:,.0f}"


def human_time(seconds: float) -> str:
    """``1 h 10 min``, ``12 min``, ``45 s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600:,} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min"
    return f"{s} s"


@dataclass(frozen=True)
class Bill:
    """The size of a set before it is made: ``sample_bytes`` of the sample files (exact for
    uncompressed files), ``extra_bytes`` of the files beside them (speculators' dataset)."""

    samples: int
    tokens: int
    layers: int
    hidden: int
    dtype: str
    sample_bytes: int
    extra_bytes: int

    @property
    def total(self) -> int:
        """Everything the set will hold."""
        return self.sample_bytes + self.extra_bytes

    def line(self) -> str:
        """``53,120 samples, 171M tokens, 4 layers × 5,120 × bf16 → 7.0 TB``."""
        return (
            f"{self.samples:,} samples, {human_count(self.tokens)} tokens, {self.layers} layers × "
            f"{self.hidden:,} × {self.dtype} → {human_bytes(self.total)}"
        )


def make_bill(writer: Writer, lengths: npt.NDArray[np.int64], layers: int, hidden: int) -> Bill:
    """The bill of files for samples of ``lengths`` tokens, ``layers`` captured tensors of
    ``hidden`` values each, as ``writer`` writes them."""
    per_file = sum(
        writer.predicted_bytes(int(n), layers, hidden) * int(c)
        for n, c in zip(*np.unique(lengths, return_counts=True), strict=True)
    )
    tokens = int(lengths.sum())
    # speculators' dataset: two int64 lists a token and a length a sample (+ Arrow framing)
    extra = 16 * tokens + 24 * len(lengths) + 4096 if writer.format == "speculators" else 0
    return Bill(
        samples=len(lengths),
        tokens=tokens,
        layers=layers,
        hidden=hidden,
        dtype=writer.dtype,
        sample_bytes=per_file,
        extra_bytes=extra,
    )


def check_budget(bill: Bill, max_bytes: int | None) -> None:
    """ConfigError when the bill is larger than ``--max-bytes``, naming both."""
    if max_bytes is not None and bill.total > max_bytes:
        raise ConfigError(
            f"--max-bytes {human_bytes(max_bytes)}: this set would take {human_bytes(bill.total)} "
            f"({bill.line()}); raise --max-bytes, choose fewer --layers, --dtype fp8 "
            "(speculators), a smaller --max-length, or fewer samples"
        )


def where(devices: list[str]) -> str:
    """``8 GPUs``, ``1 GPU``, ``the CPU``, ``2 CPU workers``, ``the fleet``."""
    gpus = sum(d.startswith("cuda") for d in devices)
    if gpus == len(devices):
        return f"{gpus} GPU{'s' if gpus != 1 else ''}"
    if all(d == "cpu" for d in devices):
        return "the CPU" if len(devices) == 1 else f"{len(devices)} CPU workers"
    return f"{len(devices)} workers"


def eta_line(rate: float, devices: list[str], remaining_tokens: int) -> str:
    """``at the pilot's 41K tok/s on 8 GPUs: 1 h 10 min for the 170M tokens left``."""
    on = where(devices)
    if rate <= 0:
        return f"at the pilot's rate on {on}: unknown (nothing measured)"
    return (
        f"at the pilot's {human_count(rate)} tok/s on {on}: "
        f"{human_time(remaining_tokens / rate)} for the {human_count(remaining_tokens)} tokens left"
    )
