"""``generate --prompts s3://...``: prompts read from a real S3 API (moto on 127.0.0.1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3
from tests.integration.generate.helpers import fast_config, write_prompts

from draftdata.errors import InputError
from draftdata.generate.prompts.source import prompt_files, scan
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


def _upload(moto_s3: MotoS3, prefix: str, folder: Path) -> None:
    client: Any = moto_s3.client()
    key_prefix = prefix.split("/", 3)[3]
    for f in sorted(folder.iterdir()):
        client.put_object(Bucket=moto_s3.bucket, Key=f"{key_prefix}/{f.name}", Body=f.read_bytes())


def test_prompts_from_an_s3_prefix_like_a_local_folder(moto_s3: MotoS3, tmp_path: Path) -> None:
    local = tmp_path / "prompts"
    local.mkdir()
    ids = write_prompts(local / "prompts-00000.jsonl", 30)
    ids += write_prompts(local / "prompts-00001.jsonl", 25, start=30)
    with (local / "prompts-00001.jsonl").open("a") as f:
        f.write('{"id": "broken", "messages": []}\n')
    (local / "rejects.jsonl").write_text(json.dumps({"id": "not a prompt"}) + "\n")
    url = moto_s3.url("prompts")
    _upload(moto_s3, url, local)

    files = prompt_files(url + "/")
    assert files == [f"{url}/prompts-00000.jsonl", f"{url}/prompts-00001.jsonl"]
    assert prompt_files(f"{url}/prompts-00001.jsonl") == [f"{url}/prompts-00001.jsonl"]
    # same names and bytes: the same identity as the local copy (a run may move between them)
    there = scan(files, limit=None, partition=None)
    here = scan(prompt_files(str(local)), limit=None, partition=None)
    assert there == here and there.prompts == 56
    with pytest.raises(InputError, match="no such object"):
        prompt_files(url + "/nope.jsonl")

    out = tmp_path / "run"
    with SimFleet(2, SimConfig(time_scale=0.002, mean_output_tokens=20)) as fleet:
        summary = generate(replace(fast_config(local, out, fleet.urls), prompts=url))
        # the same run resumed from the local copy: nothing is left to do
        again = generate(fast_config(local, out, fleet.urls))
    assert summary.completed == 55 and again.completed == 0 and again.already_done == 55
    assert check_exactly_once(str(out), set(ids)) == (55, 0)
    # each command lists the bad line it met, located in the file it read
    rows = [json.loads(f.read_text()) for f in (out / "rejects").iterdir()]
    assert sorted(r["location"] for r in rows) == sorted(
        [f"{url}/prompts-00001.jsonl:26", f"{local}/prompts-00001.jsonl:26"]
    )
