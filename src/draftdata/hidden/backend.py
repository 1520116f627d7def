"""The backend seam: a batch of samples' token ids in, each sample's captured hidden states out.

A backend is what runs the target's forward pass. Everything around it (the plan, batching by
length, the files, the commits, the verification, the bill) is the stage's and is the same for
every engine. The contract, which the engines (``transformers_backend.py`` here; the vLLM
serving engine beside it) keep::

    backend = open_backend(spec)            # spec: BackendSpec (model, capture, device, dtype)
    backend.facts                           # ModelFacts: num_layers, hidden_size, dtype, ...
    states = backend.states([ids_a, ids_b]) # ids: 1-D int64 numpy arrays, one per sample
    # -> [tensor [len(ids_a), capture.count, hidden], tensor [len(ids_b), ...]]
    backend.close()

- ``states`` returns one CPU ``torch.Tensor`` per sample, in the batch's order, shaped
  ``[num_tokens, capture.count, hidden_size]``: row ``t`` holds the states at position ``t`` of
  that sample alone (no padding, no other sample's tokens), the aux layers in
  ``capture.aux``'s order and then the last layer (before or after the final norm,
  ``capture.last``; ``layers.py`` says the index space). The dtype is the backend's compute
  dtype (``facts.dtype``); the writers cast to the stored dtype.
- How it batches inside (padding side, packing, one request per sample) is its own business,
  and it must not change the result beyond rounding: the stage's verification recomputes
  samples one at a time (``states([ids])``) and compares.
- A backend is opened once per device (``BackendSpec.device``: ``cpu``, ``cuda:3``, or what
  the engine names) in the process that uses it, and used by one thread at a time.
- Failures: a DraftdataError for what the user can fix (a model folder that does not load, an
  engine that is not installed, a fleet that does not answer); anything else is a bug.

Engines register a factory in ``ENGINES`` (name -> opener, plus how it lays out its devices);
``--engine NAME`` picks one. Heavy imports (torch, transformers, vLLM) happen inside the
openers, so importing this module costs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from draftdata.errors import ConfigError
from draftdata.hidden.layers import Capture

if TYPE_CHECKING:
    import torch

TokenIds = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ModelFacts:
    """What the stage needs to know of the target: its depth and width (the bill, the layer
    choice), the dtype its forward pass computes in, and its longest context."""

    model_type: str
    num_layers: int
    hidden_size: int
    dtype: str  # the compute dtype's torch name: "bfloat16", "float16", "float32"
    max_positions: int | None = None


@dataclass(frozen=True)
class BackendSpec:
    """How to open one backend: the target's folder, what to capture, the device, the compute
    dtype (None: the model's own), and ``options`` an engine reads for itself (the vLLM
    engine's fleet, ...), as given on the command line."""

    model: str
    capture: Capture
    device: str = "cpu"
    dtype: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """One opened engine on one device (see the module docstring for the contract)."""

    @property
    def facts(self) -> ModelFacts:
        """The target's facts, as loaded."""
        ...

    def states(self, batch: Sequence[TokenIds]) -> list[torch.Tensor]:
        """Each sample's captured states, ``[num_tokens, capture.count, hidden]``, in order."""
        ...

    def close(self) -> None:
        """Free the device (the model, the engine's processes)."""
        ...


Opener = Callable[[BackendSpec], Backend]


@dataclass(frozen=True)
class Engine:
    """A registered engine: ``open`` makes a backend; ``devices(gpus)`` turns ``--gpus`` into
    the devices to open one backend (and one worker) each on."""

    name: str
    open: Opener
    devices: Callable[[str], list[str]]


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> None:
    """Make ``--engine engine.name`` available."""
    ENGINES[engine.name] = engine


def engine_named(name: str) -> Engine:
    """The engine ``--engine name`` picks (its module imported on demand); ConfigError if none."""
    if name not in ENGINES:
        _load_builtin(name)
    if name not in ENGINES:
        known = ", ".join(sorted({*ENGINES, *_BUILTIN}))
        raise ConfigError(f"--engine {name!r}: unknown engine; choose one of {known}")
    return ENGINES[name]


# engine name -> the module that registers it when imported
_BUILTIN = {
    "transformers": "draftdata.hidden.transformers_backend",
    "vllm": "draftdata.hidden.vllm_backend",
}


def _load_builtin(name: str) -> None:
    module = _BUILTIN.get(name)
    if module is not None:
        import importlib

        importlib.import_module(module)


def read_model_facts(model: str) -> ModelFacts:
    """The target's facts from its ``config.json`` alone (no weights loaded): what the bill is
    computed from before any engine starts. ConfigError naming the file when it is missing or
    lacks ``num_hidden_layers`` / ``hidden_size`` (a multimodal config's ``text_config`` is
    read where the text model's facts live)."""
    path = Path(model) / "config.json"
    try:
        cfg = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"--model {model}: no config.json; give the target's local Hugging Face folder"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the model's config ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: not a JSON object")
    sub = cfg.get("text_config")
    text: dict[str, Any] = sub if isinstance(sub, dict) else cfg
    try:
        layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{path}: no num_hidden_layers / hidden_size; is this a causal language model?"
        ) from None
    dtype = str(text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or "")
    positions = text.get("max_position_embeddings")
    return ModelFacts(
        model_type=str(cfg.get("model_type", "")),
        num_layers=layers,
        hidden_size=hidden,
        dtype=dtype.replace("torch.", "") or "float32",
        max_positions=int(positions) if isinstance(positions, int) else None,
    )
