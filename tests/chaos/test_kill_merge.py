"""kill -9 `merge` after any of its writes, then run it again: the rerun finishes the output
byte for byte as an uninterrupted merge writes it, a reader refuses the unfinished output
meanwhile, and a further rerun refuses clearly (local store, and on moto's S3 server). Two
merges into one output at once cooperate."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import MotoS3
from tests.unit.merge.helpers import file_hashes, token_samples

from draftdata.errors import AlreadyExistsError, InputError
from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge
from draftdata.stats.readers import open_dataset
from draftdata.store import open_store

pytestmark = pytest.mark.chaos

# The merge CLI, SIGKILLed by itself right after its KILL_AFTER-th object write (0: before any).
DRIVER = """
import os, signal, sys
from draftdata.store.base import Store
after = int(os.environ["KILL_AFTER"])
done = 0
put_new = Store.put_new
def dying_put_new(self, key, data):
    global done
    if done == after:
        os.kill(os.getpid(), signal.SIGKILL)
    put_new(self, key, data)
    done += 1
Store.put_new = dying_put_new
from draftdata.cli import main
main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("merge-in")
    existing = token_samples(root / "old", {"code": 300, "math": 60}, prefix="o", shards=3)
    added = token_samples(
        root / "new", {"math": 150, "general": 120}, prefix="n", shards=2, content_from=250
    )
    return existing, added


def _args(inputs: tuple[Path, Path], out: str, fmt: str) -> list[str]:
    existing, added = inputs
    return [
        "merge", "--existing", str(existing), "--add", str(added), "--out", out,
        "--mix", "code=0.5,math=0.3,general=0.2", "--format", fmt, "--shard-rows", "40",
        "--eval-fraction", "0.1", "-q",
    ]  # fmt: skip


def _config(inputs: tuple[Path, Path], out: str, fmt: str) -> MergeConfig:
    existing, added = inputs
    mix = {"code": 0.5, "math": 0.3, "general": 0.2}
    return MergeConfig(
        existing=[str(existing)], add=[str(added)], out=out, mix=mix, format=fmt,
        shard_rows=40, eval_fraction=0.1,
    )  # fmt: skip


def _objects(url: str) -> dict[str, str]:
    store = open_store(url)
    return {k: hashlib.sha256(store.read(k)).hexdigest() for k in store.list("")}


def _killed_then_rerun(inputs: tuple[Path, Path], out: str, fmt: str, after: int) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, *_args(inputs, out, fmt)],
        env={**os.environ, "KILL_AFTER": str(after)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    finished = "merge_report.json" in open_store(out).list("")
    if killed.returncode == 0:
        assert finished  # fewer writes than ``after``
    else:
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert not finished
        if open_store(out).list(""):  # its rows are a part: readers refuse it
            with pytest.raises(InputError, match="unfinished merge"):
                open_dataset(out)
        merge(_config(inputs, out, fmt))  # the same merge again finishes it
    with pytest.raises(AlreadyExistsError, match="finished merge"):
        merge(_config(inputs, out, fmt))


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(after=st.integers(0, 30), fmt=st.sampled_from(["parquet", "speculators"]))
def test_kill_9_merge_then_rerun_finishes_it_byte_identical(
    inputs: tuple[Path, Path], tmp_path: Path, after: int, fmt: str
) -> None:
    reference = tmp_path / f"reference-{fmt}"
    if not reference.exists():
        merge(_config(inputs, str(reference), fmt))
    expected = file_hashes(reference)
    assert len(expected) > 15  # shards, JSONL, card, report: kills land all over it
    out = tempfile.mkdtemp(dir=tmp_path) + "/out"
    _killed_then_rerun(inputs, out, fmt, after)
    assert file_hashes(Path(out)) == expected


def test_unfinished_merge_of_other_settings_is_refused(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    out = str(tmp_path / "out")
    subprocess.run(
        [sys.executable, "-c", DRIVER, *_args(inputs, out, "parquet")],
        env={**os.environ, "KILL_AFTER": "4"},
        capture_output=True,
        check=False,
        timeout=120,
    )
    before = file_hashes(Path(out))
    other = MergeConfig(**{**_fields(_config(inputs, out, "parquet")), "seed": 1})
    with pytest.raises(AlreadyExistsError, match="unfinished merge of other inputs or settings"):
        merge(other)
    assert file_hashes(Path(out)) == before  # nothing written


def _fields(config: MergeConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in config.__struct_fields__}


def test_two_merges_into_one_output_cooperate(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    merge(_config(inputs, str(reference), "parquet"))
    out = str(tmp_path / "out")
    cmd = [sys.executable, "-c", "from draftdata.cli import main; main()"]
    procs = [
        subprocess.Popen([*cmd, *_args(inputs, out, "parquet")], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    codes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    # both finish it (identical bytes), or the later one refuses the finished output
    assert all(rc == 0 or "finished merge" in err for rc, err in codes), codes
    assert any(rc == 0 for rc, _ in codes)
    assert file_hashes(Path(out)) == file_hashes(reference)


@pytest.mark.integration
def test_kill_9_merge_s3(moto_s3: MotoS3, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    merge(_config(inputs, str(reference), "parquet"))
    expected = file_hashes(reference)
    for after in (1, 7):
        out = moto_s3.url(f"chaos-merge-{after}")
        _killed_then_rerun(inputs, out, "parquet", after)
        assert _objects(out) == expected


def test_a_merge_that_fails_before_its_first_shard_leaves_no_claim(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    """An input that fails while merge reads it (after the output is checked) leaves no
    merge_config.json, so the corrected command into the same --out runs."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad"
    shutil.copytree(inputs[1], bad)  # a tokenized set with one shard lacking its token ids
    shard = sorted(bad.rglob("*.parquet"))[-1]
    pq.write_table(pa.table({"id": ["x1", "x2"], "domain": ["code", "math"]}), shard)
    out = str(tmp_path / "out")
    config = _config(inputs, out, "parquet")
    wrong = MergeConfig(
        existing=config.existing, add=[*config.add, str(bad)], out=out, mix=config.mix,
        format="parquet", shard_rows=40, eval_fraction=0.1,
    )  # fmt: skip
    with pytest.raises(InputError):
        merge(wrong)
    assert not Path(out, "merge_config.json").exists()
    summary = merge(config)
    assert summary.train_rows > 0
