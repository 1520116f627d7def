"""The layer choice: EAGLE-3's ids for a target's depth, their index space, and the last layer
before / after the final norm, checked against transformers' own output_hidden_states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.hidden.backend import BackendSpec
from draftdata.hidden.layers import Capture, eagle3_layers, parse_layers
from draftdata.hidden.transformers_backend import TransformersBackend


@pytest.mark.parametrize("n", [7, 8, 16, 24, 28, 32, 36, 40, 48, 61, 64, 80, 94])
def test_eagle3_matches_both_trainers_defaults(n: int) -> None:
    # speculators 0.9.0 resolve_target_layer_ids: [2, N // 2, N - 3] (vLLM's index space)
    speculators = [2, n // 2, n - 3]
    # SpecForge 0.2.0 resolve_eagle_capture_layers: [1, N // 2 - 1, N - 4] in decoder-output
    # ids; SGLang's set_eagle3_layers_to_capture adds 1 to each
    specforge = [i + 1 for i in (1, n // 2 - 1, n - 4)]
    assert list(eagle3_layers(n)) == speculators == specforge
    assert parse_layers("eagle3", n) == eagle3_layers(n)
    assert parse_layers(" EAGLE3 ", n) == eagle3_layers(n)


@pytest.mark.parametrize("n", [1, 3, 5, 6])
def test_eagle3_refuses_a_depth_without_three_distinct_layers(n: int) -> None:
    with pytest.raises(ConfigError, match="--layers eagle3"):
        eagle3_layers(n)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("2,x", "comma-separated"), ("2,2,3", "twice"), ("2,8", "out of range"), ("-1", "out of")],
)
def test_explicit_layers_are_checked(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_layers(spec, 8)


@given(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
def test_explicit_layers_keep_their_order(ids: list[int]) -> None:
    assert parse_layers(",".join(map(str, ids)), 8) == tuple(ids)


def _reference(model_dir: Path, ids: np.ndarray) -> tuple[list[object], object]:
    """transformers' own output_hidden_states of the full causal LM, and the final norm's
    input (captured by a hook on the reference model)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    seen: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_pre_hook(lambda _m, a: seen.update(pre=a[0]))
    with torch.inference_mode():
        out = model(torch.from_numpy(ids)[None], output_hidden_states=True)
    return [h[0] for h in out.hidden_states], seen["pre"][0]


@pytest.mark.parametrize("last", ["pre_norm", "post_norm"])
def test_captured_layers_are_transformers_hidden_states(shallow_target: Path, last: str) -> None:
    import torch

    n = 5
    ids = np.random.default_rng(3).integers(0, 256, 17).astype(np.int64)
    hs, pre = _reference(shallow_target, ids)
    aux = (4, 0, 2, 1, 3)  # every id, 0 (embeddings) to N - 1, in --layers' own order
    backend = TransformersBackend(
        BackendSpec(model=str(shallow_target), capture=Capture(aux, last), dtype="float32")  # type: ignore[arg-type]
    )
    try:
        assert backend.facts.num_layers == n and backend.facts.hidden_size == 64
        got = backend.states([ids])[0]
    finally:
        backend.close()
    assert got.shape == (17, n + 1, 64)
    for slot, i in enumerate(aux):
        torch.testing.assert_close(got[:, slot], hs[i], rtol=1e-5, atol=1e-5)
    # the last slot: the final norm's input, or hidden_states[N] (the normed one)
    want = pre if last == "pre_norm" else hs[n]
    other = hs[n] if last == "pre_norm" else pre
    torch.testing.assert_close(got[:, n], want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[:, n], other, atol=1e-3)
