"""Which samples are verified, and the one line a failed verification gives."""

from __future__ import annotations

import pytest

from draftdata.hidden.verify import SampleCheck, choose_rows, layer_sums, summarise

torch = pytest.importorskip("torch")


def test_the_most_padded_half_and_a_random_half() -> None:
    written = {r: 0.0 for r in range(100)}
    written.update({7: 0.9, 42: 0.8, 3: 0.5, 99: 0.1})
    rows = choose_rows(written, [], 8)
    assert len(rows) == 8 and {7, 42, 3, 99} <= set(rows)
    assert choose_rows({}, list(range(5)), 8) == [0, 1, 2, 3, 4]
    assert choose_rows(written, [], 0) == []


def test_a_difference_beyond_tolerance_is_named() -> None:
    ref = torch.randn(20, 3, 16)
    ok = SampleCheck(row=1, mismatch=None, layers=layer_sums(ref + 1e-4, ref))
    bad = SampleCheck(row=2, mismatch=None, layers=layer_sums(ref.roll(1, dims=0), ref))
    v, fp8, failure = summarise([ok], ["2", "4", "8 (pre_norm)"], 0.02)
    assert v.passed and failure is None and fp8 is None
    v, _, failure = summarise([ok, bad], ["2", "4", "8 (pre_norm)"], 0.02)
    assert not v.passed and failure is not None
    assert "over the 2.0% tolerance" in failure and "sample row 2" in failure
    ids = SampleCheck(row=3, mismatch="token ids differ from the sample's")
    _, _, failure = summarise([ok, ids], ["2", "4", "8 (pre_norm)"], 0.02)
    assert failure == "sample row 3: token ids differ from the sample's"
