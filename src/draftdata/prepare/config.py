"""The prepare stage's configuration: sources, dedup, mix and output settings.

A prepare config is YAML read by ``draftdata.support.config.load_config`` into ``PrepareConfig``; an
unknown or mistyped key is a ConfigError naming the key. Relative paths in a config are resolved
against the config file's folder (``resolve_paths``), so an example config works from any
working directory. This module holds no logic beyond checking values that YAML types cannot.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec

from draftdata.errors import ConfigError
from draftdata.shared.domains import DOMAINS
from draftdata.shared.mix import check_domains, check_shares, sum_warning
from draftdata.support.config import Namer, in_file

SCHEMAS = (
    "infinity_instruct",
    "webinstruct",
    "codefeedback",
    "metamath",
    "hermes_fc",
    "agentinstruct",
    "sharegpt",
    "openai",
    "alpaca",
    "question_answer",
    "query_response",
)
PROMPT_MODES = ("last_assistant", "regenerate")
MIX_BY = ("auto", "rows", "tokens")


class SourceConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One input dataset: where it is, which adapter reads it, its domain and its limits.

    Exactly one of ``path`` (a local file or glob, or an ``s3://`` URL; jsonl, json or parquet)
    and ``hub`` (a Hugging Face dataset id, with ``hub_config`` and ``split``) is given.
    ``take`` fixes the number of prompts taken from this source (the planner works around it);
    ``max_take`` caps what the planner may take; ``max_rows`` stops reading after that many rows.
    """

    name: str
    schema: str
    path: str | None = None
    hub: str | None = None
    hub_config: str | None = None
    split: str = "train"
    format: str | None = None
    domain: str = "auto"
    take: int | None = None
    max_take: int | None = None
    max_rows: int | None = None
    prompt_mode: str | None = None


class ExistingConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The dataset the new prompts join: its domain counts, and optionally its rows for dedup.

    ``counts`` gives domain -> rows directly; otherwise ``path`` (jsonl/json/parquet rows with
    ``messages`` or ``conversations``) is read and classified the way ``draftdata stats`` does.
    With ``dedup: true`` (the default) new prompts that duplicate an existing row are dropped.
    """

    path: str | None = None
    counts: dict[str, int] | None = None
    dedup: bool = True


class DedupConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Exact and near-duplicate removal; ``exclude`` lists files of benchmark prompts.

    Near-duplicates are judged by MinHash Jaccard >= ``threshold`` over word ``ngram`` shingles
    of the normalised user text. Unigrams (the default) suit prompts, which are short: two
    changed words in a 40-word prompt keep a unigram Jaccard near 0.9 but drop a 3-gram one to
    ~0.7. Raise ``ngram`` (e.g. 3) for long documents or templated sources where word order
    carries the difference. ``bucket_cap`` bounds the prompts an LSH band bucket keeps (see
    ``prepare.dedup``): the work per prompt stays bounded on templated text, and below the
    cap the result is the same as checking every prompt that shares a band.
    """

    exact: bool = True
    near: bool = True
    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 1
    bucket_cap: int = 1024
    exclude: list[str] = msgspec.field(default_factory=list)


class PrepareConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Everything ``prepare`` needs: sources, budget and target mix, dedup, output.

    ``budget`` is the number of new prompts to take (None: every usable prompt, or the sum of
    fixed ``take`` values when all sources have one). ``mix`` maps domain -> target share of the
    combined (existing + new) set; shares are normalised to sum to 1. They are shares of rows,
    or with ``mix_by: tokens`` of the expected loss tokens (``lengths``: a pilot's forecast).
    ``prompt_mode`` picks how a conversation becomes a prompt: ``last_assistant`` (everything
    before the last assistant turn) or ``regenerate`` (system, user and tool turns with the
    assistant answers dropped; a tool-calling turn stays as its calls alone, so each user turn
    and tool result is answered).
    """

    sources: list[SourceConfig]
    out: str = "prompts"
    seed: int = 0
    budget: int | None = None
    mix: dict[str, float] = msgspec.field(default_factory=dict)
    existing: ExistingConfig | None = None
    dedup: DedupConfig = msgspec.field(default_factory=DedupConfig)
    prompt_mode: str = "last_assistant"
    max_chars: int = 32_000
    shard_size: int = 50_000
    keep_original: bool = True
    # what the mix's shares count (prepare/lengths.py): rows, tokens (expected loss tokens), or
    # auto (tokens when ``lengths`` is given, else rows)
    mix_by: str = "auto"
    lengths: str | None = None  # a pilot's forecast.json (or its run folder), local or s3://
    # prompts per domain held out as an evaluation split (eval/), never generated (stage.py)
    holdout: int = 0


def check(config: PrepareConfig, where: str | Namer = "config") -> None:
    """Reject values the types allow but prepare cannot use, naming the key (``where``: the
    file, or how the command names a setting: ``config.Origins.name``, its flag for a flag's
    value)."""
    name = in_file(where) if isinstance(where, str) else where
    if not config.sources:
        raise ConfigError(f"{name('sources')}: at least one source is needed")
    names: set[str] = set()
    for i, s in enumerate(config.sources):
        key = f"sources.{i}"
        if not s.name or "/" in s.name:
            raise ConfigError(f"{name(key + '.name')}: give a non-empty name without '/'")
        if s.name in names:
            raise ConfigError(f"{name(key + '.name')}: {s.name!r} is used by two sources")
        names.add(s.name)
        if s.schema not in SCHEMAS:
            raise ConfigError(
                f"{name(key + '.schema')}: {s.schema!r} is not one of {', '.join(SCHEMAS)}"
            )
        if (s.path is None) == (s.hub is None):
            raise ConfigError(f"{name(key)}: give exactly one of path and hub")
        if s.format is not None and s.format not in ("jsonl", "json", "parquet"):
            raise ConfigError(
                f"{name(key + '.format')}: {s.format!r} is not one of jsonl, json, parquet"
            )
        if s.prompt_mode is not None and s.prompt_mode not in PROMPT_MODES:
            raise ConfigError(
                f"{name(key + '.prompt_mode')}: expected one of {', '.join(PROMPT_MODES)}"
            )
        for field in ("take", "max_take", "max_rows"):
            value = getattr(s, field)
            if value is not None and value < 0:
                raise ConfigError(f"{name(f'{key}.{field}')}: must be >= 0")
    if config.prompt_mode not in PROMPT_MODES:
        raise ConfigError(f"{name('prompt_mode')}: expected one of {', '.join(PROMPT_MODES)}")
    if config.budget is not None and config.budget < 0:
        raise ConfigError(f"{name('budget')}: must be >= 0")
    check_shares(config.mix, name("mix"))
    if not 0.0 < config.dedup.threshold <= 1.0:
        raise ConfigError(f"{name('dedup.threshold')}: must be in (0, 1]")
    if config.dedup.num_perm < 16 or config.dedup.ngram < 1:
        raise ConfigError(f"{name('dedup')}: num_perm must be >= 16 and ngram >= 1")
    if config.dedup.bucket_cap < 1:
        raise ConfigError(f"{name('dedup.bucket_cap')}: must be >= 1 (default 1024)")
    if config.mix_by not in MIX_BY:
        raise ConfigError(f"{name('mix_by')}: {config.mix_by!r}; use {', '.join(MIX_BY)}")
    if config.holdout < 0:
        raise ConfigError(f"{name('holdout')}: must be >= 0")
    if config.shard_size < 1 or config.max_chars < 1:
        raise ConfigError(f"{name('shard_size')} and max_chars must be >= 1")


def _resolve(value: str | None, base: Path) -> str | None:
    if value is None or "://" in value or Path(value).is_absolute():
        return value
    return str(base / value)


def resolve_paths(config: PrepareConfig, base: Path) -> PrepareConfig:
    """Return ``config`` with relative local paths (sources, existing, exclude, lengths) made
    absolute against ``base`` (the config file's folder). ``out`` is left to the caller."""
    sources = [msgspec.structs.replace(s, path=_resolve(s.path, base)) for s in config.sources]
    existing = config.existing
    if existing is not None:
        existing = msgspec.structs.replace(existing, path=_resolve(existing.path, base))
    dedup = msgspec.structs.replace(
        config.dedup, exclude=[_resolve(p, base) or p for p in config.dedup.exclude]
    )
    return msgspec.structs.replace(
        config,
        sources=sources,
        existing=existing,
        dedup=dedup,
        lengths=_resolve(config.lengths, base),
    )


def check_mix_domains(config: PrepareConfig, existing: Iterable[str] = ()) -> None:
    """Refuse a ``mix`` key that is no domain the prompts can have (not one of the classifier's,
    a source's fixed ``domain``, the existing set's ``counts`` or ``existing``: the domains its
    rows were found to hold), as ``merge --mix`` refuses one: a typo like ``kode`` would get no
    prompts while the other domains share its part."""
    known = set(DOMAINS) | {s.domain for s in config.sources if s.domain != "auto"}
    if config.existing is not None and config.existing.counts:
        known |= set(config.existing.counts)
    check_domains(config.mix, known | set(existing), "mix", "or drop it from the mix")


def mix_warnings(config: PrepareConfig) -> list[str]:
    """One line when the ``mix`` shares do not sum to 1 (they are normalised), for the CLI to
    print before the work starts."""
    warning = sum_warning(config.mix, "mix:")
    return [] if warning is None else [warning]
