"""Exact and near-duplicate detection: recall on planted near-duplicates, reference groups, and
the batched numpy index against the one-text-at-a-time implementations (``dedup_oracles``)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.prepare.dedup_oracles import CappedModel, OldDeduper

from draftdata.prepare.config import DedupConfig
from draftdata.prepare.dedup import (
    DUPLICATE_KINDS,
    EXCLUDED,
    EXISTING,
    Deduper,
    _bands,
    dedup_text,
)
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


# -- the batched index against the one-text-at-a-time rules ------------------------------------


def _corpus(
    seed: int, n: int, vocab: int, templates: int, fixed: float, families: int = 0
) -> list[str]:
    """Random texts shaped like real sources: near-duplicate families (substitutions, case,
    spacing, a word dropped or added), exact copies, templated rows (``templates`` templates
    of which a ``fixed`` share of the words is shared by every row of the template), short,
    empty and unrelated texts. ``families`` > 0 plants that many copies of a few rows."""
    rng = random.Random(seed)
    words = [f"v{i}" for i in range(vocab)]
    shapes = [
        [rng.choice(words) if rng.random() < fixed else "" for _ in range(rng.randint(3, 40))]
        for _ in range(templates)
    ]
    texts: list[str] = []
    for _ in range(n):
        r = rng.random()
        if texts and r < 0.2:
            w = rng.choice(texts).split() or [""]
            for _ in range(rng.randint(0, 3)):
                w[rng.randrange(len(w))] = rng.choice(words)
            if rng.random() < 0.3:
                w.insert(rng.randrange(len(w) + 1), rng.choice(words))
            if len(w) > 1 and rng.random() < 0.3:
                w.pop(rng.randrange(len(w)))
            if rng.random() < 0.5:
                w[0] = w[0].upper()
            texts.append((" " * rng.randint(1, 3)).join(w))
        elif texts and r < 0.27:
            texts.append(rng.choice(texts).upper())
        elif shapes and r < 0.75:
            shape = rng.choice(shapes)
            texts.append(" ".join(w or rng.choice(words) for w in shape))
        elif r < 0.78:
            texts.append(rng.choice(["", "   ", "\n", "a", "ok ok"]))
        else:
            texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))))
    for _ in range(families):
        texts.extend([rng.choice(texts)] * rng.randint(2, 5))
    return texts


_CONFIGS = st.builds(
    DedupConfig,
    exact=st.booleans(),
    near=st.booleans(),
    threshold=st.sampled_from([0.5, 0.7, 0.8, 0.9, 1.0]),
    num_perm=st.sampled_from([16, 24, 32, 64, 100, 128]),
    ngram=st.integers(1, 3),
)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[DedupConfig, list[str], list[tuple[str, int]]]:
    config = draw(_CONFIGS)
    texts = _corpus(
        seed=draw(st.integers(0, 2**32 - 1)),
        n=draw(st.integers(0, 160)),
        vocab=draw(st.sampled_from([12, 60, 400, 5000])),
        templates=draw(st.integers(0, 4)),
        fixed=draw(st.sampled_from([0.5, 0.7, 0.9])),
    )
    refs = []
    for text in draw(st.lists(st.sampled_from(texts), max_size=8)) if texts else []:
        refs.append((text, draw(st.sampled_from([EXISTING, EXCLUDED]))))
    return config, texts, refs


def _run(dedup: object, texts: list[str], refs: list[tuple[str, int]]) -> list[str | None]:
    for text, group in refs:
        dedup.add_reference(text, group)  # type: ignore[attr-defined]
    return [dedup.check_add(t) for t in texts]  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(case=_cases(), batch=st.integers(1, 200))
def test_same_verdicts_as_the_old_implementation(
    case: tuple[DedupConfig, list[str], list[tuple[str, int]]], batch: int
) -> None:
    """Below the bucket cap, every text gets the verdict the old implementation (rensa LSH,
    one Jaccard per candidate, row by row) gives: random near-duplicate families, templated
    text, copies, empty texts and reference sets, in batches of any size."""
    config, texts, refs = case
    old = _run(OldDeduper(config), texts, refs)
    new = Deduper(config, bucket_cap=10**9, batch=batch)
    for text, group in refs:
        new.add_reference(text, group)
    assert new.check_many(texts) == old
    new.close()


@settings(max_examples=60, deadline=None)
@given(case=_cases(), batch=st.integers(1, 200), cap=st.sampled_from([1, 2, 3, 4, 5, 6, 9, 30]))
def test_bucket_cap_follows_the_simple_rule(
    case: tuple[DedupConfig, list[str], list[tuple[str, int]]], batch: int, cap: int
) -> None:
    """With buckets capped (tiny caps, so they fill), the batched numpy index gives the verdicts
    of the plain rule "a band bucket keeps its first ``cap`` rows", for any batch size."""
    config, texts, refs = case
    model = _run(CappedModel(config, cap), texts, refs)
    new = Deduper(config, bucket_cap=cap, batch=batch)
    for text, group in refs:
        new.add_reference(text, group)
    assert new.check_many(texts) == model
    new.close()


def test_default_cap_matches_old_on_a_templated_corpus() -> None:
    """Templated text big enough to fill buckets past the default cap: the same verdicts."""
    texts = _corpus(seed=11, n=3000, vocab=300, templates=3, fixed=0.7, families=50)
    config = DedupConfig(threshold=0.8)
    new = Deduper(config)
    assert new.check_many(texts) == _run(OldDeduper(config), texts, [])


def _templated(
    seed: int, n: int, templates: int = 4
) -> tuple[list[str], list[int]]:  # (texts, planted copies)
    """Rows filling a few fixed templates (28 shared words, 12 random: ~0.55 alike, not
    duplicates), with 10% planted near-duplicates of earlier rows."""
    rng = random.Random(seed)
    shapes = [
        [rng.choice(_WORDS) if k % 10 < 7 else "" for k in range(40)] for _ in range(templates)
    ]
    texts: list[str] = []
    planted: list[int] = []
    for i in range(n):
        if i > 10 and rng.random() < 0.1:
            planted.append(i)
            texts.append(_perturb(rng, texts[rng.randrange(i)]))
        else:
            texts.append(" ".join(w or rng.choice(_WORDS) for w in rng.choice(shapes)))
    return texts, planted


def test_recall_on_planted_near_duplicates_in_templated_text() -> None:
    """Template families larger than the bucket cap (a tight one here, 8, and the default):
    at least the old implementation's recall on the planted near-duplicates, and no more
    originals dropped. A planted copy shares bands with its original beyond the template's,
    and those buckets are small."""
    texts, planted = _templated(seed=3, n=6000)
    config = DedupConfig(threshold=0.8)
    old = _run(OldDeduper(config), texts, [])
    originals = sorted(set(range(len(texts))) - set(planted))

    def recall(kinds: list[str | None]) -> float:
        return sum(kinds[i] is not None for i in planted) / len(planted)

    def dropped(kinds: list[str | None]) -> int:
        return sum(kinds[i] is not None for i in originals)

    assert recall(old) >= 0.95
    for cap in (8, None):
        new = Deduper(config, bucket_cap=cap).check_many(texts)
        assert recall(new) >= recall(old)
        assert dropped(new) <= dropped(old)


def test_work_per_text_stays_bounded_as_a_template_family_grows() -> None:
    """The defect: on templated text every new row was compared with every earlier row of
    its template that shared a band, so the work per row grew with the index (quadratic in
    all: 2M rows took 30x the time of 200K). Now a band bucket keeps ``bucket_cap`` rows: the
    work per row creeps up only while more of a template's buckets fill, and never passes
    bands x cap. Measured on the second half of the rows (the work once the index is big)."""
    config, cap = DedupConfig(threshold=0.8), 32
    per_row: dict[str, list[float]] = {"old": [], "new": []}
    for n in (1000, 4000):
        texts, _ = _templated(seed=5, n=n, templates=1)
        for name, dedup in (("old", OldDeduper(config)), ("new", Deduper(config, bucket_cap=cap))):
            _run(dedup, texts[: n // 2], [])
            before = dedup.compared  # type: ignore[attr-defined]
            if isinstance(dedup, Deduper):
                dedup.check_many(texts[n // 2 :])
            else:
                _run(dedup, texts[n // 2 :], [])
            per_row[name].append((dedup.compared - before) / (n - n // 2))  # type: ignore[attr-defined]
    assert per_row["old"][1] > 3 * per_row["old"][0]  # the old growth, for the record
    assert per_row["new"][1] < 1.5 * per_row["new"][0]
    assert max(per_row["new"]) <= _bands(0.8, 128) * cap


def test_batches_and_order_are_deterministic() -> None:
    """Same texts in the same order: the same verdicts whatever the batch size, run after run."""
    texts = _corpus(seed=21, n=1500, vocab=200, templates=2, fixed=0.7, families=30)
    config = DedupConfig(threshold=0.7, ngram=2)
    runs = {tuple(Deduper(config, batch=b, bucket_cap=4).check_many(texts)) for b in (1, 97, 4096)}
    runs.add(tuple(Deduper(config, batch=97, bucket_cap=4).check_many(texts)))
    assert len(runs) == 1


def test_closed_deduper_refuses_work() -> None:
    d = Deduper(DedupConfig())
    assert d.check_many(["one text", "another text entirely"]) == [None, None]
    d.close()
    with pytest.raises(RuntimeError, match="closed"):
        d.check_add("one text")
