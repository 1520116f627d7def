"""prepare reading s3:// sources (jsonl line by line, parquet via datasets) from a moto server."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftdata.errors import InputError
from draftdata.prepare.config import PrepareConfig, SourceConfig
from draftdata.prepare.stage import prepare

pytestmark = pytest.mark.integration


def _put(moto_s3: Any, url: str, body: bytes) -> None:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    moto_s3.client().put_object(Bucket=bucket, Key=key, Body=body)


def test_prepare_from_s3(moto_s3: Any, tmp_path: Path) -> None:
    base = moto_s3.url("prepare-src")
    tasks = [
        "sorts a list",
        "parses dates",
        "reads a csv",
        "zips files",
        "hashes text",
        "pings a host",
    ]
    lines = [json.dumps({"query": f"Write a python function that {t}"}) for t in tasks]
    lines.insert(2, "{broken json")
    _put(moto_s3, f"{base}/cf/part-0.jsonl", ("\n".join(lines) + "\n").encode())
    buf = io.BytesIO()
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"question": q, "answer": "x"}
                for q in ("Solve 2x = 8", "Factor x^2 - 1", "Is 91 prime?", "Sum 1..n")
            ]
        ),
        buf,
    )
    _put(moto_s3, f"{base}/wi/part-0.parquet", buf.getvalue())
    cfg = PrepareConfig(
        sources=[
            SourceConfig(
                name="cf", schema="query_response", path=f"{base}/cf/*.jsonl", domain="code"
            ),
            SourceConfig(name="wi", schema="question_answer", path=f"{base}/wi/part-0.parquet"),
        ],
        out=str(tmp_path / "out"),
    )
    result = prepare(cfg)
    by = {s["name"]: s for s in result.report["sources"]}
    assert by["cf"]["read"] == 7 and by["cf"]["rejected"] == {"bad_json": 1}
    assert by["wi"]["read"] == 4
    assert result.report["totals"]["taken"] == 10


def test_missing_s3_object_is_one_error(moto_s3: Any, tmp_path: Path) -> None:
    cfg = PrepareConfig(
        sources=[
            SourceConfig(
                name="gone", schema="query_response", path=moto_s3.url("nope") + "/x.jsonl"
            )
        ],
        out=str(tmp_path / "out"),
    )
    with pytest.raises(InputError, match="source gone"):
        prepare(cfg)
