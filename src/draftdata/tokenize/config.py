"""Settings and results of the tokenize stage: ``TokenizeConfig`` in, ``TokenizeSummary`` out.

Both are plain msgspec Structs (picklable, JSON-ready). ``TokenizeConfig.validate`` turns a bad
value into a ConfigError naming the option. The default output is ``<RUN_URL>/tokenized/``: the
samples sit beside the completions they came from, and the store's create-only writes make a
rerun with the same inputs and settings a no-op (identical bytes) and a rerun with other
settings a refusal (choose another ``--out``).

This module holds values only; ``stage.py`` runs the stage.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from draftdata.errors import ConfigError

LongPolicy = Literal["truncate", "drop"]

TOKENIZED_PREFIX = "tokenized"
MIN_LOSS_RUN = 2  # a DFlash-style drafter needs an anchor token and the next one, both with loss
DEFAULT_BATCH_ROWS = 256
MAX_MISMATCH_EXAMPLES = 5


class TokenizeConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Everything ``tokenize`` needs.

    ``run`` is the run's URL (local folder or ``s3://``), or a chat dataset's (conversation
    files: SpecForge, ShareGPT or OpenAI rows; ``tokenize/conversations.py``); ``input`` is
    what it holds (``run``, ``conversations`` or ``prompts``; None: found by ``stage.plan``).
    ``tokenizer`` a Hugging Face tokenizer
    folder; ``chat_template`` an optional template file overriding the tokenizer's. ``out``
    defaults to ``<run>/tokenized``. ``max_length`` None means no limit. ``verify`` renders and
    encodes completions that carry server token ids to check them (off: the token-id path needs
    no encoding at all). ``keep_reasoning_history`` says whether the engine sent earlier turns'
    reasoning back in the history (None: read it from the run's manifest, else False).
    ``server_thinking`` is the servers' default thinking mode as the user states it, for
    answers of a run whose requests left the mode to the servers and whose mode the run cannot
    tell (``thinking.py``; None: such answers are dropped and counted).
    ``batch_rows`` completions are tokenized per batch and written per output shard.
    ``protect``: prefixes the output may not equal, contain or lie inside (like generate's).
    """

    run: str
    tokenizer: str
    chat_template: str | None = None
    max_length: int | None = None
    long: LongPolicy = "truncate"
    out: str | None = None
    workers: int = 1
    verify: bool = True
    keep_reasoning_history: bool | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    server_thinking: bool | None = None
    protect: list[str] = msgspec.field(default_factory=list)  # prefixes never to write into
    input: str | None = None  # run, conversations or prompts (None: found by stage.plan)

    def validate(self) -> TokenizeConfig:
        """Check every value; ConfigError naming the option on the first bad one."""
        if not self.run:
            raise ConfigError("tokenize: RUN_URL is empty")
        if not self.tokenizer:
            raise ConfigError("--tokenizer: give a Hugging Face tokenizer folder")
        if self.max_length is not None and self.max_length < MIN_LOSS_RUN + 1:
            raise ConfigError(f"--max-length: {self.max_length}; must be at least 3")
        if self.long not in ("truncate", "drop"):
            raise ConfigError(f"--long: {self.long!r}; use truncate or drop")
        if self.workers < 1:
            raise ConfigError(f"--workers: {self.workers}; must be at least 1")
        if self.batch_rows < 1:
            raise ConfigError(f"--batch-rows: {self.batch_rows}; must be at least 1")
        return self

    @property
    def out_url(self) -> str:
        """Where the samples go: ``out``, else ``<run>/tokenized``; for conversation files,
        a folder beside them, ``<file or folder without extension>-tokenized`` (never inside
        a chat dataset, where its parquet would be read as the dataset's rows next time)."""
        if self.out:
            return self.out
        base = self.run.rstrip("/")
        if self.input in ("conversations", "prompts"):
            head, _, name = base.rpartition("/")
            for ext in (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet"):
                if name.endswith(ext) and len(name) > len(ext):
                    name = name[: -len(ext)]
                    break
            return f"{head}/{name}-tokenized" if head else f"{name}-tokenized"
        return f"{base}/{TOKENIZED_PREFIX}"


class DomainTotals(msgspec.Struct, kw_only=True):
    """Token totals of one domain."""

    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0


class TokenizeSummary(msgspec.Struct, kw_only=True):
    """What a tokenize run did; ``summary.json`` holds all of it except ``wall_s``.

    ``counts`` are the stage's counters: ``completions``, ``samples``, ``truncated``,
    ``path.token_ids`` / ``path.rendered``, ``verified`` (of which ``verified.noncanonical``,
    ``verified.other_end`` and ``verified.decoded``, with ``reasoning.unclosed``: see
    ``encode.py``), ``mismatched`` (dropped as ``dropped.unverified_ids``),
    ``unverifiable``, ``end.other_token`` / ``end.no_token`` (served outputs that stopped without
    the template's end-of-turn token), ``thinking_off_from_served_ids``, ``split_turns``
    (completions emitted as per-turn samples), ``dropped.<reason>`` (samples) and
    ``duplicates`` (completions whose (id, sample) an earlier shard holds too, a copied shard:
    counted in completions, as export and stats count them, never in the samples' shares).
    ``models``: the target models that answered the run (``merge`` refuses to mix two).
    """

    out: str
    shards: int = 0
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    domains: dict[str, DomainTotals] = msgspec.field(default_factory=dict)
    mismatches: list[str] = msgspec.field(default_factory=list)
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    # the target models that answered the run (its completions' ``model``; [] when not a run)
    models: list[str] = msgspec.field(default_factory=list)
    wall_s: float = 0.0

    def count(self, name: str) -> int:
        """One counter (0 when never counted)."""
        return self.counts.get(name, 0)

    @property
    def dropped(self) -> dict[str, int]:
        """Drop reasons and their counts."""
        return {k[8:]: v for k, v in sorted(self.counts.items()) if k.startswith("dropped.")}
