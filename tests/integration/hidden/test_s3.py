"""A hidden-state set on S3 (moto's server over a real socket): the files boto3 lists are the
index's, each holds its sample, a rerun rewrites no object (ETags and times unchanged), and a
changed setting is refused there too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3
from tests.integration.hidden.helpers import samples_of

from draftdata.errors import RunMismatchError
from draftdata.hidden.config import HiddenConfig
from draftdata.hidden.setfiles import read_set
from draftdata.hidden.stage import hidden_states
from draftdata.hidden.writers import writer_for

pytestmark = pytest.mark.integration


def _objects(moto_s3: MotoS3, url: str) -> dict[str, tuple[str, Any]]:
    prefix = url.split("/", 3)[3] + "/"
    s3: Any = moto_s3.client()
    out: dict[str, tuple[str, Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=moto_s3.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) :]] = (o["ETag"], o["LastModified"])
    return out


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_a_set_on_s3(tokenized: tuple[Path, str], target: Path, moto_s3: MotoS3, fmt: str) -> None:
    tok_dir, _ = tokenized
    url = moto_s3.url(f"hidden-{fmt}")
    config = HiddenConfig(tokenized=str(tok_dir), model=str(target), out=url, format=fmt,  # type: ignore[arg-type]
                          gpus="cpu", batch_tokens=600, staging_bytes=1 << 20)  # fmt: skip
    first = hidden_states(config, log=None)
    assert first.complete and first.verification is not None and first.verification.passed
    objects = _objects(moto_s3, url)
    hs = read_set(url)
    index = hs.index.to_pylist()
    assert {k for k in objects if k.startswith("hidden_states/")} == {r["file"] for r in index}
    if fmt == "speculators":
        assert {"state.json", "dataset_info.json", "data-00000-of-00001.arrow"} <= set(objects)
    w = writer_for(fmt)
    samples = samples_of(tok_dir)
    for r in index:
        stored = w.decode(hs.store.read(r["file"]))
        assert stored.input_ids.tolist() == samples[r["id"]]["input_ids"]
    again = hidden_states(config, log=None)
    assert again.written == 0 and again.done_before == len(index)
    after = _objects(moto_s3, url)
    assert {k: after[k] for k in objects} == objects  # no object written again
    with pytest.raises(RunMismatchError, match="changed: dtype"):
        hidden_states(HiddenConfig(**{**{f: getattr(config, f) for f in config.__struct_fields__},
                                      "dtype": "fp32"}), log=None)  # fmt: skip
