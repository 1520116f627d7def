"""Export formats, the assembled conversation, and HF datasets loading each export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from tests.unit.store.helpers import completion

from draftdata.errors import AlreadyExistsError
from draftdata.export.stage import export_run
from draftdata.records import Completion, Message, Turn
from draftdata.shared.conversation import assemble as assemble_conversation
from draftdata.store import Run


def _multi_turn() -> Completion:
    return Completion(
        id="mt",
        messages=[
            Message(role="system", content="be brief"),
            Message(role="user", content="q1"),
            Message(role="assistant", content="original a1"),
            Message(role="user", content="q2"),
        ],
        turns=[Turn(content="new a1", reasoning="r1"), Turn(content="new a2", reasoning="r2")],
        tools=[{"type": "function", "function": {"name": "f"}}],
    )


def test_assemble_uses_the_targets_turns() -> None:
    conv = assemble_conversation(_multi_turn())
    assert [(m.role, m.content) for m in conv] == [
        ("system", "be brief"),
        ("user", "q1"),
        ("assistant", "new a1"),
        ("user", "q2"),
        ("assistant", "new a2"),
    ]
    assert conv[2].reasoning_content == "r1"


def test_stats_and_merge_rebuild_conversations_by_the_same_rule() -> None:
    """A completion with fewer turns than the prompt's requests ends after its last turn, in
    export and in stats/merge alike; both name sample 1 ``id#s1``."""
    from draftdata.stats.conversations import completion_to_conversation

    short = msgspec.structs.replace(_multi_turn(), turns=[Turn(content="new a1")], sample=1)
    short = msgspec.structs.replace(
        short, messages=[*short.messages, Message(role="assistant", content="original a2")]
    )
    conv = completion_to_conversation(short)
    assert conv.messages == assemble_conversation(short)
    assert [m.content for m in conv.messages] == ["be brief", "q1", "new a1"]
    assert conv.id == "mt#s1" and conv.tools == short.tools


@pytest.fixture
def run_dir(tmp_path: Path) -> str:
    url = str(tmp_path / "run")
    run = Run.open(url, settings={}, flush_records=2)
    for i in range(3):
        run.add_completion(completion(i))
        if run.flush_due():
            run.flush()
    run.add_completion(_multi_turn())
    run.close()
    return url


def test_sharegpt_and_openai(run_dir: str, tmp_path: Path) -> None:
    export_run(run_dir, "sharegpt", tmp_path / "sg.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "sg.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    mt = next(r for r in rows if r["id"] == "mt")
    assert mt["conversations"][-1] == {
        "role": "assistant",
        "content": "new a2",
        "reasoning_content": "r2",
    }
    assert mt["tools"][0]["function"]["name"] == "f"
    export_run(run_dir, "openai", tmp_path / "oa.jsonl", include_reasoning=False)
    oa = [json.loads(x) for x in (tmp_path / "oa.jsonl").read_text().splitlines()]
    assert all("reasoning_content" not in m for r in oa for m in r["messages"])
    with pytest.raises(AlreadyExistsError):
        export_run(run_dir, "openai", tmp_path / "oa.jsonl")


def test_datasets_loads_every_export(run_dir: str, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    cache = str(tmp_path / "cache")
    export_run(run_dir, "parquet", tmp_path / "x.parquet")
    ds = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "x.parquet"), split="train", cache_dir=cache
    )
    assert ds.num_rows == 4 and ds[0]["conversations"][0]["role"] == "user"
    for fmt in ("sharegpt", "openai"):
        export_run(run_dir, fmt, tmp_path / f"{fmt}.jsonl")
        js = datasets.load_dataset(
            "json", data_files=str(tmp_path / f"{fmt}.jsonl"), split="train", cache_dir=cache
        )
        assert js.num_rows == 4
    done = [str(p) for p in Path(run_dir, "completions").glob("*.parquet")]
    comp = datasets.load_dataset("parquet", data_files=done, split="train", cache_dir=cache)
    assert comp.num_rows == 4


def test_cli_export(run_dir: str, tmp_path: Path) -> None:
    out = tmp_path / "cli.jsonl"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from draftdata.cli import main; main()",
            "export",
            run_dir,
            "--format",
            "openai",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "exported 4 completions" in res.stdout and out.exists()
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            "from draftdata.cli import main; main()",
            "export",
            run_dir,
            "-f",
            "csv",
            "-o",
            str(tmp_path / "y"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "sharegpt, openai, parquet" in bad.stderr


def test_export_of_a_missing_run_fails_and_writes_nothing(tmp_path: Path) -> None:
    from draftdata.errors import StoreError
    from draftdata.export.stage import export_run

    out = tmp_path / "x.jsonl"
    with pytest.raises(StoreError, match="not a draftdata run"):
        export_run(str(tmp_path / "nope"), "sharegpt", out)
    assert not out.exists()


def test_a_run_with_completion_1_shards_exports_each_by_its_own_rule(tmp_path: Path) -> None:
    """A run resumed across the format change holds completion/1 and completion/2 shards: each
    row is rebuilt by the rule it was generated under."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftdata.shared.formats import COMPLETION_SCHEMA, FORMAT_KEY, completion_row

    two_users = [Message(role="user", content="u1"), Message(role="user", content="u2")]
    url = str(tmp_path / "run")
    with Run.open(url, settings={}) as run:
        run.add_completion(Completion(id="new", messages=two_users, turns=[Turn(content="A")]))
    old = Completion(id="old", messages=two_users, turns=[Turn(content="A")])
    fields = [f for f in COMPLETION_SCHEMA if f.name not in ("stop_reason", "conversation_rule")]
    schema = pa.schema(fields, metadata={FORMAT_KEY: b"completion/1"})
    row = {k: v for k, v in completion_row(old).items() if k in schema.names}
    pq.write_table(
        pa.Table.from_pylist([row], schema=schema),
        tmp_path / "run" / "completions" / "part-old-000000.parquet",
    )
    export_run(url, "openai", tmp_path / "o.jsonl")
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "o.jsonl").read_text().splitlines())}
    # the old engine sent [u1, u2] in one request; today's answers u1 first (and stopped there)
    assert [m["content"] for m in rows["old"]["messages"]] == ["u1", "u2", "A"]
    assert [m["content"] for m in rows["new"]["messages"]] == ["u1", "A"]
