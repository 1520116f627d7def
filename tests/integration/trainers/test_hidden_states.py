"""The trainer tier for hidden states: speculators' and SpecForge's own offline dataset code
read draftdata's sets and hand their drafters exactly our tensors, with the sample's own
input_ids and loss_mask.

tokenize's samples of a simulated run (the demo tokenizer) and a tiny random Qwen3-shaped
target made locally go through ``draftdata hidden-states`` in each format (speculators bf16 and
fp8, SpecForge plain and gzip); ``hidden_side.py`` runs in the trainers' environment
(``scripts/trainers_env.sh``) and reads each set with the trainer's reader; here every tensor
it read is compared with what the set's file holds (decoded by draftdata) and with the sample:

- speculators: ``hidden_states`` = the aux layers flattened, ``verifier_last_hidden_states`` =
  the last layer before the final norm, ``input_ids`` and ``loss_mask`` = the sample's, bit
  for bit (fp8: dequantized as ``FP8Transfer`` does, in bf16);
- SpecForge: ``hidden_state`` [1, T, 3H] and ``target`` [1, T, H] (after the final norm), the
  sample's ``input_ids``, and its ``loss_mask`` with the last position zeroed (SpecForge's
  reader does that itself).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.integration.envs import cached_env_python, env_dir
from tests.integration.hidden.helpers import samples_of, target_for, tokenized_run

pytest.importorskip("torch")

from draftdata.hidden.config import HiddenConfig
from draftdata.hidden.setfiles import read_set
from draftdata.hidden.stage import hidden_states
from draftdata.hidden.writers import writer_for

pytestmark = [pytest.mark.integration, pytest.mark.trainers, pytest.mark.timeout(1800)]

SETS = {  # name -> (format, dtype, compress)
    "speculators": ("speculators", "bf16", "none"),
    "speculators-fp8": ("speculators", "fp8", "none"),
    "specforge": ("specforge", "bf16", "none"),
    "specforge-gzip": ("specforge", "bf16", "gzip"),
}


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    py = cached_env_python("trainers_env.sh", env_dir("trainers"), "trainers")
    base = tmp_path_factory.mktemp("hidden-trainers")
    tok_dir, tok = tokenized_run(base, n=24)
    target = target_for(tok, base / "target")
    for name, (fmt, dtype, compress) in SETS.items():
        config = HiddenConfig(tokenized=str(tok_dir), model=str(target), out=str(base / name),
                              format=fmt, dtype=dtype, compress=compress, gpus="cpu",  # type: ignore[arg-type]
                              batch_tokens=400, verify=2)  # fmt: skip
        assert hidden_states(config, log=None).complete
    job = {
        "max_len": 4096,
        "speculators": [
            {"name": n, "path": str(base / n), "fp8": SETS[n][1] == "fp8"}
            for n in SETS
            if SETS[n][0] == "speculators"
        ],
        "specforge": [
            {"name": n, "path": str(base / n)} for n in SETS if SETS[n][0] == "specforge"
        ],
    }
    (base / "job.json").write_text(json.dumps(job))
    (base / "read").mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(base / "hf"), "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}  # fmt: skip
    res = subprocess.run(
        [str(py), str(Path(__file__).with_name("hidden_side.py")), str(base / "job.json"),
         str(base / "read")],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return {"base": base, "samples": samples_of(tok_dir)}


def _read(tier: dict[str, Any], name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(tier["base"] / "read" / f"{name}.safetensors"))


def _ours(tier: dict[str, Any], name: str) -> dict[int, tuple[str, Any]]:
    """row -> (sample id, the states the set's file holds as the trainer dtype sees them)."""
    import torch
    from safetensors.torch import load_file

    fmt, dtype, compress = SETS[name]
    hs = read_set(str(tier["base"] / name))
    w = writer_for(fmt, dtype=dtype, compress=compress)  # type: ignore[arg-type]
    out = {}
    for r in hs.index.to_pylist():
        path = tier["base"] / name / r["file"]
        if dtype == "fp8":  # hs_connectors' FP8Transfer: fp8.to(bf16) * scale.to(bf16)
            raw = load_file(str(path))
            states = raw["hidden_states"].to(torch.bfloat16) * raw["hidden_states_scales"].to(
                torch.bfloat16
            )
        else:
            states = w.decode(path.read_bytes()).states.to(torch.bfloat16)
        out[r["row"]] = (r["id"], states)
    return out


@pytest.mark.parametrize("name", [n for n in SETS if SETS[n][0] == "speculators"])
def test_speculators_reads_exactly_our_tensors(tier: dict[str, Any], name: str) -> None:
    from collections import Counter

    import torch

    got = _read(tier, name)
    ours = _ours(tier, name)
    freq: Counter[int] = Counter()
    for sample in tier["samples"].values():
        freq.update(i for i, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m)
    assert got.pop("token_freq.ids").tolist() == sorted(freq)  # token_freq.pt, as its trainer
    assert got.pop("token_freq.counts").tolist() == [freq[k] for k in sorted(freq)]  # reads it
    assert len(got.pop("token_freq.d2t")) == 8  # and builds its draft vocabulary from it
    assert {int(k.split(".")[0]) for k in got} == set(ours)
    for row, (sid, states) in ours.items():
        sample = tier["samples"][sid]
        t = len(sample["input_ids"])
        assert got[f"{row}.input_ids"].tolist() == sample["input_ids"]
        assert got[f"{row}.loss_mask"].tolist() == sample["loss_mask"]
        assert torch.equal(got[f"{row}.aux"], states[:, :-1].reshape(t, -1))
        assert torch.equal(got[f"{row}.last"], states[:, -1])


@pytest.mark.parametrize("reader", ["", "-runtime"])
@pytest.mark.parametrize("name", [n for n in SETS if SETS[n][0] == "specforge"])
def test_specforge_reads_exactly_our_tensors(tier: dict[str, Any], name: str, reader: str) -> None:
    import torch

    got = _read(tier, name + reader)
    ours = _ours(tier, name)
    assert {int(k.split(".")[0]) for k in got} == set(ours)
    for row, (sid, states) in ours.items():
        sample = tier["samples"][sid]
        t = len(sample["input_ids"])
        assert got[f"{row}.input_ids"].tolist() == [sample["input_ids"]]
        mask = got[f"{row}.loss_mask"].tolist()[0]
        assert mask[:-1] == sample["loss_mask"][:-1] and mask[-1] == 0  # SpecForge zeroes it
        assert torch.equal(got[f"{row}.aux"], states[:, :-1].reshape(1, t, -1))
        assert torch.equal(got[f"{row}.last"], states[:, -1][None])
        assert np.isfinite(got[f"{row}.aux"].float().numpy()).all()
