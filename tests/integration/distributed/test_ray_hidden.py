"""``hidden-states --ray``: the samples partitioned by id over a local Ray cluster (2 CPUs, CPU
workers), into one set: the same files as one process makes, each partition resumable on its
own, none rewritten. The engine is the transformers backend on a tiny random Qwen3."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from tests.integration.distributed.unplaceable import refused_at_once  # noqa: E402
from tests.unit.hidden.helpers import sample_rows, tiny_qwen3, write_samples  # noqa: E402

from draftdata.distributed.ray_hidden import RayHiddenOptions, run, summary_lines  # noqa: E402
from draftdata.generate.prompts.partition import Partition  # noqa: E402
from draftdata.hidden.config import HiddenConfig  # noqa: E402
from draftdata.hidden.stage import hidden_states  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ray-hidden")
    model = tiny_qwen3(base / "model", layers=5)
    rows = sample_rows(60, seed=4)
    tok = write_samples(base / "tok", rows, shards=3)
    return {"base": base, "model": model, "tok": tok, "ids": [r["id"] for r in rows]}


def _config(job: dict[str, Any], out: Path, **kw: Any) -> HiddenConfig:
    return HiddenConfig(
        tokenized=str(job["tok"]),
        model=str(job["model"]),
        out=str(out),
        format="speculators",
        layers="1,2,3",
        gpus="cpu",
        batch_tokens=512,
        verify=2,
        progress=False,
        **kw,
    )


def _files(out: Path) -> dict[str, tuple[int, int]]:
    folder = out / "hidden_states"
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in folder.iterdir()
        if not p.name.startswith(".")
    }


def _rows_of(out: Path) -> dict[str, int]:
    return {r["id"]: r["row"] for r in pq.read_table(out / "hidden_index.parquet").to_pylist()}


def test_partitions_over_ray_make_the_one_process_set(
    ray_local: Any, job: dict[str, Any], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    single = hidden_states(_config(job, tmp_path / "single"), log=None)
    assert single.complete
    lines: list[str] = []
    result = run(
        _config(job, tmp_path / "ray"),
        RayHiddenOptions(partitions=4, gpus_per_task=0.0),
        log=lines.append,
    )
    assert result.complete and not result.failed_partitions, summary_lines(result)
    assert sum(r.written for r in result.results) == 60  # each sample once, by one partition
    assert len(result.results) == 4
    assert sorted(_files(tmp_path / "ray")) == sorted(_files(tmp_path / "single"))
    for name in _files(tmp_path / "single"):
        a = load_file(str(tmp_path / "ray" / "hidden_states" / name))
        b = load_file(str(tmp_path / "single" / "hidden_states" / name))
        assert torch.equal(a["token_ids"], b["token_ids"])
        # other batches (each partition batches its own samples): the same states up to the
        # rounding batching may change, a few bf16 steps at the layer's largest magnitude
        x, y = a["hidden_states"].float(), b["hidden_states"].float()
        for layer in range(x.shape[1]):
            step = 2.0 ** (math.floor(math.log2(float(y[:, layer].abs().max()))) - 7)
            assert float((x[:, layer] - y[:, layer]).abs().max()) <= 4 * step, (name, layer)
    # the set's own files are the same as one process writes them
    for name in ("hidden_index.parquet", "state.json"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "single" / name).read_bytes()
    assert any("complete" in line for line in summary_lines(result))


def test_each_partition_resumes_on_its_own(
    ray_local: Any, job: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "set"
    first = run(_config(job, out), RayHiddenOptions(partitions=4, only=[1, 3], gpus_per_task=0.0))
    assert not first.complete and not first.failed_partitions
    rows = _rows_of(out)
    have = _files(out)
    mine = {f"hs_{rows[i]}.safetensors" for i in job["ids"] if Partition(1, 4).contains(i)}
    mine |= {f"hs_{rows[i]}.safetensors" for i in job["ids"] if Partition(3, 4).contains(i)}
    assert set(have) == mine  # exactly partitions 1 and 3, nothing of the others
    second = run(_config(job, out), RayHiddenOptions(partitions=4, gpus_per_task=0.0))
    assert second.complete
    assert sum(r.written for r in second.results) == 60 - len(mine)
    after = _files(out)
    assert {k: after[k] for k in have} == have  # nothing of the first command rewritten
    # a single process on the finished set finds nothing to do
    again = hidden_states(_config(job, out), log=None)
    assert again.written == 0 and again.complete


def test_one_partition_in_one_process(job: dict[str, Any], tmp_path: Path) -> None:
    """``--partition I/P`` without Ray: one machine takes one share, under its own lease."""
    out = tmp_path / "set"
    s = hidden_states(_config(job, out, partition="2/3"), log=None)
    want = sum(1 for i in job["ids"] if Partition(2, 3).contains(i))
    assert s.written == want and s.remaining == 60 - want
    assert (out / "lease" / "scopes" / "part-2-of-3").exists()


def test_vllm_engine_partitions_over_the_fleet_nodes(ray_local: Any, tmp_path: Path) -> None:
    """``--engine vllm --ray``: each partition task drives the fleet its node sees (here the
    simulator speaking vLLM's hidden-states protocol), into the one set."""
    from tests.integration.hidden.simfleet import (
        AUX,
        HIDDEN,
        LAYERS,
        sim_config,
        write_model,
    )
    from tests.integration.hidden.simfleet import write_samples as sim_samples

    from draftdata.sim.hidden import states_for
    from draftdata.sim.run import SimFleet

    staging = tmp_path / "staging"
    staging.mkdir()
    model = write_model(tmp_path / "model")
    samples = sim_samples(tmp_path / "tok", 40)
    with SimFleet(n=2, config=sim_config(staging)) as fleet:
        fleet_yaml = fleet.write(tmp_path / "fleet.yaml")
        config = HiddenConfig(
            tokenized=str(tmp_path / "tok"), model=str(model), out=str(tmp_path / "set"),
            format="speculators", layers=",".join(map(str, AUX)), engine="vllm",
            batch_tokens=400, verify=2, progress=False, options={"fleet": str(fleet_yaml)},
        )  # fmt: skip
        result = run(config, RayHiddenOptions(partitions=3, gpus_per_task=0.0, tasks_per_node=2))
    assert result.complete and not result.failed_partitions, summary_lines(result)
    from safetensors.torch import load_file

    for sid, row in _rows_of(tmp_path / "set").items():
        got = load_file(str(tmp_path / "set" / "hidden_states" / f"hs_{row}.safetensors"))
        want = states_for(samples[sid], [*AUX, LAYERS], HIDDEN)
        assert torch.equal(got["hidden_states"].float(), torch.from_numpy(want))
    assert list(staging.iterdir()) == []


@pytest.mark.timeout(300)
@settings(
    max_examples=4,
    deadline=None,
    phases=(Phase.generate,),  # no shrinking: each failing example waits the whole join
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cpus=st.floats(min_value=2.01, max_value=4096.0, allow_nan=False))
def test_a_task_no_node_can_run_is_refused_in_one_line(
    ray_local: Any, job: dict[str, Any], cpus: float
) -> None:
    """A partition task asking more than any node has (here: more CPUs than the 2-CPU local
    cluster's one node) is refused before anything is submitted, in one line naming what each
    node has. Before, Ray kept every such task pending, waiting for a node that could run it,
    and the driver waited for their results for ever."""
    refused_at_once(
        lambda: run(
            _config(job, job["base"] / f"refused-{cpus}"),
            RayHiddenOptions(partitions=2, gpus_per_task=0.0, cpus_per_task=cpus),
            log=lambda _line: None,
        ),
        "hidden-states --ray",
        cpus,
    )
    assert not (job["base"] / f"refused-{cpus}" / "hidden_states").exists()
