"""What the tests of `hidden-states --engine vllm` against the simulated fleet share: a target
folder (config.json and its final norm: the fleet runs the model), tokenized samples, the
simulator's settings, one stage run, and the check that every file holds exactly the fleet's
states of its own sample (``states_for``) with the staging folder left empty. The fixtures
``sim_job`` and ``sim_fleet`` (conftest.py) build on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from draftdata.hidden.config import HiddenConfig  # noqa: E402
from draftdata.hidden.stage import hidden_states  # noqa: E402
from draftdata.shared.formats import SAMPLE_SCHEMA  # noqa: E402
from draftdata.sim.config import SimConfig  # noqa: E402
from draftdata.sim.hidden import states_for  # noqa: E402

LAYERS = 6  # the target's decoder layers
HIDDEN = 32
AUX = (2, 3)
FLEET_LAYERS = [3, 6, 2, 1]  # what the fleet captures, in its own order (a superset)


def write_model(folder: Path) -> Path:
    """A target folder: config.json and the final norm's weight (no other weights: the fleet
    runs the model)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3",
        "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-6,
    }
    (folder / "config.json").write_text(json.dumps(config))
    weight = torch.linspace(0.5, 2.0, HIDDEN).to(torch.bfloat16)
    save_file({"model.norm.weight": weight}, str(folder / "model.safetensors"))
    return folder


def write_samples(folder: Path, n: int, *, seed: int = 0, hi: int = 60) -> dict[str, list[int]]:
    """``n`` tokenized samples; their token ids by id."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = int(rng.integers(3, hi))
        ids = rng.integers(0, 30_000, t).tolist()
        mask = [0] * (t // 2) + [1] * (t - t // 2)
        rows.append(
            {"id": f"s{i:04d}", "source": "src", "domain": "general", "input_ids": ids,
             "loss_mask": mask, "num_tokens": t, "num_loss_tokens": sum(mask), "truncated": False}
        )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), folder / "part-00000.parquet")
    return {r["id"]: r["input_ids"] for r in rows}


def sim_config(staging: Path, **kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "flavor": "vllm",
        "model": "target",
        "time_scale": 0.05,
        "hidden_states": str(staging),
        "hidden_layers": FLEET_LAYERS,
        "hidden_size": HIDDEN,
        "hidden_write_s": 0.2,  # the reader waits on the lock for every file
    }
    return SimConfig(**{**base, **kw})


def run(
    job: dict[str, Any], fleet_yaml: Path, out: str = "set", **kw: Any
) -> tuple[Any, list[str]]:
    lines: list[str] = []
    config = HiddenConfig(
        tokenized=str(job["tok"]),
        model=str(job["model"]),
        out=str(job["tmp"] / out),
        format=kw.pop("format", "speculators"),
        layers=",".join(str(i) for i in AUX),
        engine="vllm",
        batch_tokens=kw.pop("batch_tokens", 600),
        verify=kw.pop("verify", 4),
        progress=False,
        options={"fleet": str(fleet_yaml), **kw.pop("options", {})},
        **kw,
    )
    return hidden_states(config, log=lines.append), lines


def check_files(job: dict[str, Any], out: str = "set") -> None:
    """Every sample's file holds exactly the fleet's states of its own tokens, the aux layers
    then the last (pre-norm); the staging folder is empty."""
    from safetensors.torch import load_file

    root = job["tmp"] / out
    index = pq.read_table(root / "hidden_index.parquet").to_pylist()
    assert len(index) == len(job["samples"])
    for r in index:
        ids = job["samples"][r["id"]]
        got = load_file(str(root / r["file"]))
        assert got["token_ids"].tolist() == ids
        want = states_for(ids, [*AUX, LAYERS], HIDDEN)
        assert np.array_equal(got["hidden_states"].float().numpy(), want), r["id"]
    assert list(job["staging"].iterdir()) == []
