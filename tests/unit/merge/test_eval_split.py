"""merge's eval split is taken before any copy, stratified; train is on the mix (issue 31).

The shape (generated): domains of any sizes and answer lengths (some far short of their target,
so ``--upsample`` copies them), mixed by tokens or rows, with or without ``--upsample``, any
eval fraction. For every case:

- eval holds no copy and no row that has a copy in train, and no row is in both splits;
- eval is stratified over the unique rows kept by a plan on every row: each domain gives eval
  rows in proportion to them (largest remainder of ``F x kept``, all but one of a domain at
  most), ``round(F x N)`` in all;
- the train split, as written, is within ``--tolerance`` of every target, in the mix's unit;
- the printed mix (the report's train counts and tokens, the tables' ``train %``) is the
  train split's, as written.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.merge.test_token_mix import samples

from draftdata.merge.config import MergeConfig
from draftdata.merge.report import mix_rows, token_rows
from draftdata.merge.stage import merge
from draftdata.shared.mix import largest_remainder

MIX = {"code": 0.4, "math": 0.3, "general": 0.3}
SPEC = st.fixed_dictionaries(
    {d: st.tuples(st.integers(8, 160), st.integers(5, 60)) for d in MIX}  # (rows, loss tokens)
)


def _stratified(kept: dict[str, int], fraction: float) -> dict[str, int]:
    """Eval rows per domain: round(F x N) of the N kept, in proportion, all but one at most."""
    total = round(fraction * sum(kept.values()))
    caps = {d: max(n - 1, 0) for d, n in kept.items()}
    return largest_remainder({d: fraction * n for d, n in kept.items()}, total, caps)


def _split(out: Path, name: str) -> list[dict[str, object]]:
    return [r for p in sorted((out / name).glob("*.parquet")) for r in pq.read_table(p).to_pylist()]


@settings(max_examples=30, deadline=None)
@given(
    spec=SPEC,
    upsample=st.booleans(),
    mix_by=st.sampled_from(["tokens", "rows"]),
    fraction=st.sampled_from([0.05, 0.1, 0.2]),
    seed=st.integers(0, 100),
)
def test_eval_is_a_stratified_split_before_copies_and_train_is_on_the_mix(
    spec: dict[str, tuple[int, int]], upsample: bool, mix_by: str, fraction: float, seed: int
) -> None:
    tolerance = 0.02
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = samples(root / "in", spec, "e", seed)
        s = merge(
            MergeConfig(
                add=[str(src)],
                out=str(root / "o"),
                mix=MIX,
                mix_by=mix_by,
                upsample=upsample,
                max_repeat=8,
                tolerance=tolerance,
                eval_fraction=fraction,
                seed=seed,
                allow_drop=True,
            )
        )
        train, evals = _split(root / "o", "train"), _split(root / "o", "eval")
    report = s.report
    copy = re.compile(r"~+r[0-9]+\Z")
    eval_ids = {str(r["id"]) for r in evals}
    train_ids = [str(r["id"]) for r in train]
    assert not any(copy.search(i) for i in eval_ids)
    assert not eval_ids & {copy.sub("", i) for i in train_ids}  # nor a row copied in train
    # stratified over the unique rows a plan on every row keeps, before the train plan
    held = report.plan.eval
    assert held.of_rows == sum(held.kept.values())
    want = _stratified(held.kept, fraction)
    by_domain = Counter(str(r["domain"]) for r in evals)
    assert dict(by_domain) == {d: n for d, n in want.items() if n} == held.rows
    if not train:
        return
    # the train split, as written, is on the mix in the mix's unit
    unit = report.plan.unit
    per: Counter[str] = Counter()
    for r in train:
        per[str(r["domain"])] += int(r["num_loss_tokens"]) if unit == "loss_tokens" else 1
    total = sum(per.values())
    for d, t in MIX.items():
        assert abs(per[d] / total - t) <= tolerance + 1e-9, (d, per, unit)
    # the printed mix is the train split's, as written
    rows_written = Counter(str(r["domain"]) for r in train)
    assert report.after.train == dict(sorted(rows_written.items()))
    tokens_written = Counter()
    for r in train:
        tokens_written[str(r["domain"])] += int(r["num_loss_tokens"])
    assert report.tokens.after.train == dict(sorted(tokens_written.items()))
    table = {r[0]: r for r in mix_rows(report)}
    n = sum(rows_written.values())
    for d in MIX:
        assert table[d][-1] == f"{100 * rows_written[d] / n:.1f}%"
    toks = {r[0]: r for r in token_rows(report)}
    t_all = sum(tokens_written.values())
    for d in MIX:
        assert toks[d][-1] == f"{100 * tokens_written[d] / t_all:.1f}%"


def test_the_issue_case_eval_is_not_one_domain_and_train_hits_the_token_target() -> None:
    """code far short of its 10% of tokens, upsampled; 5% eval: before the fix eval came only
    from rows without a copy (one domain) and train missed the target."""
    mix = {"code": 0.1, "math": 0.45, "general": 0.45}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = samples(root / "in", {"code": (40, 20), "math": (400, 40), "general": (400, 40)}, "i")
        s = merge(
            MergeConfig(
                add=[str(src)],
                out=str(root / "o"),
                mix=mix,
                upsample=True,
                tolerance=0.005,
                eval_fraction=0.05,
                allow_drop=True,
            )
        )
        train, evals = _split(root / "o", "train"), _split(root / "o", "eval")
    assert len(Counter(r["domain"] for r in evals)) == 3
    per = Counter()
    for r in train:
        per[str(r["domain"])] += int(r["num_loss_tokens"])
    assert abs(per["code"] / sum(per.values()) - 0.1) <= 0.005 + 1e-9
    held = s.report.plan.eval
    assert Counter(str(r["domain"]) for r in evals) == _stratified(held.kept, 0.05)
