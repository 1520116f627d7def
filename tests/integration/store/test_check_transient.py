"""`draftdata run check --quarantine` on S3 that fails reads now and then (moto's server behind
a proxy that answers random GETs of the shards with 503 SlowDown or a dropped connection):
a shard the store failed to read is reported "not read now" and never set aside; only a shard
whose bytes are damaged is, and checking again until every shard is read sets aside exactly
the damaged ones, whatever the faults hit."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.conftest import MotoS3
from tests.integration.generate.s3_outage import S3Outage

from draftdata.cli import main
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration

PROMPTS = 60


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished local run of 60 prompts in several completions shards (copied to S3 per
    example)."""
    root = tmp_path_factory.mktemp("check-transient")
    prompts = root / "prompts.jsonl"
    with prompts.open("w") as fh:
        for i in range(PROMPTS):
            m = [{"role": "user", "content": f"Question {i}: what is {i} + 3?"}]
            fh.write(json.dumps({"id": f"q{i:03d}", "messages": m}) + "\n")
    # answers slow enough that the committer writes a shard every few of them
    sim = SimConfig(time_scale=0.05, mean_output_tokens=30, tool_call_rate=0.0, max_running=2)
    with SimFleet(1, sim) as fleet:
        config = GenerateConfig(
            prompts=str(prompts), endpoints=fleet.urls, out=str(root / "run"),
            progress="off", max_tokens=60, flush_records=10, flush_seconds=0.2,
        )  # fmt: skip
        generate(config, handle_signals=False, log=lambda _line: None)
    assert len(list((root / "run" / "completions").glob("*.parquet"))) >= 3
    return root / "run"


@pytest.fixture
def proxy(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Outage]:
    """The flaky proxy, with botocore's own retries off so that each fault reaches draftdata
    (as after the client's retries ran out)."""
    with S3Outage(moto_s3.endpoint_url) as running:
        monkeypatch.setenv("AWS_ENDPOINT_URL", running.url)
        monkeypatch.setenv("DRAFTDATA_S3_MAX_ATTEMPTS", "1")
        yield running


def _damaged(data: bytes, rng: random.Random) -> bytes:
    """``data`` cut short at a random place (a copy that stopped early: no footer)."""
    return data[: rng.randrange(0, len(data) - 8)]


def _upload(client: Any, bucket: str, prefix: str, run: Path, damage: set[str], seed: int) -> None:
    rng = random.Random(seed)
    for path in sorted(run.rglob("*")):
        key = path.relative_to(run).as_posix()
        if path.is_dir() or key.startswith("lease/") or path.name.startswith("."):
            continue
        data = path.read_bytes()
        if key in damage:
            data = _damaged(data, rng)
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)


def _check(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, str]:
    capsys.readouterr()
    try:
        main(["run", "check", url, "--quarantine"])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@settings(
    max_examples=8,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example is dozens of checks
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    rate=st.floats(0.05, 0.5),
    damage=st.integers(0, 2),
)
def test_a_read_the_store_failed_never_sets_a_healthy_shard_aside(
    local_run: Path,
    moto_s3: MotoS3,
    proxy: S3Outage,
    capsys: pytest.CaptureFixture[str],
    seed: int,
    rate: float,
    damage: int,
) -> None:
    rng = random.Random(seed)
    shards = sorted(
        p.relative_to(local_run).as_posix()
        for kind in ("completions", "failures")
        for p in (local_run / kind).glob("*.parquet")
    )
    damaged = set(rng.sample(shards, min(damage, len(shards) - 1)))
    url = moto_s3.url("check-transient")
    prefix = url.split("/", 3)[3]
    client: Any = moto_s3.client()
    _upload(client, moto_s3.bucket, prefix, local_run, damaged, seed)
    proxy.flaky("/completions/", rate, rng, first=True)  # at least one read fails

    failed_before = proxy.failed
    outputs = []
    for _ in range(40):  # check again while shards are left not read (each has rate < 1/2)
        code, out = _check(capsys, url)
        outputs.append(out)
        assert "Traceback" not in out
        if "not read now" not in out:
            break
        assert code == 1, out
        assert [line for line in out.splitlines() if line.startswith("error:")], out
    else:
        pytest.fail(f"shards still not read after 40 checks: {outputs[-1]}")
    assert proxy.failed > failed_before  # the faults reached the check
    listed = client.list_objects_v2(Bucket=moto_s3.bucket, Prefix=f"{prefix}/quarantine/")
    aside = {
        obj["Key"][len(prefix) + len("/quarantine/") : -len(".json")]
        for obj in listed.get("Contents", [])
    }
    assert aside == damaged, "\n---\n".join(outputs)
    assert code == 0, out
