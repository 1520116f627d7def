"""Exact and near-duplicate detection: recall on planted near-duplicates, reference groups."""

from __future__ import annotations

import random

from draftdata.prepare.config import DedupConfig
from draftdata.prepare.dedup import DUPLICATE_KINDS, EXCLUDED, EXISTING, Deduper, dedup_text
from draftdata.records import Message

_WORDS = [f"w{i}" for i in range(3000)]


def _doc(rng: random.Random, n: int = 120) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _perturb(rng: random.Random, text: str) -> str:
    words = text.split()
    for _ in range(2):  # two substitutions, a case change and extra spacing
        words[rng.randrange(len(words))] = rng.choice(_WORDS)
    words[0] = words[0].upper()
    return "  ".join(words) + " !"


def test_planted_near_duplicates_recall_and_precision() -> None:
    rng = random.Random(7)
    originals = [_doc(rng) for _ in range(400)]
    planted = [_perturb(rng, originals[i]) for i in range(0, 400, 4)]
    d = Deduper(DedupConfig(threshold=0.8))
    kinds = [d.check_add(t) for t in originals]
    assert kinds.count(None) == 400  # no false positives among distinct random texts
    found = [d.check_add(t) for t in planted]
    recall = sum(k == "near" for k in found) / len(planted)
    assert recall >= 0.95


def test_exact_after_normalising() -> None:
    d = Deduper(DedupConfig(near=False))
    assert d.check_add("Hello   World") is None
    assert d.check_add("hello world") == "exact"
    assert d.check_add("hello world!") is None


def test_exact_off_still_catches_near() -> None:
    d = Deduper(DedupConfig(exact=False, threshold=0.8))
    text = _doc(random.Random(1))
    assert d.check_add(text) is None
    assert d.check_add(text) == "near"


def test_existing_and_excluded_groups() -> None:
    rng = random.Random(3)
    existing, bench = _doc(rng), _doc(rng)
    d = Deduper(DedupConfig())
    d.add_reference(existing, EXISTING)
    d.add_reference(bench, EXCLUDED)
    d.add_reference("   ", EXCLUDED)  # ignored
    assert d.check_add(existing) == "existing_exact"
    assert d.check_add(_perturb(rng, existing)) == "existing_near"
    assert d.check_add(bench.upper()) == "excluded_exact"
    assert d.check_add(_perturb(rng, bench)) == "excluded_near"
    assert set(DUPLICATE_KINDS) == {
        "exact", "near", "existing_exact", "existing_near", "excluded_exact", "excluded_near"
    }  # fmt: skip


def test_short_texts_and_threshold() -> None:
    strict = Deduper(DedupConfig(threshold=1.0))
    assert strict.check_add("what is the capital of france") is None
    assert strict.check_add("what is the capital of spain") is None
    loose = Deduper(DedupConfig(threshold=0.5, ngram=1))
    assert loose.check_add("what is the capital of france") is None
    assert loose.check_add("what is the capital of spain") == "near"


def test_dedup_text_ignores_system_and_assistant() -> None:
    msgs = [
        Message(role="system", content="boilerplate"),
        Message(role="user", content="U"),
        Message(role="assistant", content="A"),
        Message(role="tool", content="T"),
    ]
    assert dedup_text(msgs) == "U\nT"
