"""The store and the Run against a real S3 API (moto in server mode on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3
from tests.unit.store.helpers import completion, failure

from draftdata.errors import AlreadyExistsError, ProtectedPrefixError
from draftdata.store import Run, iter_completions, iter_failures, open_store
from draftdata.store.s3 import _client

pytestmark = pytest.mark.integration


def test_conditional_put_and_ranged_reads(moto_s3: MotoS3) -> None:
    store = open_store(moto_s3.url("put"))
    store.put_new("a/b.bin", b"hello")
    with pytest.raises(AlreadyExistsError, match="412"):
        store.put_new("a/b.bin", b"other")
    store.put_new("a/b.bin", b"hello")  # identical bytes: a landed retry counts as done
    assert store.read("a/b.bin") == b"hello" and store.read_range("a/b.bin", 1, 3) == b"ell"
    assert store.list() == ["a/b.bin"] and store.exists("a/b.bin") and not store.exists("zz")
    with store.open_input("a/b.bin") as fh:
        fh.seek(-2, 2)
        assert fh.read() == b"lo"


def test_run_resume_on_s3(moto_s3: MotoS3) -> None:
    url = moto_s3.url("run")
    run = Run.open(url, settings={"model": "m"}, flush_records=4)
    for i in range(10):
        run.add_completion(completion(i))
        if run.flush_due():
            run.flush()
    run.add_failure(failure("bad"))
    run.close()
    again = Run.open(url, settings={"model": "m"})
    assert (again.resumed_done, again.resumed_fatal) == (10, 1)
    assert again.is_done("p9") and again.is_done("bad")
    assert sorted(c.id for c in iter_completions(url)) == sorted(f"p{i}" for i in range(10))
    assert [f.id for f in iter_failures(url)] == ["bad"]


def test_protected_object_untouched_and_refused_before_requests(moto_s3: MotoS3) -> None:
    client: Any = moto_s3.client()
    live = moto_s3.url("completions")
    bucket, key = moto_s3.bucket, live.split("/", 3)[3] + "/part-0.parquet"
    client.put_object(Bucket=bucket, Key=key, Body=b"live training data")
    before = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    for out in (live, live + "/v2", live.rsplit("/", 1)[0]):
        with pytest.raises(ProtectedPrefixError, match=r"part-0\.parquet"):
            Run.open(out, settings={}, protect=[live])
    run = Run.open(moto_s3.url("expansion_v1"), settings={}, protect=[live])
    run.add_completion(completion(1))
    run.close()
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == before
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key.rsplit("/", 1)[0])["Contents"]
    assert [o["Key"] for o in listed] == [key]


def test_preexisting_shard_key_is_never_overwritten(moto_s3: MotoS3) -> None:
    url = moto_s3.url("squat")
    run = Run.open(url, settings={}, writer_id="w")
    client: Any = moto_s3.client()
    prefix = url.split("/", 3)[3]
    client.put_object(
        Bucket=moto_s3.bucket, Key=f"{prefix}/completions/part-w-000000.parquet", Body=b"x"
    )
    run.add_completion(completion(1))
    run.close()
    body = client.get_object(
        Bucket=moto_s3.bucket, Key=f"{prefix}/completions/part-w-000000.parquet"
    )
    assert body["Body"].read() == b"x"
    assert run.stats.get("store.name_collisions") == 1
    assert open_store(url).exists("completions/part-w-000001.parquet")


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


@pytest.fixture
def slowdown(moto_s3: MotoS3) -> Iterator[list[int]]:
    """Answer the next N PutObject calls with 503 SlowDown (botocore before-send hook)."""
    from botocore.awsrequest import AWSResponse

    left = [0]
    body = (
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    )

    def hook(request: Any, **_: Any) -> AWSResponse | None:
        if left[0] > 0 and request.method == "PUT":
            left[0] -= 1
            return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw(body))
        return None

    events = _client().meta.events
    events.register("before-send.s3.PutObject", hook)
    try:
        yield left
    finally:
        events.unregister("before-send.s3.PutObject", hook)


def test_transient_slowdown_is_retried(moto_s3: MotoS3, slowdown: list[int]) -> None:
    url = moto_s3.url("slow")
    run = Run.open(url, settings={})
    slowdown[0] = 3
    run.add_completion(completion(1))
    assert run.flush() == 1
    assert slowdown[0] == 0
    assert [c.id for c in iter_completions(url)] == ["p1"]


def test_datasets_loads_completions(moto_s3: MotoS3, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    run = Run.open(str(tmp_path / "run"), settings={}, flush_records=2)
    for i in range(5):
        run.add_completion(completion(i))
        if run.flush_due():
            run.flush()
    run.close()
    files = sorted(str(p) for p in (tmp_path / "run" / "completions").glob("*.parquet"))
    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "c")
    )
    assert sorted(ds["id"]) == [f"p{i}" for i in range(5)]
