"""``tokenize --ray`` (Ray Data) gives the single-process stage's samples, shards and summary.

Completions come from the real engine against the simulator (reasoning, multi-turn, half of
them with server token ids). The run is local here: the generate tests cover Ray workers on
S3, and the moto server shares this process's GIL, which would dominate the timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.integration.distributed.unplaceable import refused_at_once
from typer.testing import CliRunner

from draftdata.cli import app
from draftdata.distributed.ray_tokenize import RayTokenizeOptions, run
from draftdata.generate.config import GenerateConfig
from draftdata.shared.formats import SAMPLE_FORMAT, TOKENIZE_SUMMARY
from draftdata.sim.run import SimFleet
from draftdata.store import open_store
from draftdata.store.read import read_shard, shard_keys
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize

pytestmark = [
    pytest.mark.integration,
    pytest.mark.ray,
    # Ray Data's DataContext sets its own deprecated fields when it is copied to a task.
    pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\.data"),
]


def _write_prompts(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            messages: list[dict[str, str]] = [{"role": "user", "content": f"explain {i} ü"}]
            if i % 4 == 0:  # multi-turn: the engine regenerates both assistant turns
                messages += [
                    {"role": "assistant", "content": "old"},
                    {"role": "user", "content": "and then?"},
                ]
            domain = ("code", "math", "general")[i % 3]
            fh.write(json.dumps({"id": f"t{i:03d}", "domain": domain, "messages": messages}))
            fh.write("\n")
    return path


def _samples(url: str) -> dict[str, tuple[list[int], list[int], int, bool]]:
    store = open_store(url)
    rows: dict[str, tuple[list[int], list[int], int, bool]] = {}
    for key in shard_keys(store, ""):
        table = read_shard(store, key, SAMPLE_FORMAT).to_pylist()
        for r in table:
            assert r["id"] not in rows, f"sample {r['id']} twice"
            rows[r["id"]] = (r["input_ids"], r["loss_mask"], r["num_loss_tokens"], r["truncated"])
    return rows


def test_ray_data_tokenize_equals_single_process(
    ray_local: Any, demo_tokenizer: Path, tmp_path: Path
) -> None:
    from draftdata.generate.stage import generate
    from draftdata.sim.config import SimConfig

    run_url = str(tmp_path / "run")
    prompts = _write_prompts(tmp_path / "prompts.jsonl", 40)
    # The simulator with the tokenizer tokenize uses: made-up ids would be dropped unverified.
    config = SimConfig(
        mean_output_tokens=24, min_output_tokens=8, time_scale=0.1, seed=3,
        tokenizer=str(demo_tokenizer),
    )  # fmt: skip
    with SimFleet(2, config) as fleet:
        for part, ids in (("0/2", "on"), ("1/2", "off")):  # half the completions carry ids
            generate(
                GenerateConfig(
                    prompts=str(prompts),
                    out=run_url,
                    endpoints=fleet.urls,
                    max_tokens=48,
                    partition=part,
                    token_ids=ids,  # type: ignore[arg-type]
                    flush_records=8,
                    progress="off",
                )
            )
    base = TokenizeConfig(run=run_url, tokenizer=str(demo_tokenizer), batch_rows=5)
    single = tokenize(msgspec_replace(base, out=f"{run_url}-single"))
    result = run(msgspec_replace(base, out=f"{run_url}-ray"), RayTokenizeOptions(concurrency=2))
    assert result.tasks == result.inputs > 1
    ray_summary = result.summary

    assert ray_summary.counts == single.counts and ray_summary.domains == single.domains
    assert single.count("path.token_ids") > 0 and single.count("path.rendered") > 0
    assert single.count("split_turns") > 0
    samples = _samples(f"{run_url}-single")
    assert len(samples) == single.count("samples") > 40
    assert _samples(f"{run_url}-ray") == samples  # same ids, tokens and masks
    a, b = open_store(f"{run_url}-single"), open_store(f"{run_url}-ray")
    names = sorted(k for k in a.list() if k.endswith(".parquet"))
    assert names == sorted(k for k in b.list() if k.endswith(".parquet"))
    assert all(a.read(k) == b.read(k) for k in names)  # the very same shards
    doc_a, doc_b = (json.loads(s.read(TOKENIZE_SUMMARY.name)) for s in (a, b))
    assert {**doc_a, "out": None} == {**doc_b, "out": None}

    # The CLI's --ray on the finished output: recognised, nothing redone.
    args = ["tokenize", run_url, "--tokenizer", str(demo_tokenizer), "--batch-rows", "5"]
    cli = CliRunner().invoke(app, [*args, "--out", f"{run_url}-ray", "--ray"])
    assert cli.exit_code == 0, cli.output
    assert "already holds these samples" in cli.output

    # Conversation files (the run exported, in two files): Ray gives the same shards too.
    from draftdata.export.stage import export_run

    chats = tmp_path / "chats"
    export_run(run_url, "sharegpt", chats / "all.jsonl")
    lines = (chats / "all.jsonl").read_text().splitlines(keepends=True)
    (chats / "b.jsonl").write_text("".join(lines[20:]))
    (chats / "a.jsonl").write_text("".join(lines[:20]))
    (chats / "all.jsonl").unlink()
    conv = TokenizeConfig(run=str(chats), tokenizer=str(demo_tokenizer), batch_rows=7)
    single_c = tokenize(msgspec_replace(conv, out=str(tmp_path / "chats-single")))
    ray_c = run(msgspec_replace(conv, out=str(tmp_path / "chats-ray")), RayTokenizeOptions())
    assert ray_c.tasks == 2 and ray_c.summary.counts == single_c.counts
    assert _samples(str(tmp_path / "chats-ray")) == _samples(str(tmp_path / "chats-single"))


def msgspec_replace(config: TokenizeConfig, **changes: Any) -> TokenizeConfig:
    import msgspec

    return msgspec.structs.replace(config, **changes)


@pytest.mark.timeout(300)
@settings(
    max_examples=3,
    deadline=None,
    phases=(Phase.generate,),  # no shrinking: each failing example waits the whole join
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cpus=st.floats(min_value=2.01, max_value=4096.0, allow_nan=False))
def test_a_task_no_node_can_run_is_refused_in_one_line(
    ray_local: Any, demo_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory, cpus: float
) -> None:
    """Ray Data tasks asking more CPUs than any node has (the 2-CPU local cluster's one node)
    are refused before the job starts, in one line naming what the nodes have. Before, Ray
    Data kept them waiting for such a node and the command waited for ever."""
    base = tmp_path_factory.mktemp("refused")
    chats = base / "chats"
    chats.mkdir()
    rows = [
        {"messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(3)
    ]
    (chats / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = TokenizeConfig(run=str(chats), tokenizer=str(demo_tokenizer), out=str(base / "out"))
    refused_at_once(
        lambda: run(config, RayTokenizeOptions(cpus_per_task=cpus)), "tokenize --ray", cpus
    )
