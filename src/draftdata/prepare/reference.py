"""The reference sets prepare checks against: the existing dataset and benchmark exclusions.

``load_existing`` reads the dataset the new prompts will join (any dataset ``draftdata stats``
reads: prompts, conversations, a run), counts its domains with the same classifier ``stats``
uses, and indexes its user text for dedup; or takes the counts from config. ``load_exclusions``
indexes benchmark prompt files (MT-Bench ``turns``, HumanEval ``prompt``, GSM8K ``question``,
chat ``messages``/``conversations``, or plain text, one prompt per line) so they can never
leak into training data. Unreadable files are InputErrors naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftdata.domains import classify_domain
from draftdata.errors import InputError
from draftdata.prepare.config import ExistingConfig
from draftdata.prepare.dedup import EXCLUDED, EXISTING, Deduper, dedup_text
from draftdata.prepare.load import iter_rows
from draftdata.prepare.validate import RowError

_TEXT_KEYS = ("prompt", "question", "query", "instruction", "problem", "input", "text")


def load_existing(
    config: ExistingConfig | None, deduper: Deduper | None
) -> tuple[dict[str, int], int]:
    """(domain -> count of the existing dataset, rows that could not be read as chat).

    ``counts`` in config win for the mix; the rows (when ``path`` is set) are still indexed for
    dedup if ``dedup`` is on.
    """
    if config is None:
        return {}, 0
    counts: dict[str, int] = dict(config.counts or {})
    bad = 0
    if config.path is None:
        return counts, 0
    from draftdata.stats.readers import iter_conversations, open_dataset

    def on_bad(where: str, reason: str) -> None:
        nonlocal bad
        bad += 1

    measured: dict[str, int] = {}
    for conv in iter_conversations(open_dataset(config.path), on_bad):
        if config.counts is None:
            domain = conv.domain or classify_domain(conv.messages, conv.tools)
            measured[domain] = measured.get(domain, 0) + 1
        if deduper is not None and config.dedup:
            deduper.add_reference(dedup_text(conv.messages), EXISTING)
    return (counts if config.counts is not None else measured), bad


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
    from draftdata.prepare.config import SourceConfig

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
