"""The pure parts of the Ray drivers: per-partition configs, paths, summaries, counters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from draftdata.distributed.partition_task import _partition_config
from draftdata.distributed.ray_generate import (
    PartitionOutcome,
    RayGenerateResult,
    RayOptions,
    _absolute,
    summary_lines,
)
from draftdata.generate.config import GenerateConfig
from draftdata.generate.prompts.partition import Partition


def test_partition_config_carries_partition_writer_and_node_fleet() -> None:
    base = GenerateConfig(prompts="p.jsonl", out="s3://b/run", fleet="/etc/fleet.yaml")
    cfg, kwargs = _partition_config(base, Partition(3, 8), "p0003-h-1-ab", None, ["http://x:1"])
    assert kwargs == {}  # the config has the fields: nothing travels beside it
    assert (cfg.partition, cfg.writer_id) == ("3/8", "p0003-h-1-ab")
    assert (cfg.fleet, cfg.endpoints, cfg.progress) == (None, ["http://x:1"], "off")
    cfg, _ = _partition_config(base, Partition(0, 2), "w", "/n/fleet-a.yaml", [])
    assert (cfg.fleet, cfg.endpoints) == ("/n/fleet-a.yaml", [])
    assert cfg.out == base.out and cfg.prompts == base.prompts
    # a Ray retry waits for a zombie of the last attempt that still holds the partition's lease
    assert cfg.lease_wait == 10 * base.lease_ttl and cfg.lease_ttl == base.lease_ttl


def test_local_paths_become_absolute_for_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg, opts = _absolute(
        GenerateConfig(prompts="prompts/", out="run", fleet="fleet.yaml"),
        RayOptions(fleet_per_node="fleets/fleet-{node}.yaml"),
    )
    assert cfg.prompts == os.path.join(tmp_path, "prompts")
    assert (cfg.out, cfg.fleet) == (str(tmp_path / "run"), str(tmp_path / "fleet.yaml"))
    assert opts.fleet_per_node == str(tmp_path / "fleets/fleet-{node}.yaml")
    s3, _ = _absolute(GenerateConfig(prompts="/p", out="s3://bucket/run/"), RayOptions())
    assert s3.out == "s3://bucket/run/" and s3.fleet is None


def _outcome(index: int, state: str, nodes: list[str], committed: int) -> PartitionOutcome:
    return PartitionOutcome(
        index=index,
        state=state,
        nodes=nodes,
        attempts=len(nodes),
        committed=committed,
        failed=0,
        tokens=committed * 10,
        error=None if state == "done" else "FleetError: no endpoint answered",
    )


def test_summary_lists_nodes_retries_and_how_to_resume() -> None:
    result = RayGenerateResult(
        out="s3://b/run",
        partitions=3,
        outcomes=[
            _outcome(0, "done", ["gpu1"], 30),
            _outcome(1, "done", ["gpu1", "gpu2"], 10),
            _outcome(2, "failed", ["gpu2"], 0),
        ],
        nodes={
            "gpu1": {"committed": 35, "tokens": 350, "partitions": 1},
            "gpu2": {"committed": 5, "tokens": 50, "partitions": 1},
        },
        committed=40,
        tokens=400,
        wall_s=10.0,
    )
    assert result.failed_partitions == [2]
    lines = summary_lines(result)
    assert lines[0].startswith("ray generate: 40 records committed (400 output tokens)")
    assert "  node gpu1: 1 partition(s), 35 records (88%), 35 output tok/s" in lines
    assert "  partition 1: done after 2 attempt(s) on gpu1 -> gpu2" in lines
    assert any(line.startswith("  partition 2: failed") and "no endpoint" in line for line in lines)
    assert lines[-1].endswith("partitions not finished: 2")


def test_tokenize_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.data")
    import ray

    from draftdata.distributed.ray_tokenize import _counters, _for_workers, _task_pool
    from draftdata.tokenize.config import TokenizeConfig
    from draftdata.tokenize.encode import Counters

    c = Counters()
    c.add("samples", 3)
    c.add_sample("math", tokens=20, loss_tokens=7)
    c.mismatches.append("x: token 0")
    back = _counters(c.to_dict())
    assert back.to_dict() == c.to_dict()

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    cfg = _for_workers(TokenizeConfig(run="run", tokenizer="tok", out=None))
    assert cfg.run == str(tmp_path / "run") and cfg.out == str(tmp_path / "run" / "tokenized")
    assert cfg.tokenizer == str(tmp_path / "tok")
    assert _for_workers(TokenizeConfig(run="s3://b/r", tokenizer="Qwen/Qwen3-8B")).tokenizer == (
        "Qwen/Qwen3-8B"  # not a local folder: left as given
    )
    assert _task_pool(ray, None) == {}
    pool = _task_pool(ray, 2)
    assert list(pool) in (["compute"], ["concurrency"])
    if "compute" in pool:
        assert isinstance(pool["compute"], ray.data.TaskPoolStrategy)
