"""Done-set rollups: resume reads them instead of every shard, and never trusts them blindly."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.store.helpers import completion, failure

from draftdata.store import Run
from draftdata.store.rollup import rollup_table
from draftdata.store.write import parquet_bytes


@pytest.fixture(autouse=True)
def small_rollups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("draftdata.store.run.ROLLUP_EVERY", 4)


def _write(url: str, n: int) -> Run:
    run = Run.open(url, settings={}, flush_records=2, writer_id="w")
    for i in range(n):
        run.add_completion(completion(i))
        if run.flush_due():
            run.flush()
    run.add_failure(failure("fatal"))
    run.add_failure(failure("flaky", reason="exhausted_retries"))
    run.close()
    return run


def test_writer_rolls_up_and_resume_reads_the_rollups(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = _write(url, 13)
    keys = run.store.list()
    rollups = [k for k in keys if k.startswith("index/")]
    shards = [k for k in keys if k.startswith(("completions/", "failures/"))]
    assert len(shards) == 8 and len(rollups) == 2  # one after 4 shards, one at close
    again = Run.open(url, settings={})
    assert again.stats.get("store.resumed_rolled_up_shards") == 8
    assert (again.resumed_done, again.resumed_fatal) == (13, 1)
    assert again.is_done("p12") and again.is_done("fatal")
    assert not again.is_done("flaky") and not again.is_done("p13")


def test_rollup_rows_of_missing_shards_do_not_count(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = _write(url, 3)
    forged = rollup_table([("completions/part-gone-000000.parquet", ["ghost"], [0], None)])
    run.store.put_new("index/rollup-forged-000000.parquet", parquet_bytes(forged))
    (tmp_path / "run" / "index" / "rollup-junk-000000.parquet").write_bytes(b"not parquet")
    again = Run.open(url, settings={})
    assert not again.is_done("ghost")
    assert again.is_done("p2") and again.is_done("fatal")
    assert (again.resumed_done, again.resumed_fatal) == (3, 1)


def test_open_rolls_up_many_uncovered_shards(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = Run.open(url, settings={}, flush_records=1, writer_id="w")
    for i in range(6):
        run.add_completion(completion(i))
        run.flush()  # 6 shards; a kill -9 now would leave two uncovered ...
    for key in run.store.list("index/"):  # ... as would a run by a draftdata without rollups
        (tmp_path / "run" / key).unlink()
    first = Run.open(url, settings={})
    assert first.stats.get("store.resumed_rolled_up_shards") == 0
    assert first.stats.get("store.rollups") == 1
    second = Run.open(url, settings={})
    assert second.stats.get("store.resumed_rolled_up_shards") == 6
    assert (second.resumed_done, second.resumed_fatal) == (6, 0)
    assert all(second.is_done(f"p{i}") for i in range(6))


def test_completed_after_a_rolled_up_fatal_failure_is_completed(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _write(url, 8)
    retry = Run.open(url, settings={}, retry_failed=True, writer_id="w2")
    assert not retry.is_done("fatal")
    retry.add_completion(completion("fatal"))
    retry.close()
    again = Run.open(url, settings={})
    assert again.is_done("fatal") and again.resumed_fatal == 0


def test_a_resumed_writer_continues_its_rollup_numbers(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _write(url, 13)
    again = Run.open(url, settings={}, flush_records=1, writer_id="w")
    for i in range(100, 104):
        again.add_completion(completion(i))
        again.flush()
    assert again.stats.get("store.rollups") == 1
    assert again.stats.get("store.name_collisions") == 0
    assert "index/rollup-w-000002.parquet" in again.store.list("index/")
