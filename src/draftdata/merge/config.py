"""The merge stage's settings: inputs, target mix, sampling, split and output format.

``MergeConfig`` is what ``draftdata merge`` builds from its flags and what the demo builds in
code (``--mix`` is read and checked by ``draftdata.shared.mix``, as for every stage). Values
YAML/flag types cannot check (shares, fractions, formats) are checked in ``check_config``. No logic
lives here.
"""

from __future__ import annotations

import msgspec

from draftdata.errors import ConfigError
from draftdata.shared.mix import check_shares

# parquet, plus the trainers' JSONL (merge/jsonl.py): chat formats for chat inputs, speculators
# for tokenized ones
FORMATS = ("parquet", "sharegpt", "specforge", "openai", "modelopt", "eagle", "speculators")
# What a mix's shares count: the loss tokens a drafter trains on (default), or rows.
MIX_BY = ("tokens", "rows")


class MergeConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Everything ``merge`` needs.

    ``existing`` and ``add`` are dataset locations (local or ``s3://``): tokenized sample
    parquet, generate runs, prompts JSONL or chat rows (SpecForge ``conversations``, ShareGPT,
    OpenAI ``messages``). All inputs must be tokenized, or all chat-shaped. Inputs are read in
    order, existing first, and the first copy of a duplicate (same id, unless ``dedup_ids`` is
    False, or same content) wins. ``mix`` maps domain -> share
    (normalised to sum 1; empty = keep the combined mix); ``other`` pools the domains it does not
    name, which are otherwise dropped. ``tolerance`` is how far (as a fraction, 0.005 = half a
    point) each domain's share may sit from its target so that more rows can be kept.
    ``upsample`` repeats rows of short domains (at most ``max_repeat`` copies of a row) instead
    of only down-sampling the others. Shards hold at most ``shard_rows`` rows and about
    ``shard_bytes``; the external shuffle's buckets (in ``tmp_dir``) about ``bucket_bytes``.
    ``workers`` processes classify and hash chat rows in pass 1 (1: in this process; 0: one
    per core, at most 8, when the chat inputs exceed 32 MiB). Workers are spawned, so a script
    that asks for them needs the ``if __name__ == "__main__":`` guard; the CLI uses 0.
    ``protect``: prefixes the output may not equal, contain or lie inside (like generate's).

    ``mix_by``: ``tokens`` (shares of the loss tokens, what a drafter trains on; counted with
    ``tokenizer``'s tokenizer for chat rows when given, else estimated) or ``rows``. When the
    plan keeps less than ``min_keep`` of what the mix could use (the unique rows of its domains,
    in the mix's unit) merge stops before writing, unless ``allow_drop``. ``plan_only``: plan,
    report the plan and write nothing. ``allow_models``: merge inputs answered by different
    target models (refused otherwise: ``merge/models.py``).
    """

    existing: list[str] = msgspec.field(default_factory=list)
    add: list[str] = msgspec.field(default_factory=list)
    mix: dict[str, float] = msgspec.field(default_factory=dict)
    out: str = "merged"
    seed: int = 0
    eval_fraction: float = 0.01
    format: str = "parquet"
    upsample: bool = False
    max_repeat: int = 4
    dedup_ids: bool = True
    workers: int = 1
    tolerance: float = 0.005
    shard_rows: int = 100_000
    shard_bytes: int = 128 << 20
    bucket_bytes: int = 64 << 20
    tmp_dir: str | None = None
    protect: list[str] = msgspec.field(default_factory=list)  # prefixes never to write into
    mix_by: str = "tokens"
    min_keep: float = 0.5
    allow_drop: bool = False
    plan_only: bool = False
    tokenizer: str | None = None
    allow_models: bool = False

    @property
    def inputs(self) -> list[tuple[str, str]]:
        """(role, location) of every input in read order: existing first, then add."""
        return [("existing", p) for p in self.existing] + [("add", p) for p in self.add]


def check_config(config: MergeConfig) -> None:
    """Raise ConfigError for values the types allow but merge cannot use."""
    if not config.existing and not config.add:
        raise ConfigError("merge: give at least one input (--existing PATH or --add PATH)")
    if config.format not in FORMATS:
        raise ConfigError(f"--format: {config.format!r}; expected one of {', '.join(FORMATS)}")
    if not 0.0 <= config.eval_fraction < 1.0:
        raise ConfigError(f"--eval-fraction: {config.eval_fraction}; expected 0 <= F < 1")
    if not 0.0 <= config.tolerance < 0.5:
        raise ConfigError(f"--tolerance: {config.tolerance}; expected a fraction in [0, 0.5)")
    if config.mix_by not in MIX_BY:
        raise ConfigError(f"--mix-by: {config.mix_by!r}; expected one of {', '.join(MIX_BY)}")
    if not 0.0 <= config.min_keep <= 1.0:
        raise ConfigError(f"--min-keep: {config.min_keep}; expected a fraction in [0, 1]")
    if config.workers < 0:
        raise ConfigError(f"--workers: {config.workers}; expected >= 0 (0 = automatic)")
    if config.max_repeat < 1:
        raise ConfigError(f"--max-repeat: {config.max_repeat}; expected >= 1")
    if min(config.shard_rows, config.shard_bytes, config.bucket_bytes) < 1:
        raise ConfigError("merge: shard_rows, shard_bytes and bucket_bytes must be >= 1")
    check_shares(config.mix, "--mix")
    if not config.out.strip():
        raise ConfigError("--out: empty output location")
