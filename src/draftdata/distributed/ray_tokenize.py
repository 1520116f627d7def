"""``draftdata tokenize --ray``: tokenize a run's completion shards as a Ray Data job.

The dataset is the run's list of completion shards (one row per shard, so each shard is read
once, whole, through the run store: format-checked, S3 or local, no second S3 client config).
``map_batches`` sends the rows through ``ShardTokenizer``, a Ray actor class: each actor loads
the tokenizer once, reads its shard, calls the single-process stage's batch function
``tokenize_completions`` and writes one sample shard, named after the input shard, create-only
through the store. The same input always yields the same bytes under the same name, so a task
Ray retries, or a rerun of the command, writes nothing twice (an existing identical object is
accepted, anything else refuses); shards whose output exists are skipped on a rerun.

The samples are those of the single-process ``tokenize`` (the same function makes them); only
the split into files differs (one output shard per input shard).

This module does not tokenize by itself and does not define the sample format.
"""

from __future__ import annotations

from typing import Any

import msgspec


class RayTokenizeResult(msgspec.Struct, kw_only=True):
    """What the Ray Data job did: shards read/written/skipped, samples, merged stats."""

    out: str
    shards: int
    written: int
    skipped: int
    samples: int
    stats: dict[str, Any] = msgspec.field(default_factory=dict)
    wall_s: float = 0.0


def run_tokenize(config: Any, *, address: str | None = None, **options: Any) -> RayTokenizeResult:
    """Tokenize the run of ``config`` on Ray Data (see the module docstring)."""
    raise NotImplementedError("tokenize --ray: waiting for the tokenize stage")


def summary_lines(result: RayTokenizeResult) -> list[str]:
    """The final summary of a Ray tokenize."""
    return [
        f"ray tokenize: {result.samples} samples from {result.shards} completion shards "
        f"({result.written} written, {result.skipped} already there) in {result.wall_s:.1f} s "
        f"into {result.out}"
    ]
