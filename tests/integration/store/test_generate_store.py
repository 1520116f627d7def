"""The store's safety rules seen through the real `draftdata generate` and the simulator:
protected prefixes and foreign prefixes are refused before any chat request is sent, a changed
config is refused naming the setting, and --retry-failed / --allow-config-change work."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3

from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store import iter_completions, iter_failures, read_manifest

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(n=1, config=SimConfig(time_scale=0.0, context_length=256)) as f:
        yield f


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("p") / "prompts.jsonl"
    rows = [
        {"id": f"g{i}", "messages": [{"role": "user", "content": f"question {i}"}]}
        for i in range(6)
    ]
    rows.append({"id": "long", "messages": [{"role": "user", "content": "word " * 400}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _generate(
    fleet: SimFleet, prompts: Path, out: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = [*CLI, "generate", "--prompts", str(prompts), "--endpoint", fleet.urls[0]]
    cmd += ["--out", out, "--max-tokens", "32", "--progress", "off", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)


def _chat_requests(fleet: SimFleet) -> int:
    return fleet.stats(0).requests


def test_protected_s3_prefix_refused_before_any_request(
    fleet: SimFleet, prompts: Path, moto_s3: MotoS3
) -> None:
    client: Any = moto_s3.client()
    live = moto_s3.url("completions")
    key = live.split("/", 3)[3] + "/part-0.parquet"
    client.put_object(Bucket=moto_s3.bucket, Key=key, Body=b"live data")
    before = _chat_requests(fleet)
    for out in (live, live + "/expansion_v1", live.rsplit("/", 1)[0]):
        res = _generate(fleet, prompts, out, "--protect", live)
        assert res.returncode == 1, res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert "protected prefix" in last and "part-0.parquet" in last
        assert "Traceback" not in res.stderr
    assert _chat_requests(fleet) == before
    assert client.get_object(Bucket=moto_s3.bucket, Key=key)["Body"].read() == b"live data"
    listed = client.list_objects_v2(Bucket=moto_s3.bucket, Prefix=live.split("/", 3)[3])
    assert [o["Key"] for o in listed["Contents"]] == [key]


def test_foreign_prefix_refused_and_config_change_rules(
    fleet: SimFleet, prompts: Path, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    before = _chat_requests(fleet)
    res = _generate(fleet, prompts, str(foreign))
    assert res.returncode == 1 and "holds no draftdata manifest" in res.stderr
    assert "notes.txt" in res.stderr and _chat_requests(fleet) == before
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]

    out = str(tmp_path / "run")
    first = _generate(fleet, prompts, out)
    assert first.returncode == 0, first.stderr
    assert sorted(c.id for c in iter_completions(out)) == [f"g{i}" for i in range(6)]
    assert [(f.id, f.reason) for f in iter_failures(out)] == [("long", "context_length")]

    sent = _chat_requests(fleet)
    changed = _generate(fleet, prompts, out, "--max-tokens", "16")
    assert changed.returncode == 1 and "max_tokens: 32 -> 16" in changed.stderr
    assert _chat_requests(fleet) == sent

    # resume skips completed and fatally failed prompts; --retry-failed tries "long" again
    assert _generate(fleet, prompts, out).returncode == 0
    assert _chat_requests(fleet) == sent
    retried = _generate(fleet, prompts, out, "--retry-failed")
    assert retried.returncode == 0 and _chat_requests(fleet) == sent + 1

    allowed = _generate(fleet, prompts, out, "--max-tokens", "16", "--allow-config-change")
    assert allowed.returncode == 0, allowed.stderr
    history = read_manifest(out)["history"]
    assert history[-1]["changes"] == ["max_tokens: 32 -> 16"]
    assert len(list(iter_completions(out))) == 6  # nothing generated twice
