"""Which of the target's hidden states are captured: the layer choice and its index space.

**Index space.** A layer id ``i`` is an index into Hugging Face's ``output_hidden_states``
tuple: ``0`` is the embeddings' output, ``i`` (1 <= i < N) the output of decoder layer ``i - 1``
(the input of decoder layer ``i``), for a target of ``N = num_hidden_layers`` decoder layers.
It is the index space of vLLM's ``eagle_aux_hidden_state_layer_ids`` (vLLM appends the
residual stream after ``i`` layers) and of speculators' ``target_layer_ids``; SGLang's
``set_eagle3_layers_to_capture`` and SpecForge's ``eagle_aux_hidden_state_layer_ids`` count
decoder-layer outputs instead, one less (SGLang adds 1): SpecForge's ``[1, N//2 - 1, N - 4]``
is our ``[2, N//2, N - 3]``.

**EAGLE-3's choice** (``--layers eagle3``): the aux layers ``[2, N // 2, N - 3]`` (speculators
0.9.0 ``resolve_target_layer_ids``; SpecForge 0.2.0 ``resolve_eagle_capture_layers`` after
SGLang's +1; SGLang's and vLLM's own EAGLE-3 default), plus the last layer.

**The last layer** is the output of the last decoder layer, before or after the model's final
norm, as each trainer reads it (``Capture.last``): speculators stores it *before* the norm
(vLLM's layer id ``N``, the residual stream; its drafter applies ``verifier_norm`` itself),
SpecForge *after* it (SGLang's ``last_hidden_states``, fed straight to the target's lm_head;
Hugging Face's ``hidden_states[N]`` is the normed one too).

This module is arithmetic only: no torch, no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftdata.errors import ConfigError

LastNorm = Literal["pre_norm", "post_norm"]
EAGLE3 = "eagle3"


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's aux layers for a target of ``num_layers`` decoder layers (see the docstring)."""
    if num_layers < 4:
        raise ConfigError(
            f"--layers eagle3: the target has {num_layers} decoder layers; EAGLE-3's choice "
            "[2, N//2, N-3] needs at least 7 (give explicit --layers I,J,K)"
        )
    ids = (2, num_layers // 2, num_layers - 3)
    if len(set(ids)) != 3:
        raise ConfigError(
            f"--layers eagle3: for {num_layers} decoder layers EAGLE-3's choice [2, N//2, N-3] "
            f"is {list(ids)}, not three distinct layers (speculators refuses it too); give "
            "explicit --layers I,J,K"
        )
    return ids


@dataclass(frozen=True)
class Capture:
    """What a backend captures at every position of a sample: the ``aux`` layers (ids in the
    index space above, in the order given) and then the last layer, ``last`` before or after
    the final norm. A sample's states are one tensor ``[num_tokens, len(aux) + 1, hidden]``."""

    aux: tuple[int, ...]
    last: LastNorm

    @property
    def count(self) -> int:
        """Tensors per position: the aux layers and the last one."""
        return len(self.aux) + 1

    def describe(self, num_layers: int) -> str:
        """``[2, 14, 25] + last (36, before the final norm)`` for messages and the summary."""
        where = "before" if self.last == "pre_norm" else "after"
        return f"{list(self.aux)} + last ({num_layers}, {where} the final norm)"


def parse_layers(spec: str, num_layers: int) -> tuple[int, ...]:
    """The aux layer ids of ``--layers``: ``eagle3`` or ``I,J,K`` (ids 0..N-1 in the index
    space above, distinct; the last layer is always captured too). ConfigError naming the
    option on anything else."""
    text = spec.strip().lower()
    if text == EAGLE3:
        return eagle3_layers(num_layers)
    parts = [p.strip() for p in text.split(",")]
    try:
        ids = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(
            f"--layers {spec!r}: give eagle3 or comma-separated layer ids such as 2,14,25"
        ) from None
    if not ids:
        raise ConfigError(f"--layers {spec!r}: no layer ids")
    bad = [i for i in ids if i < 0 or i >= num_layers]
    if bad:
        raise ConfigError(
            f"--layers {spec!r}: {bad[0]} is out of range; the target has {num_layers} decoder "
            f"layers, so aux ids are 0..{num_layers - 1} (0: the embeddings; the last layer, "
            f"{num_layers}, is always captured)"
        )
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--layers {spec!r}: a layer id is given twice")
    return ids
