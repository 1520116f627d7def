"""Settings of the hidden-states stage: ``HiddenConfig`` in, and the settings record it commits.

``HiddenConfig`` is everything a ``draftdata hidden-states`` command was given (a plain msgspec
Struct: picklable for worker processes, JSON-ready); ``validate`` turns a bad value into a
ConfigError naming the option. ``options`` carries what one engine alone reads (the vLLM
engine's fleet, ...), so an engine adds options without changing this record.

``HiddenSettings`` is what changes the files a run writes, recorded in the set's manifest and
compared on every resume (``manifest.py``): the target (its name, the sha256 of its
``config.json`` and its weight files' names and sizes), the resolved layers, the stored dtype,
the format and compression, the longest sample, and the dataset's identity (sha256 over every
sample's id, input_ids and loss_mask, in plan order). The engine, devices, batch budget,
staging and verification are not settings: they change how the files are made, not what they
hold (the verification bounds the rounding).

This module holds values only; ``stage.py`` runs the stage.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from draftdata.errors import ConfigError
from draftdata.hidden.writer import Compression, StoredDtype
from draftdata.hidden.writers import WRITERS

Format = Literal["speculators", "specforge"]

DEFAULT_BATCH_TOKENS = 16384  # tokens (padding included) in one forward pass
DEFAULT_VERIFY = 8
DEFAULT_STAGING = 1 << 30  # bytes of encoded files waiting for the store, at most
STORED_DTYPES = ("bf16", "fp16", "fp32", "fp8")
COMPUTE_DTYPES = ("auto", "bfloat16", "float16", "float32")


class HiddenConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Everything ``hidden_states`` needs.

    ``tokenized`` is tokenize's output or a merged tokenized dataset (a folder, file or
    ``s3://`` prefix of sample parquet); ``model`` the target's local Hugging Face folder;
    ``out`` the set's prefix (local or ``s3://``). ``layers`` is ``eagle3`` or ``I,J,K``
    (``layers.py``); ``dtype`` the stored dtype; ``compute_dtype`` what the forward pass runs
    in (``auto``: the model's own, float32 on a CPU that lacks fast bf16 is not chosen for
    you). ``gpus``: ``auto`` (every visible GPU, else the CPU), ``cpu``, ``cpu:N`` (N CPU
    workers, for tests), or GPU ids ``0-7`` / ``0,2``. ``batch_tokens``: tokens per forward
    pass, padding included; ``max_length``: samples longer are cut to it (None: the model's
    context). ``verify``: samples recomputed one at a time and compared (0: none). ``max_bytes``
    refuses a job whose bill is larger; ``pilot`` (a fraction < 1 or a count >= 1 of samples)
    measures the rate on them and stops after printing the forecast. ``staging_bytes`` bounds
    the encoded files held in memory before the store has them. ``options``: what one engine
    reads for itself (see ``backend.py``).
    """

    tokenized: str
    model: str
    out: str
    format: Format
    layers: str = "eagle3"
    engine: str = "transformers"
    gpus: str = "auto"
    dtype: StoredDtype = "bf16"
    compute_dtype: str = "auto"
    compress: Compression = "none"
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_length: int | None = None
    verify: int = DEFAULT_VERIFY
    max_bytes: int | None = None
    pilot: float | None = None
    staging_bytes: int = DEFAULT_STAGING
    protect: list[str] = msgspec.field(default_factory=list)
    lease_ttl: float = 30.0
    lease_wait: float = 0.0
    progress: bool = True
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    # "I/P": only the samples whose id hash falls in partition I of P (generate's rule,
    # ``generate/prompts/partition.py``), under that partition's own lease: how ``hidden-states
    # --ray`` spreads one set over a cluster (``distributed/ray_hidden.py``)
    partition: str | None = None

    def validate(self) -> HiddenConfig:
        """Self, or a ConfigError naming the first bad option."""
        if self.format not in WRITERS:
            raise ConfigError(f"--format {self.format!r}: choose {' or '.join(WRITERS)}")
        if self.dtype not in STORED_DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r}: choose one of {', '.join(STORED_DTYPES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(
                f"--compute-dtype {self.compute_dtype!r}: choose one of {', '.join(COMPUTE_DTYPES)}"
            )
        if self.compress not in ("none", "gzip"):
            raise ConfigError(f"--compress {self.compress!r}: choose none or gzip")
        if self.batch_tokens < 1:
            raise ConfigError(f"--batch-tokens {self.batch_tokens}: must be at least 1")
        if self.max_length is not None and self.max_length < 1:
            raise ConfigError(f"--max-length {self.max_length}: must be at least 1")
        if self.verify < 0:
            raise ConfigError(f"--verify {self.verify}: must be 0 (off) or more")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ConfigError(f"--max-bytes {self.max_bytes}: must be a positive size")
        if self.pilot is not None and not (0 < self.pilot < 1 or float(self.pilot).is_integer()):
            raise ConfigError(
                f"--pilot {self.pilot:g}: a fraction of the samples (0 < F < 1) or a count N >= 1"
            )
        if self.pilot is not None and self.pilot <= 0:
            raise ConfigError(f"--pilot {self.pilot:g}: must be greater than 0")
        if self.staging_bytes < 1 << 20:
            raise ConfigError(f"--staging-bytes {self.staging_bytes}: at least 1 MiB")
        if self.partition is not None:
            from draftdata.generate.prompts.partition import parse_partition

            parse_partition(self.partition)
        if not self.lease_ttl > 0:
            raise ConfigError(f"--lease-ttl {self.lease_ttl:g}: must be greater than 0")
        return self


class ModelIdentity(msgspec.Struct, kw_only=True, frozen=True):
    """The target as the settings know it: its folder's name (shown), its ``config.json``'s
    sha256, its weight files (name -> size) and its depth and width."""

    name: str
    config_sha256: str
    weights: dict[str, int]
    model_type: str
    num_layers: int
    hidden_size: int


class DatasetIdentity(msgspec.Struct, kw_only=True, frozen=True):
    """The samples as planned: where they were read (shown), how many, their tokens, and the
    sha256 over every planned sample's id, input_ids and loss_mask in plan order."""

    url: str
    samples: int
    tokens: int
    sha256: str


class HiddenSettings(msgspec.Struct, kw_only=True, frozen=True):
    """What the files of a set depend on (see the module docstring); its JSON and hash are in
    the manifest. ``aux_layers`` in the index space of ``layers.py``; ``last`` is
    ``pre_norm`` or ``post_norm``."""

    format: Format
    dtype: StoredDtype
    compress: Compression
    aux_layers: list[int]
    last: str
    max_length: int | None
    model: ModelIdentity
    dataset: DatasetIdentity

    def compared(self) -> dict[str, Any]:
        """The settings a resume compares: everything but the shown-only names and URLs."""
        doc: dict[str, Any] = msgspec.to_builtins(self)
        doc["model"].pop("name", None)
        doc["dataset"].pop("url", None)
        return doc


class LayerCheck(msgspec.Struct, kw_only=True, frozen=True):
    """One captured layer's difference between the written states and a one-at-a-time
    recomputation, over the verified samples: the largest absolute difference, the largest
    difference relative to the layer's largest magnitude, and the RMS of the difference over
    the RMS of the values (the figure the tolerance applies to)."""

    layer: str  # "2", "14", "25", "36 (pre_norm)"
    max_abs: float
    max_rel: float
    rms_rel: float


class Verification(msgspec.Struct, kw_only=True, frozen=True):
    """The verification of one command: samples recomputed alone and compared per layer, the
    stored dtype's tolerance on ``rms_rel``, and whether every layer kept within it."""

    samples: int
    rows: list[int]
    tolerance: float
    passed: bool
    layers: list[LayerCheck]
    worst_row: int | None = None


class HiddenSummary(msgspec.Struct, kw_only=True):
    """What one ``hidden-states`` command did (printed, and written as ``hidden_summary*.json``
    once every planned sample is done). Counts are of samples; ``bytes_*`` of files in the
    store (sample files only); ``bill_bytes`` the size forecast of the whole set before any
    pass; ``tokens_per_s`` the forward-and-write rate of this command over its own samples."""

    out: str
    trainer_format: str  # --format (the file's own "format" key is its format version)
    model: str
    layers: str
    dtype: str
    engine: str
    devices: list[str]
    planned: int
    tokens: int
    dropped: dict[str, int]
    truncated: int
    done_before: int
    written: int
    already_there: int
    remaining: int
    tokens_written: int
    bytes_written: int
    bytes_total: int
    bill_bytes: int
    elapsed_s: float
    tokens_per_s: float
    verification: Verification | None = None
    fp8_error: list[LayerCheck] | None = None  # --dtype fp8: its error against bf16, per layer
    compression_ratio: float | None = None  # --compress gzip: stored / uncompressed bytes
    pilot: dict[str, Any] | None = None  # --pilot: the measured rate and the forecast

    @property
    def complete(self) -> bool:
        """Whether every planned sample's file is in the store."""
        return self.remaining == 0
