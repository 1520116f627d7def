"""stats and report read straight from S3 (moto's server): runs, files, prefixes, a demo folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3
from tests.unit.report.fixtures import PLOT_IDS, demo_dir
from tests.unit.stats import builders as b

from draftdata.report import build_report
from draftdata.stats import compute_stats

pytestmark = pytest.mark.integration


def _upload(moto_s3: MotoS3, local: Path, url: str) -> None:
    client: Any = moto_s3.client()
    prefix = url.removeprefix(f"s3://{moto_s3.bucket}/")
    for path in sorted(local.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            client.put_object(Bucket=moto_s3.bucket, Key=key, Body=path.read_bytes())


def test_stats_and_report_from_s3(moto_s3: MotoS3, tmp_path: Path) -> None:
    local = demo_dir(tmp_path / "demo")
    b.write_jsonl(local / "extra" / "sf.jsonl", b.specforge_rows())
    (local / "extra" / "sf.json").write_text(json.dumps(b.specforge_rows()))
    url = moto_s3.url("demo")
    _upload(moto_s3, local, url)

    run = compute_stats(f"{url}/run")
    assert run.kind == "run" and run.domain_counts() == {"code": 4, "math": 2, "general": 1}
    assert run["failures"]["total"] == 2 and run["metrics"]["output_tokens"] == 800
    tok = compute_stats(f"{url}/tokenized/part-00000.parquet")
    assert tok.kind == "tokenized" and tok.length()["total"] == 35
    merged = compute_stats(f"{url}/merged")
    assert merged.rows == 9 and merged["files"] == 2
    for name in ("sf.jsonl", "sf.json"):
        conv = compute_stats(f"{url}/extra/{name}")
        assert conv.domain_counts() == {"code": 2, "general": 1, "math": 1}, name

    out = build_report(url, out=tmp_path / "report.html")
    text = out.read_text()
    for pid in PLOT_IDS:
        assert f'id="plot-{pid}"' in text
    assert f"{url}/merged/merge_report.json" in text
    one = build_report(f"{url}/extra/sf.jsonl", out=tmp_path / "one.html").read_text()
    assert 'id="plot-domain-mix"' in one and "sf.jsonl (conversations)" in one
