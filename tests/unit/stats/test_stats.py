"""stats on every input format: prompts, SpecForge/ShareGPT JSONL and JSON, parquet, runs,
tokenized samples (ours and foreign), merged datasets; the CLI's table and --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.stats import builders as b

from draftdata.errors import InputError
from draftdata.stats import DatasetStats, compute_stats
from draftdata.stats.sketch import Sketch


def test_prompts_dir_labels_and_classifier(tmp_path: Path) -> None:
    s = compute_stats(str(b.prompts_dir(tmp_path)))
    assert isinstance(s, DatasetStats)
    assert s.kind == "prompts" and s.rows == 6
    assert s["files"] == 2 and s["rejected"]["count"] == 0  # rejects.jsonl is not read
    assert s.domain_counts() == {"code": 3, "math": 2, "general": 1}
    assert s["domain_labels"] == {"given": 5, "classified": 1}
    assert s.domain_shares()["code"] == pytest.approx(0.5)
    assert s["sources"]["codes"] == {"rows": 3, "share": 0.5}
    assert s["primary"] == "chars"
    assert s["prepare_report"] == {"format": "draftdata.prepare_report/1", "rows": 6}
    assert s.length()["max"] == max(len(q) for q in (b.CODE_Q, b.MATH_Q, b.GENERAL_Q))


@pytest.mark.parametrize(
    "report", [b'{"format": "draftdata.prepare_report/9", "rows": 6}', b'{"rows": 6}', b"[1]", b"{"]
)
def test_a_prepare_report_of_another_format_is_not_shown(tmp_path: Path, report: bytes) -> None:
    """The report beside prepare's shards is read through its checked loader: one of another
    format (or none, or damaged) is left out of the figures, never shown as if it were ours."""
    out = b.prompts_dir(tmp_path)
    (out / "prepare_report.json").write_bytes(report)
    s = compute_stats(str(out))
    assert s.rows == 6 and "prepare_report" not in s


def test_prompts_folder_and_plain_prompts_file(tmp_path: Path) -> None:
    rows = [{"id": "a", "messages": b.chat(b.MATH_Q)}, {"id": "b", "messages": b.chat(b.CODE_Q)}]
    b.write_jsonl(tmp_path / "out" / "prompts" / "part-0.jsonl", rows)
    b.write_jsonl(tmp_path / "out" / "notes.jsonl", [{"not": "read"}])
    s = compute_stats(str(tmp_path / "out"))
    assert s.kind == "prompts" and s.domain_counts() == {"code": 1, "math": 1}
    f = compute_stats(str(tmp_path / "out" / "prompts" / "part-0.jsonl"))
    assert f.kind == "prompts" and f.rows == 2 and "prepare_report" not in f


@pytest.mark.parametrize("fmt", ["jsonl", "json", "jsonl.gz"])
def test_specforge_conversations_classified(tmp_path: Path, fmt: str) -> None:
    rows = b.specforge_rows()
    path = tmp_path / f"train.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(rows, indent=2))
    elif fmt == "jsonl":
        b.write_jsonl(path, rows)
    else:
        import gzip

        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    s = compute_stats(str(path))
    assert s.kind == "conversations" and s.rows == 4
    assert s.domain_counts() == {"code": 2, "general": 1, "math": 1}
    assert s["domain_labels"] == {"classified": 4}
    # a reasoning_content field and an inline <think> block both count
    assert s["reasoning"] == {"rows": 2, "share": 0.5}
    assert s["domains"]["code"]["reasoning_share"] == 0.5
    out = s.length(measure="output_chars")
    assert out["count"] == 4 and out["max"] == len("def add(a, b): return a + b") + len("think")


def test_json_array_larger_than_the_read_buffer(tmp_path: Path) -> None:
    """Elements that straddle the 1 MiB read chunks decode whole; trailing numbers are not cut."""
    rows = [
        {"id": i, "domain": "math", "conversations": b.chat("q", "é" * (700 + i % 300)), "n": 1}
        for i in range(3000)
    ]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(rows, ensure_ascii=False))
    assert path.stat().st_size > 3 * (1 << 20)
    s = compute_stats(str(path))
    assert s.rows == 3000 and s["rejected"]["count"] == 0
    assert s.domain_counts() == {"math": 3000}
    expected = sum(700 + i % 300 for i in range(3000))
    assert s.length(measure="output_chars")["total"] == expected


def test_sharegpt_and_bad_rows_are_counted_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "sg.jsonl"
    lines = [json.dumps(r) for r in b.sharegpt_rows()]
    lines.insert(1, "{not json")
    lines.append(json.dumps({"conversations": [{"from": "alien", "value": "x"}]}))
    path.write_text("\n".join(lines) + "\n")
    s = compute_stats(str(path))
    assert s.rows == 2 and s.domain_counts() == {"general": 1, "math": 1}
    assert s["rejected"]["count"] == 2
    assert s["rejected"]["examples"][0].startswith(f"{path}:2: ")


def test_merged_dataset_dir_reads_its_parquet(tmp_path: Path) -> None:
    root = tmp_path / "merged"
    b.conversations_parquet(root / "train" / "part-00000.parquet", {"code": 3, "math": 1})
    b.conversations_parquet(root / "eval" / "part-00000.parquet", {"general": 1})
    (root / "merge_report.json").write_text(json.dumps({"format": "draftdata.merge-report"}))
    # the SpecForge export holds the same rows and is not read twice
    b.write_jsonl(root / "train.jsonl", b.specforge_rows())
    s = compute_stats(str(root))
    assert s.kind == "conversations" and s["files"] == 2
    assert s.domain_counts() == {"code": 3, "general": 1, "math": 1}
    assert s["domain_labels"] == {"given": 5}
    assert s["sources"] == {"merged": {"rows": 5, "share": 1.0}}


def test_plain_parquet_messages_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "msgs.parquet"
    table = pa.Table.from_pylist(
        [
            {"id": "a", "messages": b.chat(b.MATH_Q, "x = 3"), "source": "hf"},
            {"id": "b", "messages": b.chat(b.CODE_Q, "def f(): pass"), "source": "hf"},
        ]
    )
    pq.write_table(table, path)
    s = compute_stats(str(path))
    assert s.kind == "conversations"
    assert s.domain_counts() == {"code": 1, "math": 1}


def test_tokenized_samples(tmp_path: Path) -> None:
    s = compute_stats(str(b.tokenized_parquet(tmp_path / "tok" / "part-0.parquet").parent))
    assert s.kind == "tokenized" and s.rows == 3
    assert s.domain_counts() == {"code": 2, "math": 1}
    assert s["primary"] == "tokens"
    assert s.length()["total"] == 35 and s.length()["max"] == 20
    assert s.length("code")["count"] == 2
    assert s.length(measure="loss_tokens")["total"] == 29
    assert s["truncated"]["rows"] == 1
    assert s["reasoning"] is None


def test_foreign_tokenized_parquet_fills_missing_columns(tmp_path: Path) -> None:
    s = compute_stats(str(b.foreign_tokenized_parquet(tmp_path / "f.parquet")))
    assert s.kind == "tokenized"
    assert s.domain_counts() == {"unknown": 2}
    assert s.length()["total"] == 6
    assert s.length(measure="loss_tokens")["total"] == 3


def test_run_finish_reasons_failures_metrics(tmp_path: Path) -> None:
    s = compute_stats(str(b.run_dir(tmp_path / "run")))
    assert s.kind == "run" and s.rows == 7
    assert s.domain_counts() == {"code": 4, "math": 2, "general": 1}
    assert s["finish_reasons"] == {"stop": 6, "length": 1}
    assert s["domains"]["math"]["finish_reasons"] == {"length": 1, "stop": 1}
    assert s["domains"]["code"]["finish_reasons"] == {"stop": 4}
    assert s["failures"]["by_reason"] == {"context_length": 1, "exhausted_retries": 1}
    assert s["primary"] == "output_tokens"
    assert s.length()["total"] == 100 + 110 + 120 + 130 + 300 + 50 + 20
    assert s["reasoning"]["rows"] == 1
    m = s["metrics"]
    assert m["output_tokens"] == 800 and m["wall_s"] == 20.0 and m["output_tokens_per_s"] == 40.0


def test_run_without_metrics(tmp_path: Path) -> None:
    s = compute_stats(str(b.run_dir(tmp_path / "run", with_metrics=False)))
    assert s["metrics"] is None and s.rows == 7


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: p, "no dataset files"),
        (lambda p: p / "missing", "no such file or directory"),
    ],
)
def test_user_errors(tmp_path: Path, setup, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=message):
        compute_stats(str(setup(tmp_path)))


def test_unknown_parquet_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match="unknown dataset columns"):
        compute_stats(str(tmp_path / "x.parquet"))


def test_sketch_quantiles_within_half_a_percent() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    values = rng.lognormal(6, 1.2, 50_000)
    sk = Sketch()
    sk.add_many(values[:25_000])
    for v in values[25_000:26_000]:
        sk.add(v)
    rest = Sketch()
    rest.add_many(values[26_000:])
    sk.merge(rest)
    assert sk.count == 50_000
    for q in (0.05, 0.5, 0.95, 0.99):
        exact = float(np.quantile(values, q, method="inverted_cdf"))
        assert sk.quantile(q) == pytest.approx(exact, rel=0.0051)
    assert len(sk.buckets) < 2000
    small = Sketch()
    small.add_many([*range(1, 21), 0, 0])
    # small integers come back exact once rounded (nearest rank over 0, 0, 1..20)
    summary = small.summary()
    assert [summary[k] for k in ("min", "p5", "p50", "p95", "p99", "max")] == [0, 0, 9, 19, 20, 20]
    assert summary["total"] == 210 and summary["count"] == 22
    assert Sketch().quantile(0.5) == 0.0 and Sketch().summary() == {"count": 0}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from draftdata.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )


def test_cli_table_and_json(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    run = str(b.run_dir(tmp_path / "run"))
    runner = CliRunner()
    table = runner.invoke(app, ["stats", run], env={"COLUMNS": "160"})
    assert table.exit_code == 0, table.output
    for word in ("code", "57.1%", "finish reasons", "length", "context_length", "tok/s", "cut"):
        assert word in table.stdout
    js = runner.invoke(app, ["stats", run, "--json"])
    assert js.exit_code == 0, js.output
    data = json.loads(js.stdout)
    assert data["format"] == "draftdata.stats/1" and data["domains"]["code"]["rows"] == 4
    both = runner.invoke(app, ["stats", run, str(b.prompts_dir(tmp_path / "p")), "--json"])
    assert [d["kind"] for d in json.loads(both.stdout)] == ["run", "prompts"]


def test_cli_user_error_is_one_line(tmp_path: Path) -> None:
    r = _cli("stats", str(tmp_path / "nope"))
    assert r.returncode == 1
    assert "no such file or directory" in r.stderr and "Traceback" not in r.stderr


def test_bom_deep_nesting_and_orphan_tool_rows_are_rejects_not_fatal(tmp_path: Path) -> None:
    # the readers stats and merge share: prompts JSONL and conversation JSONL/JSON arrays
    ok = {"id": "a", "messages": [{"role": "user", "content": "what is 2 + 2?"}]}
    orphan = {
        "id": "o",
        "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}],
    }
    deep = b'{"id": "d", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    medium = b'{"id": "m", "messages": [{"role": "user", "content": "q"}], "meta": {"x": ' + (
        b"[" * 150 + b"]" * 150 + b"}}"
    )
    for name in ("prompts.jsonl", "conv.jsonl"):
        path = tmp_path / name
        first = json.dumps(
            ok
            if name == "prompts.jsonl"
            else {
                "conversations": [
                    {"from": "human", "value": "what is 2 + 2?"},
                    {"from": "gpt", "value": "4"},
                ]
            }
        )
        path.write_bytes(
            b"\xef\xbb\xbf"
            + first.encode()
            + b"\n"
            + deep
            + b"\n"
            + medium
            + b"\n"
            + json.dumps(orphan).encode()
            + b"\n"
        )
        s = compute_stats(str(path))
        # prompts are validated as generate does (an orphan tool message is a reject);
        # answered conversations keep their own shape rules
        bad = (2, 3, 4) if name == "prompts.jsonl" else (2, 3)
        assert s.rows == 4 - len(bad), name
        assert s["rejected"]["count"] == len(bad), (name, s["rejected"])
        assert [e.split(": ")[0] for e in s["rejected"]["examples"]] == [f"{path}:{n}" for n in bad]
    arr = tmp_path / "arr.json"
    arr.write_bytes(b"\xef\xbb\xbf[" + json.dumps(ok).encode() + b", " + medium + b"]")
    s = compute_stats(str(arr))
    assert s.rows == 1 and s["rejected"]["count"] == 1


def test_a_deep_json_string_field_is_a_reject(tmp_path: Path) -> None:
    conv = [{"from": "human", "value": "what is 2 + 2?"}, {"from": "gpt", "value": "4"}]
    rows = [
        {"conversations": conv, "tools": "[" * 5000 + "]" * 5000},  # a JSON string, nested
        {"conversations": conv, "tools": "[" * 150 + "]" * 150},
        {"conversations": conv},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = compute_stats(str(path))
    assert s.rows == 1 and s["rejected"]["count"] == 2
    assert all("tools" in e for e in s["rejected"]["examples"])


_good_chat = st.builds(
    lambda q: {"conversations": b.chat(q, "an answer")},
    st.text(alphabet="abc ]}[{,\"'\\é", min_size=1, max_size=10).filter(str.strip),
)
_bad_element = st.sampled_from(
    [
        b'{"conversations": tru}',
        b'{"conversations": NaN}',
        b'{"x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        b'{"conversations": [{"from": "human", "value": "\xff"}, {"from": "gpt", "value": "a"}]}',
        b'{"conversations": [{"from": "human", "value": "\\udc00"}, '
        b'{"from": "gpt", "value": "a"}]}',
    ]
)


@settings(max_examples=25, deadline=None)
@given(
    items=st.lists(
        _good_chat.map(lambda r: (True, r)) | _bad_element.map(lambda x: (False, x)), max_size=6
    ),
    jsonl_first=st.booleans(),
)
def test_json_array_and_lines_bad_rows_cost_only_themselves(
    tmp_path_factory: pytest.TempPathFactory, items: list[tuple[bool, Any]], jsonl_first: bool
) -> None:
    """A bad element of a JSON array is one reject and every good element after it is still
    counted (none silently lost); invalid UTF-8 is a reject in an array as in JSON lines. JSON
    lines whose first row is an array are still read line by line."""
    raws = [json.dumps(x).encode() if ok else x for ok, x in items]
    good = sum(ok for ok, _ in items)
    path = tmp_path_factory.mktemp("arr") / "rows.json"
    if jsonl_first:  # JSON lines opening with a bad row that is an array
        path.write_bytes(b"[1, 2]\n" + b"".join(r + b"\n" for r in raws))
        bad_where = [f"{path}:1"] + [f"{path}:{i + 2}" for i, (ok, _) in enumerate(items) if not ok]
    else:
        path.write_bytes(b"[" + b",\n".join(raws) + b"]")
        bad_where = [f"{path}: element {i}" for i, (ok, _) in enumerate(items) if not ok]
    if good == 0:
        return  # nothing to classify: a dataset of rejects only
    s = compute_stats(str(path))
    assert s.rows == good
    assert s["rejected"]["count"] == len(bad_where)
    examples = s["rejected"]["examples"]
    assert all(e.startswith(w + ": ") for e, w in zip(examples, bad_where, strict=False))
