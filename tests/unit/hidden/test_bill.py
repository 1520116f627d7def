"""The bill: sizes read and printed, the forecast equal to the bytes written, --max-bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.hidden.bill import Bill, check_budget, eta_line, make_bill, parse_size
from draftdata.hidden.writer import SampleRow
from draftdata.hidden.writers import writer_for

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("7TB", 7 * 10**12),
        ("500G", 5 * 10**11),
        ("1.5TiB", int(1.5 * 2**40)),
        ("123", 123),
        ("2 mb", 2 * 10**6),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "seven", "7XB", "-1", "0"])
def test_bad_sizes_name_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--max-bytes"):
        parse_size(text)


def test_the_bill_line() -> None:
    bill = Bill(samples=53120, tokens=171_000_000, layers=4, hidden=5120, dtype="bf16",
                sample_bytes=171_000_000 * 4 * 5120 * 2, extra_bytes=0)  # fmt: skip
    assert bill.line() == "53,120 samples, 171M tokens, 4 layers × 5,120 × bf16 → 7.0 TB"
    with pytest.raises(
        ConfigError, match=r"--max-bytes 5.0 TB: this set would take 7.0 TB \(53,120"
    ):
        check_budget(bill, 5 * 10**12)
    check_budget(bill, 8 * 10**12)
    assert eta_line(41_000, [f"cuda:{i}" for i in range(8)], 171_000_000) == (
        "at the pilot's 41K tok/s on 8 GPUs: 1 h 9 min for the 171M tokens left"
    )


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(["speculators", "specforge"]),
    st.lists(st.integers(1, 400), min_size=1, max_size=30),
)
def test_the_forecast_is_the_bytes_written(fmt: str, lengths: list[int]) -> None:
    w = writer_for(fmt, dtype="bf16")
    bill = make_bill(w, np.asarray(lengths, dtype=np.int64), 4, 64)
    written = 0
    for i, n in enumerate(lengths):
        ids, mask = np.zeros(n, np.int64), np.ones(n, np.int64)
        sample = SampleRow(row=i, id=str(i), input_ids=ids, loss_mask=mask)
        written += len(w.encode(sample, torch.randn(n, 4, 64)))
    assert abs(bill.sample_bytes - written) <= 0.02 * written
    if fmt == "speculators":
        assert bill.sample_bytes == written
