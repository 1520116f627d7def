"""`hidden-states --engine vllm` over real sockets against the simulator speaking vLLM's
hidden-states protocol (sim/hidden.py): the files hold the fleet's states for exactly each
sample's tokens, through the faults of a fleet (a server killed mid-run, a slow one, refusals,
files never written, states of other tokens), and the staging folder is left empty.

The simulated states are a pure function of the token ids (``states_for``), so every file is
checked against what it must hold. torch is needed (``draftdata[hidden]``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from draftdata.errors import FleetError, FleetUnavailableError  # noqa: E402
from draftdata.formats import SAMPLE_SCHEMA  # noqa: E402
from draftdata.hidden.config import HiddenConfig  # noqa: E402
from draftdata.hidden.stage import hidden_states  # noqa: E402
from draftdata.sim.config import FaultConfig, SimConfig  # noqa: E402
from draftdata.sim.hidden import states_for  # noqa: E402
from draftdata.sim.run import SimFleet  # noqa: E402

pytestmark = pytest.mark.integration

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


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Any]:
    staging = tmp_path / "staging"
    staging.mkdir()
    return {
        "model": write_model(tmp_path / "model"),
        "samples": write_samples(tmp_path / "tok", 48),
        "tok": tmp_path / "tok",
        "staging": staging,
        "tmp": tmp_path,
    }


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


@pytest.fixture
def fleet_of(job: dict[str, Any]) -> Iterator[Any]:
    """Start a simulated fleet; yields a function (n, **SimConfig) -> (SimFleet, fleet.yaml)."""
    started: list[SimFleet] = []

    def start(n: int, **kw: Any) -> tuple[SimFleet, Path]:
        fleet = SimFleet(n=n, config=sim_config(job["staging"], **kw)).__enter__()
        started.append(fleet)
        return fleet, fleet.write(job["tmp"] / f"fleet-{len(started)}.yaml")

    yield start
    for f in started:
        f.__exit__(None, None, None)


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


def test_every_file_holds_its_own_samples_states(job: dict[str, Any], fleet_of: Any) -> None:
    fleet, yaml = fleet_of(2)
    summary, _ = run(job, yaml)
    assert summary.complete and summary.written == 48
    assert summary.verification is not None and summary.verification.passed
    check_files(job)
    assert all(fleet.stats(i).served > 0 for i in range(2))  # the fleet shared the work


def test_the_last_layer_after_the_final_norm_for_specforge(
    job: dict[str, Any], fleet_of: Any
) -> None:
    _, yaml = fleet_of(1)
    summary, _ = run(job, yaml, format="specforge")
    assert summary.complete
    weight = torch.linspace(0.5, 2.0, HIDDEN).to(torch.bfloat16)
    for r in pq.read_table(job["tmp"] / "set" / "hidden_index.parquet").to_pylist()[:10]:
        got = torch.load(job["tmp"] / "set" / r["file"])
        pre = torch.from_numpy(states_for(job["samples"][r["id"]], [LAYERS], HIDDEN)[:, 0])
        x = pre.to(torch.bfloat16).float()
        want = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        assert torch.equal(got["hidden_state"][0], want)


def test_a_server_killed_mid_run(
    job: dict[str, Any], fleet_of: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Server 0 dies at its 6th request (socket closed, connections dropped, its writes not
    done): its work moves to server 1; nothing is lost, nothing is wrong."""
    fleet, yaml = fleet_of(2, faults=FaultConfig(crash_after={0: 6}))
    summary, _ = run(job, yaml)
    assert summary.complete and summary.written == 48
    check_files(job)
    assert fleet.stats(0).crashes == 1
    said = capfd.readouterr().err  # the engine's endpoint lines, as generate's
    assert f"endpoint {fleet.urls[0]} taken out" in said


def test_a_server_killed_and_back(job: dict[str, Any], fleet_of: Any) -> None:
    fleet, yaml = fleet_of(
        2, faults=FaultConfig(crash_after={1: 3}, restart_after=0.5, starting_s=0.2)
    )
    summary, _ = run(job, yaml)
    assert summary.complete
    check_files(job)
    assert fleet.stats(1).restarts == 1


def test_a_slow_server_gets_less_and_delays_nothing_wrong(
    job: dict[str, Any], fleet_of: Any
) -> None:
    fleet, yaml = fleet_of(2, faults=FaultConfig(slow={1: 30.0}), hidden_write_s=0.0)
    summary, _ = run(job, yaml)
    assert summary.complete
    check_files(job)
    assert 0 < fleet.stats(1).served < fleet.stats(0).served


def test_a_refusing_server_is_taken_out(
    job: dict[str, Any], fleet_of: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    fleet, yaml = fleet_of(2, faults=FaultConfig(refuse={0: 401}))
    summary, _ = run(job, yaml)
    assert summary.complete
    check_files(job)
    assert fleet.stats(0).served == 0
    assert f"endpoint {fleet.urls[0]} taken out: it refuses" in capfd.readouterr().err


def test_a_fleet_that_refuses_everything_stops_in_one_line(
    job: dict[str, Any], fleet_of: Any
) -> None:
    _, yaml = fleet_of(2, faults=FaultConfig(refuse={0: 403, 1: 403}))
    with pytest.raises(FleetUnavailableError, match="every endpoint refuses") as err:
        run(job, yaml)
    assert "\n" not in str(err.value)
    assert not list((job["tmp"] / "set" / "hidden_states").glob("*"))  # nothing committed


def test_files_a_server_never_wrote_are_asked_again(job: dict[str, Any], fleet_of: Any) -> None:
    fleet, yaml = fleet_of(2, faults=FaultConfig(hidden_missing=0.25))
    summary, _ = run(job, yaml)
    assert summary.complete
    check_files(job)  # and the staging folder holds none of the locks left behind
    assert sum(fleet.stats(i).faults.get("hidden_missing", 0) for i in range(2)) > 0


def test_states_of_other_tokens_take_their_server_out(
    job: dict[str, Any], fleet_of: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Server 0 writes files whose token_ids are not the prompt's (the class of a batching
    bug): it is taken out at once, and no file of it is committed."""
    fleet, yaml = fleet_of(2, faults=FaultConfig(hidden_wrong_ids=1.0, server=0))
    summary, _ = run(job, yaml)
    assert summary.complete
    check_files(job)
    assert fleet.stats(0).faults.get("hidden_wrong_ids", 0) >= 1
    said = capfd.readouterr().err
    assert f"endpoint {fleet.urls[0]} taken out: it gives impossible answers" in said
    assert "not the ids sent" in said


def test_a_sample_longer_than_the_servers_context_is_named(
    job: dict[str, Any], fleet_of: Any
) -> None:
    _, yaml = fleet_of(1, context_length=40)
    with pytest.raises(FleetError, match="--max-length"):
        run(job, yaml)
    summary, _ = run(job, yaml, out="cut", max_length=39)
    assert summary.complete


def test_a_fleet_that_does_not_capture_the_layers_is_refused(
    job: dict[str, Any], fleet_of: Any
) -> None:
    from draftdata.errors import ConfigError

    _, yaml = fleet_of(1, hidden_layers=[2, 6])
    with pytest.raises(ConfigError, match=r"captures layers \[2, 6\]"):
        run(job, yaml)
