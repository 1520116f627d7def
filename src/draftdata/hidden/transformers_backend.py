"""The local engine: PyTorch + transformers on one GPU (or the CPU), batched by length.

``--engine transformers`` (the default) loads the target with ``AutoModel`` (the decoder
stack without the lm_head: no logits are computed or held) on each device ``--gpus`` names,
one worker per device (``run.py``), and captures exactly the layers asked for with forward
hooks instead of ``output_hidden_states=True``, which would keep all N + 1 layers of the batch
alive at once (65 × 168 MB for a 16K-token batch of a 64-layer, 5,120-wide target). The hooks
read the same tensors ``output_hidden_states`` returns (``tests/unit/hidden`` checks them
against it): aux id 0 is the embeddings' output, id ``i`` >= 1 decoder layer ``i - 1``'s
output; the last layer is the final norm's input (``pre_norm``) or output (``post_norm``).

**Padding.** A batch is padded on the right, with an attention mask: every real token keeps
its position ids (0..len-1, what the model computes by default) and, under the causal mask,
attends to exactly the tokens before it in its own sample; the padded positions come after
every real one, and a sample's states are the first ``len`` rows (row ``t`` is position
``t``). Left padding with a mask gives the same states for a RoPE model (attention sees only
relative positions) but puts a sample in the *last* ``len`` rows; keeping the wrong rows, or
attending to pads without a mask, is the class of bug (speculators issue #279, wrong states at
batch size > 1) the stage's verification exists to catch (``tests/unit/hidden``).

Runs on the CPU for tests and small targets, in float32 unless ``--compute-dtype`` says
otherwise (bf16 matmuls are emulated on CPUs without bf16 units, many times slower); on a GPU
in the model's own dtype. Needs ``draftdata[hidden]`` (torch).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from draftdata.errors import ConfigError
from draftdata.hidden.backend import BackendSpec, Engine, ModelFacts, TokenIds, register

if TYPE_CHECKING:
    import torch


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "--engine transformers needs PyTorch: pip install 'draftdata[hidden]' "
            "(or a torch build for your GPUs)"
        ) from None
    return torch


class TransformersBackend:
    """One target on one device (see the module docstring)."""

    def __init__(self, spec: BackendSpec) -> None:
        torch = _torch()
        from transformers import AutoConfig, AutoModel

        self.spec = spec
        self.device = torch.device(spec.device)
        try:
            config = AutoConfig.from_pretrained(spec.model)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--model {spec.model}: cannot load its config ({exc})") from exc
        dtype = _compute_dtype(torch, spec.dtype, config, self.device.type)
        try:
            model = AutoModel.from_pretrained(spec.model, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--model {spec.model}: cannot load the model ({exc})") from exc
        self.model = model.to(self.device).eval()
        layers = _decoder_layers(self.model)
        norm = getattr(self.model, "norm", None)
        if layers is None or norm is None:
            raise ConfigError(
                f"--model {spec.model}: {type(self.model).__name__} has no decoder layers and "
                "final norm where a causal LM keeps them (.layers, .norm)"
            )
        n = len(layers)
        self._facts = ModelFacts(
            model_type=str(getattr(config, "model_type", "")),
            num_layers=n,
            hidden_size=int(config.hidden_size),
            dtype=str(dtype).replace("torch.", ""),
            max_positions=getattr(config, "max_position_embeddings", None),
        )
        bad = [i for i in spec.capture.aux if not 0 <= i < n]
        if bad:
            raise ConfigError(f"--layers: {bad[0]} is out of range for a {n}-layer target")
        # slot -> the captured tensor of the current batch
        self._got: dict[int, Any] = {}
        self._hooks = []
        for slot, i in enumerate(spec.capture.aux):
            module = self.model.get_input_embeddings() if i == 0 else layers[i - 1]
            self._hooks.append(module.register_forward_hook(self._keep_output(slot)))
        last = len(spec.capture.aux)
        if spec.capture.last == "pre_norm":
            self._hooks.append(norm.register_forward_pre_hook(self._keep_input(last)))
        else:
            self._hooks.append(norm.register_forward_hook(self._keep_output(last)))

    def _keep_output(self, slot: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            self._got[slot] = output[0] if isinstance(output, tuple) else output

        return hook

    def _keep_input(self, slot: int) -> Any:
        def hook(_module: Any, args: Any) -> None:
            self._got[slot] = args[0]

        return hook

    @property
    def facts(self) -> ModelFacts:
        """The target's facts, as loaded."""
        return self._facts

    def states(self, batch: Sequence[TokenIds]) -> list[torch.Tensor]:
        """One right-padded forward pass over ``batch``; each sample's rows, CPU tensors."""
        torch = _torch()
        if not batch:
            return []
        lengths = [len(ids) for ids in batch]
        width = max(lengths)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, sample in enumerate(batch):
            ids[i, : lengths[i]] = torch.from_numpy(sample)
            mask[i, : lengths[i]] = 1
        self._got.clear()
        with torch.inference_mode():
            self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                use_cache=False,
            )
            stacked = torch.stack([self._got[s] for s in range(len(self._got))], dim=2)
            stacked = stacked.to("cpu")
        self._got.clear()
        # [batch, width, layers, hidden] -> each sample's first len rows (right padding)
        return [stacked[i, : lengths[i]] for i in range(len(batch))]

    def close(self) -> None:
        """Drop the hooks and the model (and the GPU memory it held)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        del self.model
        torch = _torch()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _decoder_layers(model: Any) -> Any:
    layers = getattr(model, "layers", None)
    if layers is None and hasattr(model, "language_model"):
        layers = getattr(model.language_model, "layers", None)
    return layers


def _compute_dtype(torch: Any, wanted: str | None, config: Any, device: str) -> Any:
    """The dtype to compute in: the one asked for; else float32 on the CPU (bf16 matmuls are
    emulated, many times slower, on CPUs without bf16 units, and float32 is the more exact);
    else the model's own (bf16/fp16/fp32; float32 when it names none)."""
    if wanted not in (None, "auto"):
        return getattr(torch, str(wanted))
    if device == "cpu":
        return torch.float32
    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, str):
        own = getattr(torch, own.replace("torch.", ""), None)
    return own if own in (torch.bfloat16, torch.float16, torch.float32) else torch.float32


_GPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def devices(gpus: str) -> list[str]:
    """``--gpus`` as devices: ``auto`` (every visible GPU, else the CPU), ``cpu``, ``cpu:N``
    (N CPU workers), or GPU ids ``0-7`` / ``0,2,5``."""
    text = gpus.strip().lower()
    if text == "auto":
        torch = _torch()
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{i}" for i in range(n)] or ["cpu"]
    if text == "cpu":
        return ["cpu"]
    m = re.fullmatch(r"cpu:(\d+)", text)
    if m and int(m.group(1)) >= 1:
        return ["cpu"] * int(m.group(1))
    if _GPU_LIST.match(text):
        ids: list[int] = []
        for part in text.split(","):
            a, _, b = part.partition("-")
            ids.extend(range(int(a), int(b or a) + 1))
        if len(set(ids)) != len(ids):
            raise ConfigError(f"--gpus {gpus!r}: a GPU is named twice")
        return [f"cuda:{i}" for i in ids]
    raise ConfigError(f"--gpus {gpus!r}: give auto, cpu, cpu:N, or GPU ids such as 0-7 or 0,2")


register(Engine(name="transformers", open=TransformersBackend, devices=devices))
