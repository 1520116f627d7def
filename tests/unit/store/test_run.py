"""The Run writer on a local store: commit, resume, refusals."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.store.helpers import completion, failure

from draftdata.errors import ProtectedPrefixError, RunMismatchError, TransientStoreError
from draftdata.store import Run, iter_completions, iter_failures, read_manifest, read_metrics
from draftdata.store.local import LocalStore

SETTINGS = {"model": "m", "sampling": {"temperature": 0.6}, "prompts": "sha1:abc"}


def test_commit_and_resume(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = Run.open(url, settings=SETTINGS, flush_records=3, writer_id="w1")
    for i in range(7):
        assert run.add_completion(completion(i))
    assert not run.add_completion(completion(3))  # a duplicate is dropped
    run.add_failure(failure("bad"))
    run.add_failure(failure("flaky", reason="exhausted_retries"))
    assert run.flush_due()
    assert run.flush() == 9
    run.write_metrics({"done": 7})
    run.close()
    keys = run.store.list()
    assert "completions/part-w1-000000.parquet" in keys
    assert "failures/part-w1-000001.parquet" in keys

    again = Run.open(url, settings=SETTINGS, writer_id="w1")
    assert again.is_done("p0") and again.is_done("p6") and not again.is_done("p7")
    assert again.is_done("bad")  # fatal: skipped on resume
    assert not again.is_done("flaky")  # retryable: tried again
    assert (again.resumed_done, again.resumed_fatal) == (7, 1)
    again.add_completion(completion("flaky"))
    again.close()
    assert "completions/part-w1-000002.parquet" in again.store.list()  # seq continues
    retry = Run.open(url, settings=SETTINGS, retry_failed=True)
    assert not retry.is_done("bad")

    ids = sorted(c.id for c in iter_completions(url))
    assert ids == sorted([f"p{i}" for i in range(7)] + ["flaky"])
    assert [f.id for f in iter_failures(url)] == ["bad"]  # flaky was resolved
    assert len(list(iter_failures(url, all_attempts=True))) == 2
    assert read_metrics(url)[0]["done"] == 7
    assert read_manifest(url)["format"] == "draftdata.run/1"


def test_flush_seconds_with_injected_clock(tmp_path: Path) -> None:
    now = [0.0]
    run = Run.open(
        str(tmp_path), settings={}, flush_records=100, flush_seconds=5, clock=lambda: now[0]
    )
    assert not run.flush_due()
    run.add_completion(completion(1))
    assert not run.flush_due()
    now[0] = 5.0
    assert run.flush_due()


def test_config_change_refused_then_recorded(tmp_path: Path) -> None:
    url = str(tmp_path)
    with Run.open(url, settings=SETTINGS) as run:
        run.add_completion(completion(1))
    changed = {**SETTINGS, "sampling": {"temperature": 0.7}}
    with pytest.raises(RunMismatchError, match=r"sampling\.temperature: 0\.6 -> 0\.7"):
        Run.open(url, settings=changed)
    Run.open(url, settings=changed, allow_config_change=True).close()
    manifest = read_manifest(url)
    assert manifest["settings"] == SETTINGS  # manifest.json is never rewritten
    assert manifest["history"][0]["changes"] == ["sampling.temperature: 0.6 -> 0.7"]
    Run.open(url, settings=changed).close()  # the new settings are now the run's


def test_non_empty_prefix_without_manifest_refused(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("{}\n")
    with pytest.raises(RunMismatchError, match=r"data\.jsonl"):
        Run.open(str(tmp_path), settings={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_protected_output_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ProtectedPrefixError):
        Run.open(str(tmp_path / "live" / "v2"), settings={}, protect=[str(tmp_path / "live")])
    assert not (tmp_path / "live").exists()


def test_existing_shard_name_is_never_overwritten(tmp_path: Path) -> None:
    run = Run.open(str(tmp_path), settings={}, writer_id="w")
    squatter = tmp_path / "completions" / "part-w-000000.parquet"
    squatter.parent.mkdir()
    squatter.write_bytes(b"not ours")
    run.add_completion(completion(1))
    run.close()
    assert squatter.read_bytes() == b"not ours"
    assert (tmp_path / "completions" / "part-w-000001.parquet").exists()
    assert run.stats.get("store.name_collisions") == 1


def test_failed_write_is_kept_and_retried_with_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run.open(str(tmp_path), settings={}, writer_id="w")
    real = LocalStore._put_new
    seen: list[tuple[str, bytes]] = []

    def flaky(self: LocalStore, key: str, data: bytes) -> None:
        seen.append((key, data))
        real(self, key, data)  # the write lands ...
        raise TransientStoreError("response lost")  # ... but the caller never hears back

    monkeypatch.setattr("draftdata.store.shards.WRITE_ATTEMPTS", 1)
    monkeypatch.setattr(LocalStore, "_put_new", flaky)
    run.add_completion(completion(1))
    with pytest.raises(TransientStoreError):
        run.flush()
    assert run.buffered == 1
    monkeypatch.setattr(LocalStore, "_put_new", real)
    run.add_completion(completion(2))
    assert run.flush() == 2
    # the retried shard found its own bytes: one object for p1, a new one for p2
    assert sorted(c.id for c in iter_completions(str(tmp_path))) == ["p1", "p2"]


def test_two_writers_share_one_run(tmp_path: Path) -> None:
    import threading

    url = str(tmp_path / "run")
    runs = [Run.open(url, settings=SETTINGS, flush_records=3) for _ in range(2)]
    assert runs[0].writer_id != runs[1].writer_id
    assert runs[0].manifest["run_id"] == runs[1].manifest["run_id"]  # one manifest, created once

    def work(k: int) -> None:
        for i in range(k, 40, 2):  # disjoint halves, e.g. partitions by id hash
            runs[k].add_completion(completion(i))
            if runs[k].flush_due():
                runs[k].flush()
        runs[k].close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged = Run.open(url, settings=SETTINGS)
    assert (merged.resumed_done, merged.resumed_fatal) == (40, 0)
    ids = sorted(c.id for c in iter_completions(url))
    assert ids == sorted(f"p{i}" for i in range(40))
    writers = {k.split("part-")[1].rsplit("-", 1)[0] for k in merged.store.list("completions/")}
    assert writers == {r.writer_id for r in runs}


def test_done_mask_matches_is_done(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    run = Run.open(url, settings=SETTINGS, flush_records=2)
    for i in range(5):
        run.add_completion(completion(i))
    run.add_completion(completion(1, sample=1))
    run.add_failure(failure("bad"))
    run.add_failure(failure("flaky", reason="exhausted_retries"))
    run.close()
    ids = ["p0", "p4", "p5", "bad", "flaky", "p1", "p1"]
    samples = [0, 0, 0, 0, 0, 1, 2]
    for r in (
        Run.open(url, settings=SETTINGS),
        Run.open(url, settings=SETTINGS, retry_failed=True),
    ):
        expected = [r.is_done(i, s) for i, s in zip(ids, samples, strict=True)]
        assert r.done_mask(ids, samples).tolist() == expected
    assert Run.open(url, settings=SETTINGS).done_mask(ids[:4]).tolist() == [True, True, False, True]


@settings(max_examples=25, deadline=None)
@given(
    completions=st.integers(min_value=0, max_value=20),
    failures=st.integers(min_value=0, max_value=5),
    outage_flushes=st.integers(min_value=1, max_value=3),
)
def test_buffered_never_dips_while_a_flush_encodes(
    completions: int, failures: int, outage_flushes: int
) -> None:
    """``buffered`` (what the engine's --max-uncommitted pause reads from another thread) counts
    the records a flush is encoding: it never dips below what waits, so dispatch does not resume
    for a moment in the middle of a store outage (found as a second 'dispatch paused' line)."""
    import draftdata.store.run as run_module

    with tempfile.TemporaryDirectory() as tmp:
        run = Run.open(tmp, settings={}, writer_id="w")
        seen: list[int] = []
        real_bytes = run_module.parquet_bytes

        def observing(table: object, **options: bool) -> bytes:
            seen.append(run.buffered)  # read mid-flush, as the engine's thread would
            return real_bytes(table, **options)  # type: ignore[arg-type]

        def down(self: LocalStore, key: str, data: bytes) -> None:
            raise TransientStoreError("store down")

        added = 0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(run_module, "parquet_bytes", observing)
            mp.setattr("draftdata.store.shards.WRITE_ATTEMPTS", 1)
            mp.setattr(LocalStore, "_put_new", down)
            for k in range(outage_flushes):
                for i in range(completions):
                    run.add_completion(completion(f"{k}-{i}"))
                for i in range(failures):
                    run.add_failure(failure(f"f{k}-{i}"))
                added += completions + failures
                if added:
                    with pytest.raises(TransientStoreError):
                        run.flush()
                assert run.buffered == added
                assert all(n == added for n in seen[-2:]), seen
                seen.clear()
        assert run.flush() == added  # the store is back: everything commits once
        assert run.buffered == 0
        run.close()


@settings(max_examples=25, deadline=None)
@given(
    failed=st.lists(st.sampled_from(["context_length", "invalid_request", "timeout"]), max_size=6),
    completed=st.integers(min_value=0, max_value=3),
    allow=st.booleans(),
)
def test_a_change_of_settings_retries_the_fatal_failures_once(
    failed: list[str], completed: int, allow: bool
) -> None:
    """Fatal failures answer the settings they were sent with. A run without a completion takes
    new settings (nothing committed disagrees with them); one with completions only with
    ``allow_config_change``. Either way the open that records the change retries the run's
    fatal failures (a limit that did not fit fails nothing under a smaller one); the next open
    with the same settings does not."""
    with tempfile.TemporaryDirectory() as tmp:
        url = str(Path(tmp) / "run")
        with Run.open(url, settings=SETTINGS) as run:
            for i in range(completed):
                run.add_completion(completion(f"c{i}"))
            for i, reason in enumerate(failed):
                run.add_failure(failure(f"f{i}", reason=reason))
        fatal = {f"f{i}" for i, r in enumerate(failed) if r != "timeout"}
        changed = {**SETTINGS, "max_tokens": 4096}
        if completed and not allow:
            with pytest.raises(RunMismatchError, match="max_tokens: \\(unset\\) -> 4096"):
                Run.open(url, settings=changed)
            return
        with Run.open(url, settings=changed, allow_config_change=allow) as again:
            assert again.changes == ["max_tokens: (unset) -> 4096"]
            assert not any(again.is_done(i) for i in fatal)
            assert all(again.is_done(f"c{i}") for i in range(completed))
        with Run.open(url, settings=changed) as third:
            assert third.changes == []
            assert all(third.is_done(i) for i in fatal)


def test_a_deferred_manifest_is_written_with_the_first_shard(tmp_path: Path) -> None:
    """Nothing is recorded before the first commit: no manifest, no metrics; ``settle``
    completes the settings until then; a second writer with other settings is refused."""
    url = str(tmp_path / "run")
    run = Run.open(url, settings=SETTINGS, defer_manifest=True, writer_id="w1")
    assert run.write_metrics({"done": 0}) is None
    run.close()
    assert not (tmp_path / "run" / "manifest.json").exists()
    run = Run.open(url, settings=SETTINGS, defer_manifest=True, writer_id="w2")
    run.settle(model="served")
    other = Run.open(url, settings=SETTINGS, defer_manifest=True, writer_id="w3")
    run.add_completion(completion(1))
    run.close()
    assert read_manifest(url)["settings"] == {**SETTINGS, "model": "served"}
    run.settle(model="late")  # written: the run is what it recorded
    assert read_manifest(url)["settings"]["model"] == "served"
    other.add_completion(completion(2))
    with pytest.raises(RunMismatchError, match="other settings"):
        other.flush()
    assert [c.id for c in iter_completions(url)] == ["p1"]
