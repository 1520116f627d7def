"""The simulator's hidden states (sim/hidden.py): a pure, causal function of the token ids,
exact in bf16, in files any safetensors reader takes."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from draftdata.sim.hidden import _bf16_bytes, file_bytes, safetensors_bytes, states_for

ids_st = st.lists(st.integers(0, 200_000), min_size=1, max_size=64)


@given(ids=ids_st, k=st.integers(1, 64))
def test_a_position_depends_only_on_the_tokens_up_to_it(ids: list[int], k: int) -> None:
    k = min(k, len(ids))
    assert np.array_equal(states_for(ids[:k], (0, 3), 8), states_for(ids, (0, 3), 8)[:k])


@given(ids=ids_st, other=ids_st)
@example(ids=[4585, 0, 0, 4585], other=[4585, 0, 0, 80280])  # one row alike before (1 in 255)
def test_other_tokens_give_other_states(ids: list[int], other: list[int]) -> None:
    a, b = states_for(ids, (1,), 16), states_for(other, (1,), 16)
    if ids != other and len(ids) == len(other):
        assert not np.array_equal(a, b)


@given(ids=ids_st)
def test_values_are_exact_in_bf16(ids: list[int]) -> None:
    s = states_for(ids, (0, 2, 5), 8)
    back = (np.frombuffer(_bf16_bytes(s), dtype="<u2").astype("<u4") << 16).view("<f4")
    assert np.array_equal(back.reshape(s.shape), s)


def test_files_are_read_by_safetensors() -> None:
    import pytest

    pytest.importorskip("torch")  # safetensors reads bf16 through torch only
    from safetensors.torch import load

    ids = [7, 1, 99, 4]
    got = load(file_bytes(ids, (2, 6), 4, stored_ids=ids))
    assert got["token_ids"].tolist() == ids
    assert set(got) == {"hidden_states", "token_ids"}
    assert np.array_equal(got["hidden_states"].float().numpy(), states_for(ids, (2, 6), 4))
    assert load(safetensors_bytes({"x": ("F32", (1,), np.float32(1.5).tobytes())}))["x"][0] == 1.5
