"""Batching is only rounding: any mix of lengths batched together gives each sample the states
it has alone (right padding with an attention mask, positions kept); and a padding bug of the
class speculators issue #279 describes is far outside the verification's tolerance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.hidden.backend import BackendSpec
from draftdata.hidden.layers import Capture
from draftdata.hidden.transformers_backend import TransformersBackend
from draftdata.hidden.verify import layer_sums, tolerance


@pytest.fixture(scope="module")
def backend(tiny_target: Path) -> Iterator[TransformersBackend]:
    b = TransformersBackend(
        BackendSpec(model=str(tiny_target), capture=Capture((2, 4, 5), "pre_norm"), dtype="float32")
    )
    yield b
    b.close()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=6), st.integers(0, 2**16))
def test_batched_states_equal_states_alone(
    backend: TransformersBackend, lengths: list[int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    batch = [rng.integers(0, 256, n).astype(np.int64) for n in lengths]
    together = backend.states(batch)
    for ids, got in zip(batch, together, strict=True):
        alone = backend.states([ids])[0]
        assert got.shape == alone.shape == (len(ids), 4, 64)
        worst = max(s.check("").rms_rel for s in layer_sums(got, alone))
        assert worst < 1e-4  # float32: batching changes nothing but rounding


def _left_padded(backend: TransformersBackend, batch: list[np.ndarray], *, mask: bool) -> list:
    """Each sample's rows of a left-padded forward pass (the rows its tokens sit in)."""
    import torch

    width = max(len(b) for b in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    att = torch.ones((len(batch), width), dtype=torch.long)
    for i, b in enumerate(batch):
        ids[i, width - len(b) :] = torch.from_numpy(b)
        if mask:
            att[i, : width - len(b)] = 0
    backend._got.clear()
    with torch.inference_mode():
        backend.model(input_ids=ids, attention_mask=att, use_cache=False)
        stacked = torch.stack([backend._got[s] for s in range(4)], dim=2)
    return [stacked[i, width - len(b) :] for i, b in enumerate(batch)], stacked


def test_what_padding_changes(backend: TransformersBackend) -> None:
    """Left padding with a mask changes nothing for a RoPE model (attention sees only relative
    positions); the bugs are which rows are kept, and pads attended without a mask: both far
    outside the tolerance the verification applies."""
    rng = np.random.default_rng(7)
    short, long = rng.integers(0, 256, 9), rng.integers(0, 256, 40)
    alone = backend.states([short.astype(np.int64)])[0]

    def worst(rows: object) -> float:
        return max(s.check("").rms_rel for s in layer_sums(rows, alone))  # type: ignore[arg-type]

    tol = tolerance("bf16", "bfloat16")
    kept, stacked = _left_padded(backend, [short, long], mask=True)
    assert worst(kept[0]) < 1e-4
    assert worst(stacked[0, : len(short)]) > 10 * tol  # left padded, the first rows kept
    unmasked, _ = _left_padded(backend, [short, long], mask=False)
    assert worst(unmasked[0]) > 10 * tol  # pads attended
