"""The trainers' file formats: what a file holds comes back exactly, names map to rows and
back, and the bill's size of a file is the size written."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.hidden.writer import SampleRow, dequantize_fp8, quantize_fp8
from draftdata.hidden.writers import writer_for

torch = pytest.importorskip("torch")

CASES = [
    ("speculators", "bf16", "none"),
    ("speculators", "fp16", "none"),
    ("speculators", "fp32", "none"),
    ("speculators", "fp8", "none"),
    ("specforge", "bf16", "none"),
    ("specforge", "fp32", "none"),
    ("specforge", "bf16", "gzip"),
]


def _sample(t: int, seed: int) -> SampleRow:
    rng = np.random.default_rng(seed)
    return SampleRow(
        row=seed,
        id=f"x{seed}",
        input_ids=rng.integers(0, 150_000, t).astype(np.int64),
        loss_mask=rng.integers(0, 2, t).astype(np.int64),
    )


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(CASES),
    st.integers(1, 300),
    st.integers(2, 6),
    st.sampled_from([8, 64, 96]),
    st.integers(0, 10**6),
)
def test_round_trip_and_size(
    case: tuple[str, str, str], t: int, layers: int, hidden: int, seed: int
) -> None:
    fmt, dtype, compress = case
    w = writer_for(fmt, dtype=dtype, compress=compress)  # type: ignore[arg-type]
    s = _sample(t, seed)
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(t, layers, hidden, generator=gen) * 30
    data = w.encode(s, states)
    back = w.decode(data)
    assert np.array_equal(back.input_ids, s.input_ids)
    if fmt == "specforge":
        assert back.loss_mask is not None and np.array_equal(back.loss_mask, s.loss_mask)
    else:
        assert back.loss_mask is None  # speculators' loss mask lives in its dataset
    assert back.states.shape == (t, layers, hidden)
    if dtype == "fp8":
        v, scale = quantize_fp8(states)
        want = dequantize_fp8(v, scale)
    else:
        want = states.to(
            {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        ).float()
    assert torch.equal(back.states, want)
    raw = gzip.decompress(data) if compress == "gzip" else data
    predicted = w.predicted_bytes(t, layers, hidden)
    if fmt == "speculators":
        assert len(raw) == predicted
    else:  # torch.save's zip aligns records to 64 bytes
        assert abs(len(raw) - predicted) <= 256
    assert w.row_of(w.key(s.row)) == s.row


def test_specforge_file_has_the_keys_and_shapes_its_reader_takes() -> None:
    w = writer_for("specforge")
    s = _sample(11, 1)
    d = torch.load(io.BytesIO(w.encode(s, torch.randn(11, 4, 8))), weights_only=True)
    assert set(d) == {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}
    assert d["input_ids"].shape == d["loss_mask"].shape == (11,)
    assert d["input_ids"].dtype == d["loss_mask"].dtype == torch.int64
    assert d["hidden_state"].shape == (1, 11, 8) and d["hidden_state"].dtype == torch.bfloat16
    assert d["aux_hidden_state"].shape == (1, 11, 24)


def test_a_view_is_not_saved_with_its_whole_storage() -> None:
    # the last layer and the aux layers are views of one tensor: each saved alone
    w = writer_for("specforge")
    size = len(w.encode(_sample(1000, 2), torch.randn(1000, 4, 64)))
    assert size < 1000 * (16 + 4 * 64 * 2) + 4096


def test_names_are_recognised_exactly() -> None:
    spec = writer_for("speculators")
    assert spec.row_of("hidden_states/hs_17.safetensors") == 17
    for other in (
        "hidden_states/hs_x.safetensors",
        "hs_1.safetensors",
        "hidden_states/.hs_1.safetensors.tmp-ab",
    ):
        assert spec.row_of(other) is None
    sf, gz = writer_for("specforge"), writer_for("specforge", compress="gzip")
    assert (
        sf.row_of("hidden_states/data_3.ckpt") == 3
        and gz.row_of("hidden_states/data_3.ckpt") is None
    )
    assert (
        gz.row_of("hidden_states/data_3.ckpt.gz") == 3
        and sf.row_of("hidden_states/data_3.ckpt.gz") is None
    )


@pytest.mark.parametrize(
    ("fmt", "kw", "message"),
    [
        ("specforge", {"dtype": "fp8"}, "--dtype fp8"),
        ("speculators", {"compress": "gzip"}, "--compress gzip"),
        ("eagle", {}, "--format"),
    ],
)
def test_a_format_refuses_what_its_reader_cannot_read(
    fmt: str, kw: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        writer_for(fmt, **kw)  # type: ignore[arg-type]
