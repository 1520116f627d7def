"""The live set on S3 (SpecForge JSONL under a prefix, as the walkthrough's
``s3://BUCKET/completions/``) tokenizes like the same file on disk, into S3, create-only."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.conftest import MotoS3

from draftdata.demo.existing import write_existing_set
from draftdata.store.opener import open_store
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize

pytestmark = pytest.mark.integration


def _samples(url: str) -> list[tuple[str, str, list[int], list[int]]]:
    store = open_store(url)
    rows = []
    for key in store.list(""):
        if key.endswith(".parquet"):
            table = pq.read_table(store.open_input(key))
            rows += [
                (r["id"], r["domain"], r["input_ids"], r["loss_mask"]) for r in table.to_pylist()
            ]
    return sorted(rows)


def test_the_live_set_on_s3_tokenizes_like_the_file(
    moto_s3: MotoS3, tmp_path: Path, demo_tokenizer: Path
) -> None:
    live = tmp_path / "live.jsonl"
    write_existing_set(live, rows=60, seed=0)
    prefix = moto_s3.url("live")
    open_store(f"{prefix}/completions/").put_new("part-0.jsonl", live.read_bytes())
    tok = str(demo_tokenizer)
    remote = tokenize(
        TokenizeConfig(run=f"{prefix}/completions/", tokenizer=tok, out=f"{prefix}/tokenized")
    )
    local = tokenize(TokenizeConfig(run=str(live), tokenizer=tok, out=str(tmp_path / "tok")))
    assert remote.counts == local.counts and remote.count("samples") >= 60
    assert _samples(f"{prefix}/tokenized") == _samples(str(tmp_path / "tok"))
    again = tokenize(
        TokenizeConfig(run=f"{prefix}/completions/", tokenizer=tok, out=f"{prefix}/tokenized")
    )
    assert again.counts == remote.counts  # finished: nothing redone
