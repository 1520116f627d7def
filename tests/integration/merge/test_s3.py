"""merge against a real S3 server (moto): s3 input and output, create-only, same bytes as local."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3
from tests.unit.merge.helpers import file_hashes, token_samples

from draftdata.errors import AlreadyExistsError
from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge

pytestmark = pytest.mark.integration


def _objects(moto_s3: MotoS3, url: str) -> dict[str, str]:
    client: Any = moto_s3.client()
    prefix = url.removeprefix(f"s3://{moto_s3.bucket}/") + "/"
    out = {}
    for item in client.list_objects_v2(Bucket=moto_s3.bucket, Prefix=prefix).get("Contents", []):
        body = client.get_object(Bucket=moto_s3.bucket, Key=item["Key"])["Body"].read()
        out[item["Key"][len(prefix) :]] = hashlib.sha256(body).hexdigest()
    return out


def test_merge_reads_and_writes_s3_with_the_same_bytes_as_local(
    moto_s3: MotoS3, tmp_path: Path
) -> None:
    local_in = token_samples(tmp_path / "in", {"code": 300, "math": 100, "tool": 50}, prefix="s")
    client: Any = moto_s3.client()
    src = moto_s3.url("merge-in")
    for p in sorted(local_in.glob("*.parquet")):
        key = f"{src.removeprefix(f's3://{moto_s3.bucket}/')}/{p.name}"
        client.put_object(Bucket=moto_s3.bucket, Key=key, Body=p.read_bytes())
    mix = {"code": 0.5, "math": 0.3, "tool": 0.2}
    out = moto_s3.url("merge-out")
    s = merge(MergeConfig(existing=[src], mix=mix, out=out, eval_fraction=0.1, shard_rows=50))
    assert s.out == out
    remote = _objects(moto_s3, out)
    assert "merge_report.json" in remote and "README.md" in remote
    assert any(k.startswith("eval/") for k in remote)
    local = tmp_path / "local"
    merge(
        MergeConfig(
            existing=[str(local_in)], mix=mix, out=str(local), eval_fraction=0.1, shard_rows=50
        )
    )
    hashes = file_hashes(local)
    report = json.loads((local / "merge_report.json").read_text())
    assert report["inputs"][0]["path"] == str(local_in)
    # everything but the report and the config (which name their input paths) is
    # byte-identical
    named = ("merge_report.json", "merge_config.json")
    assert {k: v for k, v in remote.items() if k not in named} == {
        k: v for k, v in hashes.items() if k not in named
    }
    with pytest.raises(AlreadyExistsError, match="not empty"):
        merge(MergeConfig(existing=[src], mix=mix, out=out))
