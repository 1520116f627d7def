"""Reading sources: jsonl with bad lines, json arrays, parquet in record batches, globs, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import EmptyInputError, InputError, RowError
from draftdata.prepare.config import SourceConfig
from draftdata.prepare.load import iter_rows


def _src(path: Path | str, **kw: object) -> SourceConfig:
    return SourceConfig(name="s", schema="query_response", path=str(path), **kw)  # type: ignore[arg-type]


def test_jsonl_bad_lines_are_rows(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"query": "a"}\n\n{"query": \n\xff\xfe{"q": 1}\n[1, 2]\n')
    rows = list(iter_rows(_src(p)))
    assert [i for i, _ in rows] == [0, 1, 2, 3]
    assert rows[0][1] == {"query": "a"}
    assert isinstance(rows[1][1], RowError) and rows[1][1].reason == "bad_json"
    assert isinstance(rows[2][1], RowError) and rows[2][1].reason in (
        "undecodable_text",
        "bad_json",
    )
    assert rows[3][1] == [1, 2]


def test_json_array_and_glob_order(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text(json.dumps([{"query": "b1"}, {"query": "b2"}]))
    (tmp_path / "a.json").write_text(json.dumps([{"query": "a1"}]))
    rows = [r for _, r in iter_rows(_src(tmp_path / "*.json"))]
    assert rows == [{"query": "a1"}, {"query": "b1"}, {"query": "b2"}]


def test_parquet_in_record_batches(tmp_path: Path) -> None:
    pq.write_table(
        pa.Table.from_pylist([{"query": f"q{i}", "n": i} for i in range(5)]), tmp_path / "p.parquet"
    )
    rows = [r for _, r in iter_rows(_src(tmp_path / "p.parquet", max_rows=3))]
    assert rows == [{"query": "q0", "n": 0}, {"query": "q1", "n": 1}, {"query": "q2", "n": 2}]


def test_parquet_files_of_a_glob_in_order_across_batches(tmp_path: Path) -> None:
    """Several files, several row groups, more rows than one decoded batch: every row once,
    in file then row order, nested values as Python lists and dicts."""
    for name, lo in (("b.parquet", 3000), ("a.parquet", 0)):
        rows = [{"query": f"q{i}", "turns": [{"n": i}]} for i in range(lo, lo + 3000)]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / name, row_group_size=700)
    got = [r for _, r in iter_rows(_src(tmp_path / "*.parquet"))]
    assert got == [{"query": f"q{i}", "turns": [{"n": i}]} for i in range(6000)]


def test_unreadable_sources_name_themselves(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"source s: .*missing\.jsonl: no such file"):
        list(iter_rows(_src(tmp_path / "missing.jsonl")))
    with pytest.raises(InputError, match="matches no file"):
        list(iter_rows(_src(tmp_path / "*.jsonl")))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(InputError, match="cannot tell the format"):
        list(iter_rows(_src(tmp_path / "x.txt")))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match=r"source s: .*bad\.parquet: not a readable parquet"):
        list(iter_rows(_src(tmp_path / "bad.parquet")))


def test_the_content_says_json_lines_or_array_whatever_the_name(tmp_path: Path) -> None:
    """A ``.json`` file of JSON lines is read line by line, a ``.jsonl`` file holding one
    array element by element (the reader ``stats`` uses decides the same way); text that is
    neither is one bad row per line, located, not a dead source."""
    (tmp_path / "lines.json").write_text('{"query": "a"}\n{"query": "b"}\n')
    (tmp_path / "array.jsonl").write_text('[\n {"query": "c"},\n {"query": "d"}\n]\n')
    assert [r for _, r in iter_rows(_src(tmp_path / "lines.json"))] == [
        {"query": "a"},
        {"query": "b"},
    ]
    assert [r for _, r in iter_rows(_src(tmp_path / "array.jsonl"))] == [
        {"query": "c"},
        {"query": "d"},
    ]
    (tmp_path / "bad.json").write_text("{not an array")
    [(index, row)] = list(iter_rows(_src(tmp_path / "bad.json")))
    assert index == 0 and isinstance(row, RowError) and row.reason == "bad_json"
    assert row.detail.startswith(f"{tmp_path / 'bad.json'}:1: ")


def test_format_override(tmp_path: Path) -> None:
    p = tmp_path / "data.txt"
    p.write_text('{"query": "x"}\n')
    assert [r for _, r in iter_rows(_src(p, format="jsonl"))] == [{"query": "x"}]


def test_hub_source_streams_config_and_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dataset repository laid out like one on the hub (card with configs), read offline
    # through the same load_dataset(id, name=config, split=..., streaming=True) call.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "AgentInstruct"
    (repo / "data").mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: trajectories\n  data_files:\n"
        "  - split: os\n    path: data/os.jsonl\n  - split: db\n    path: data/db.jsonl\n---\n"
    )
    for split, n in (("os", 2), ("db", 3)):
        rows = [{"id": f"{split}{i}", "query": f"{split} question {i}"} for i in range(n)]
        (repo / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = SourceConfig(
        name="agent",
        schema="query_response",
        hub=str(repo),
        hub_config="trajectories",
        split="os+db",
    )
    got = [(i, r["id"]) for i, r in iter_rows(src)]
    assert got == [(0, "os0"), (1, "os1"), (2, "db0"), (3, "db1"), (4, "db2")]
    missing = SourceConfig(name="gone", schema="query_response", hub=str(tmp_path / "none"))
    with pytest.raises(InputError, match="source gone: cannot read"):
        list(iter_rows(missing))


def test_bom_deep_nesting_and_arbitrary_lines_are_located_rows(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    deep = b'{"query": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    medium = b'{"query": "q", "x": ' + b"[" * 150 + b"]" * 150 + b"}"
    p.write_bytes(
        b'\xef\xbb\xbf{"query": "a"}\n' + deep + b"\n" + medium + b"\n" + b'{"query": "b"}\n'
    )
    rows = [r for _, r in iter_rows(_src(p))]
    assert rows[0] == {"query": "a"} and rows[3] == {"query": "b"}
    for lineno, row in ((2, rows[1]), (3, rows[2])):
        assert isinstance(row, RowError) and row.reason == "bad_json"
        assert row.detail.startswith(f"{p}:{lineno}: nesting deeper than")
    arr = tmp_path / "b.json"
    arr.write_bytes(b'\xef\xbb\xbf[{"query": "a"}, ' + medium + b"]")
    got = [r for _, r in iter_rows(_src(arr))]
    assert got[0] == {"query": "a"} and isinstance(got[1], RowError)
    assert got[1].detail.startswith(f"{arr}: element 1: nesting deeper than")


def test_prepare_rejects_orphan_tool_and_keeps_going(tmp_path: Path) -> None:
    from draftdata.prepare.config import PrepareConfig
    from draftdata.prepare.stage import prepare

    src = tmp_path / "m.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "q1"}, {"role": "tool", "content": "r"}]},
        {"messages": [{"role": "user", "content": "q2"}]},
    ]
    src.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    cfg = PrepareConfig(
        sources=[SourceConfig(name="m", schema="openai", path=str(src))],
        out=str(tmp_path / "out"),
        seed=1,
    )
    result = prepare(cfg)
    assert result.rejects is not None
    rejects = [json.loads(x) for x in result.rejects.read_text().splitlines()]
    assert [(r["row"], r["reason"]) for r in rejects] == [(0, "orphan_tool")]
    kept = [json.loads(x) for f in result.shards for x in Path(f).read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in kept] == ["q2"]


_good = st.builds(lambda q: {"query": q}, st.text(max_size=20))
_bad = st.sampled_from(
    [
        b'{"query": "lone \\ud800 surrogate"}',  # valid JSON grammar, not decodable text
        b'{"query": "bad \xff utf-8"}',
        b'{"query": ' + b"[" * 3000 + b"]" * 3000 + b"}",  # deeper than the decoder goes
        b'{"query": NaN}',
        b'{"query": tru}',
        b'{"query" "a"}',
    ]
)


@settings(max_examples=60, deadline=None)
@given(items=st.lists(_good.map(lambda r: (True, r)) | _bad.map(lambda b: (False, b)), max_size=8))
def test_json_array_bad_elements_are_located_rows(
    tmp_path_factory: pytest.TempPathFactory, items: list[tuple[bool, Any]]
) -> None:
    """One bad element of a ``.json`` array is one reject at its index; the elements around
    it are read (the file does not stop the source)."""
    raw = [json.dumps(x).encode() if ok else x for ok, x in items]
    arr = tmp_path_factory.mktemp("arr") / "a.json"
    arr.write_bytes(b"[" + b", ".join(raw) + b"]")
    if not items:  # an empty array holds nothing: refused as every command refuses it
        with pytest.raises(EmptyInputError):
            list(iter_rows(_src(arr)))
        return
    got = [r for _, r in iter_rows(_src(arr))]
    assert len(got) == len(items)
    for i, ((ok, x), row) in enumerate(zip(items, got, strict=True)):
        if ok:
            assert row == x
        else:
            assert isinstance(row, RowError), row
            assert row.detail.startswith(f"{arr}: element {i}: ")


def test_json_array_cut_short_keeps_its_whole_elements(tmp_path: Path) -> None:
    arr = tmp_path / "a.json"
    arr.write_bytes(b'[{"query": "a"},, {"query": "b, [c"}, {"query": "d\\"}')
    got = [r for _, r in iter_rows(_src(arr))]
    assert got[0] == {"query": "a"} and got[2] == {"query": "b, [c"}
    for i in (1, 3):  # the empty element between two commas, the cut last one
        assert isinstance(got[i], RowError) and got[i].detail.startswith(f"{arr}: element {i}: ")
    assert len(got) == 4


def test_parquet_memory_is_a_batch_not_a_row_group(tmp_path: Path) -> None:
    """A file written as one row group (pyarrow's default up to 1M rows): reading it holds a
    batch of decoded rows at a time, not the whole file (Arrow's own allocation peak, in a
    fresh process so earlier tests do not count)."""
    rows = 40_000
    text = "x" * 500
    pq.write_table(
        pa.Table.from_pylist([{"query": f"{i} {text}"} for i in range(rows)]),
        tmp_path / "one-group.parquet",
        compression="zstd",
    )
    assert pq.ParquetFile(tmp_path / "one-group.parquet").metadata.num_row_groups == 1
    script = (
        "import sys, pyarrow as pa\n"
        "from draftdata.prepare.config import SourceConfig\n"
        "from draftdata.prepare.load import iter_rows\n"
        "src = SourceConfig(name='s', schema='query_response', path=sys.argv[1])\n"
        "n = sum(1 for _ in iter_rows(src))\n"
        "print(n, pa.default_memory_pool().max_memory())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "one-group.parquet")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    n, peak = map(int, done.stdout.split())
    assert n == rows
    assert peak < rows * len(text) / 2  # the decoded strings alone are rows * 500 bytes
