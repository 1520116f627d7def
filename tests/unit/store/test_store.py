"""The local create-only store."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftdata.errors import AlreadyExistsError, ConfigError, ProtectedPrefixError, StoreError
from draftdata.store.base import normalise_url
from draftdata.store.opener import open_store


def test_put_new_is_create_only(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    store.put_new("a/b.bin", b"one")
    with pytest.raises(AlreadyExistsError):
        store.put_new("a/b.bin", b"two")
    assert store.read("a/b.bin") == b"one"
    store.put_new("a/b.bin", b"one")  # identical bytes: a retry that had landed counts as done
    assert store.read_range("a/b.bin", 1, 5) == b"ne"
    assert store.size("a/b.bin") == 3 and store.exists("a/b.bin") and not store.exists("a/c")


def test_list_is_sorted_and_hides_temp_files(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    for key in ("z", "completions/b", "completions/a", "completionsX"):
        store.put_new(key, b"x")
    (tmp_path / "completions" / ".a.tmp-123").write_bytes(b"partial")
    assert store.list() == ["completions/a", "completions/b", "completionsX", "z"]
    assert store.list("completions/") == ["completions/a", "completions/b"]
    assert store.list("nothing/") == []
    with store.open_input("z") as fh:
        assert fh.read() == b"x"


def test_bad_keys_and_urls(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    for bad in ("", "/abs", "a/../b", "a//b"):
        with pytest.raises(StoreError):
            store.put_new(bad, b"x")
    with pytest.raises(StoreError):
        store.read("missing")
    with pytest.raises(ConfigError):
        open_store("gs://bucket/x")
    assert normalise_url("s3://b/a/") == "s3://b/a"
    assert normalise_url(f"file://{tmp_path}") == str(tmp_path.resolve())


def test_store_refuses_writes_under_protected_prefix(tmp_path: Path) -> None:
    store = open_store(str(tmp_path), protect=[str(tmp_path / "live")])
    with pytest.raises(ProtectedPrefixError, match="live"):
        store.put_new("live/part-0.parquet", b"x")
    store.put_new("livelier/part-0.parquet", b"x")


def test_put_new_file_streams_and_is_create_only(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    src = tmp_path / "export.jsonl"
    src.write_bytes(b"line\n" * 1000)
    store.put_new_file("out/export.jsonl", src)
    assert store.read("out/export.jsonl") == src.read_bytes()
    store.put_new_file("out/export.jsonl", src)  # identical bytes: done
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"LINE\n" * 1000)  # same size, other bytes
    with pytest.raises(AlreadyExistsError):
        store.put_new_file("out/export.jsonl", other)
    assert store.read("out/export.jsonl") == src.read_bytes()
    assert store.list() == ["out/export.jsonl"]  # no temp file left behind
