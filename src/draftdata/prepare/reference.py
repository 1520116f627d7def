"""The reference sets prepare checks against: the existing dataset and benchmark exclusions.

``load_existing`` reads the dataset the new prompts will join (any dataset ``draftdata stats``
reads: prompts, conversations, a run), counts its domains with the same classifier ``stats``
uses, measures the loss tokens of its answers (for a mix in tokens), and indexes its user text
for dedup; or takes the counts from config. ``load_exclusions``
indexes benchmark prompt files (MT-Bench ``turns``, HumanEval ``prompt``, GSM8K ``question``,
chat ``messages``/``conversations``, or plain text, one prompt per line) so they can never
leak into training data. Unreadable files are InputErrors naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from draftdata.errors import InputError, RowError
from draftdata.prepare.config import ExistingConfig, SourceConfig
from draftdata.prepare.dedup import EXCLUDED, EXISTING, Deduper, dedup_text
from draftdata.prepare.load import iter_rows
from draftdata.shared.domains import classify_domain
from draftdata.shared.tokens import conversation_tokens
from draftdata.stats.readers import iter_conversations, open_dataset

_TEXT_KEYS = ("prompt", "question", "query", "instruction", "problem", "input", "text")


class Existing(msgspec.Struct, kw_only=True):
    """What prepare knows of the existing dataset: rows per domain (for the mix), the loss
    tokens of its answers per domain (estimated, ``draftdata.shared.tokens``; empty when it has none
    or only ``counts`` are given), how many rows carry an answer, and unreadable rows."""

    counts: dict[str, int] = msgspec.field(default_factory=dict)
    loss_tokens: dict[str, float] = msgspec.field(default_factory=dict)
    answered: dict[str, int] = msgspec.field(default_factory=dict)
    bad: int = 0

    @property
    def has_answers(self) -> bool:
        """Whether the dataset's rows carry answers (assistant turns) to measure."""
        return any(self.answered.values())


_TOKEN_BATCH = 2048  # conversations counted at once (the estimate is vectorised)


def load_existing(config: ExistingConfig | None, deduper: Deduper | None) -> Existing:
    """The existing dataset's domain counts (``counts`` in config win for the mix), and the
    loss tokens of its answers per domain; its rows (when ``path`` is set) are indexed for
    dedup if ``dedup`` is on."""
    if config is None:
        return Existing()
    out = Existing(counts=dict(config.counts or {}))
    if config.path is None:
        return out

    def on_bad(where: str, reason: str) -> None:
        out.bad += 1

    measured: dict[str, int] = {}
    batch: list[tuple[str, Any]] = []  # (domain, (messages, tools))

    def count_tokens() -> None:
        _, loss = conversation_tokens([c for _, c in batch])
        for (domain, _), n in zip(batch, loss.tolist(), strict=True):
            if n > 0:
                out.loss_tokens[domain] = out.loss_tokens.get(domain, 0.0) + n
                out.answered[domain] = out.answered.get(domain, 0) + 1
        batch.clear()

    for conv in iter_conversations(open_dataset(config.path), on_bad):
        domain = conv.domain or classify_domain(conv.messages, conv.tools)
        measured[domain] = measured.get(domain, 0) + 1
        if any(m.role == "assistant" for m in conv.messages):
            batch.append((domain, (conv.messages, conv.tools)))
            if len(batch) >= _TOKEN_BATCH:
                count_tokens()
        if deduper is not None and config.dedup:
            deduper.add_reference(dedup_text(conv.messages), EXISTING)
    if batch:
        count_tokens()
    if config.counts is None:
        out.counts = measured
    return out


def _texts_of(row: Any) -> list[str]:
    if isinstance(row, str):
        return [row]
    if not isinstance(row, dict):
        return []
    for key in ("messages", "conversations"):
        turns = row.get(key)
        if isinstance(turns, list):
            out = []
            for t in turns:
                if not isinstance(t, dict):
                    continue
                role = str(t.get("role", t.get("from", ""))).lower()
                text = t.get("content", t.get("value"))
                if role in ("user", "human") and isinstance(text, str):
                    out.append(text)
            return ["\n".join(out)] if out else []
    turns = row.get("turns")  # MT-Bench: every user turn; the first alone is also excluded
    if isinstance(turns, list) and all(isinstance(t, str) for t in turns) and turns:
        return [turns[0], "\n".join(turns)]
    for key in _TEXT_KEYS:
        if isinstance(row.get(key), str):
            return [row[key]]
    return []


def load_exclusions(files: list[str], deduper: Deduper) -> int:
    """Index every prompt of the exclusion ``files``; return how many were indexed."""

    n = 0
    for path in files:
        if path.endswith(".txt"):
            try:
                lines = Path(path).read_text(encoding="utf-8-sig").splitlines()  # BOM skipped
            except (OSError, UnicodeDecodeError) as exc:
                raise InputError(f"exclusion list {path}: cannot read ({exc})") from exc
            for line in lines:
                if line.strip():
                    deduper.add_reference(line, EXCLUDED)
                    n += 1
            continue
        source = SourceConfig(name=f"exclude:{Path(path).name}", schema="openai", path=path)
        for _, row in iter_rows(source):
            if isinstance(row, RowError):
                continue
            for text in _texts_of(row):
                deduper.add_reference(text, EXCLUDED)
                n += 1
    return n
