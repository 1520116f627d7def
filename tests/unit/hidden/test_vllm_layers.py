"""The vLLM engine's layer arithmetic: which slots of a fleet's files a capture takes, and the
final RMSNorm it applies for a format that stores the last layer after the norm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from draftdata.errors import ConfigError  # noqa: E402
from draftdata.hidden.layers import Capture  # noqa: E402
from draftdata.hidden.vllm_backend import FinalNorm, fleet_slots  # noqa: E402


@given(
    n=st.integers(4, 80),
    data=st.data(),
)
def test_slots_take_the_aux_layers_then_the_last(n: int, data: st.DataObject) -> None:
    aux = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5, unique=True))
    extra = data.draw(st.lists(st.integers(0, n), max_size=4, unique=True))
    fleet = data.draw(st.permutations(sorted({*aux, n, *extra})))
    slots = fleet_slots(Capture(tuple(aux), "pre_norm"), n, fleet)
    assert [fleet[s] for s in slots] == [*aux, n]


def test_a_layer_the_fleet_does_not_capture_is_named() -> None:
    with pytest.raises(ConfigError, match=r"captures layers \[2, 18, 36\].*needs \[2, 9, 36\]"):
        fleet_slots(Capture((2, 9), "pre_norm"), 36, [2, 18, 36])
    with pytest.raises(ConfigError, match="the last, 36"):
        fleet_slots(Capture((2,), "pre_norm"), 36, [2, 18])


def _folder(tmp_path: Path, weight: torch.Tensor, **cfg: object) -> Path:
    from safetensors.torch import save_file

    base = {"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": weight.shape[0]}
    (tmp_path / "config.json").write_text(json.dumps({**base, **cfg}))
    save_file(
        {"model.norm.weight": weight, "lm_head.weight": torch.zeros(2, 2)},
        str(tmp_path / "model.safetensors"),
    )
    return tmp_path


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_final_norm_is_hugging_faces(tmp_path: Path, dtype: str) -> None:
    """The norm applied to vLLM's pre-norm last layer is transformers' Qwen3RMSNorm, bit for
    bit, in the states' dtype."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    weight = (torch.rand(48, generator=g) * 1.5 + 0.5).to(dt)
    norm = FinalNorm.load(str(_folder(tmp_path, weight, rms_norm_eps=1e-6)))
    ref = Qwen3RMSNorm(48, eps=1e-6).to(dt)
    with torch.no_grad():
        ref.weight.copy_(weight)
        x = (torch.randn(7, 48, generator=g) * 3).to(dt)
        assert torch.equal(norm(x), ref(x))


def test_a_norm_that_is_not_plain_rms_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a plain RMSNorm"):
        FinalNorm.load(
            str(_folder(tmp_path, torch.ones(8), model_type="gemma2", rms_norm_eps=1e-6))
        )
    with pytest.raises(ConfigError, match="not a plain RMSNorm"):
        FinalNorm.load(str(_folder(tmp_path, torch.ones(8), layer_norm_epsilon=1e-5)))


def test_a_sharded_model_finds_its_norm_through_the_index(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "rms_norm_eps": 1e-5}))
    save_file({"model.embed_tokens.weight": torch.zeros(2, 4)}, str(tmp_path / "a.safetensors"))
    save_file({"model.norm.weight": torch.full((4,), 2.0)}, str(tmp_path / "b.safetensors"))
    index = {
        "weight_map": {
            "model.embed_tokens.weight": "a.safetensors",
            "model.norm.weight": "b.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(FinalNorm.load(str(tmp_path)).weight, torch.full((4,), 2.0))
