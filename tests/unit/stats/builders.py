"""Small datasets of every kind stats and report read, written into a tmp dir at test time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.records import Completion, Failure, Message, Sample, Turn, Usage
from draftdata.shared.conversation import Conversation
from draftdata.shared.formats import samples_table
from draftdata.stats.conversations import CONVERSATION_SCHEMA, conversation_row
from draftdata.store.run import Run

CODE_Q = "Write a python function `def add(a, b):` that returns the sum. ```python\npass\n```"
MATH_Q = "Solve for x: 3x + 2 = 11. What is the probability that a prime is even?"
GENERAL_Q = "Tell me about the history of the Roman empire in a few sentences."


def chat(question: str, answer: str | None = None, reasoning: str | None = None) -> list[Any]:
    """OpenAI messages: a user turn and optionally the assistant's answer."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": question}]
    if answer is not None:
        a: dict[str, Any] = {"role": "assistant", "content": answer}
        if reasoning:
            a["reasoning_content"] = reasoning
        msgs.append(a)
    return msgs


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prompts_dir(root: Path) -> Path:
    """prepare's output layout: 3 code (labelled), 2 math, 1 unlabelled general prompt in two
    shards, a rejects file and the report."""
    rows: list[dict[str, Any]] = []
    for i in range(3):
        rows.append({"id": f"c{i}", "source": "codes", "domain": "code", "messages": chat(CODE_Q)})
    for i in range(2):
        rows.append({"id": f"m{i}", "source": "maths", "domain": "math", "messages": chat(MATH_Q)})
    rows.append({"id": "g0", "source": "misc", "messages": chat(GENERAL_Q)})
    write_jsonl(root / "prompts-00000.jsonl", rows[:4])
    write_jsonl(root / "prompts-00001.jsonl", rows[4:])
    write_jsonl(root / "rejects.jsonl", [{"source": "misc", "row": 3, "reason": "empty"}])
    report = {"format": "draftdata.prepare_report/1", "rows": 6}
    (root / "prepare_report.json").write_text(json.dumps(report))
    return root


def specforge_rows() -> list[dict[str, Any]]:
    """SpecForge rows without labels: 2 code (one with reasoning), 1 math, 1 general."""
    return [
        {"id": "s1", "conversations": chat(CODE_Q, "def add(a, b): return a + b", "think")},
        {"id": "s2", "conversations": chat(CODE_Q, "Here is the code.")},
        {"id": "s3", "conversations": chat(MATH_Q, "<think>3x=9</think>x = 3")},
        {"id": "s4", "conversations": chat(GENERAL_Q, "Rome was founded in 753 BC.")},
    ]


def sharegpt_rows() -> list[dict[str, Any]]:
    """ShareGPT rows (from/value) with a source but no domain."""
    return [
        {"conversations": [{"from": "human", "value": MATH_Q}, {"from": "gpt", "value": "3"}]},
        {"conversations": [{"from": "human", "value": GENERAL_Q}, {"from": "gpt", "value": "ok"}]},
    ]


def conversations_parquet(path: Path, labels: dict[str, int]) -> Path:
    """A merge-style ``conversation/1`` parquet file: ``labels[d]`` rows of domain ``d``."""
    rows = []
    for d, n in labels.items():
        for i in range(n):
            conv = Conversation(
                id=f"{d}-{i}",
                messages=[
                    Message(role="user", content=f"q {d} {i}"),
                    Message(role="assistant", content="a" * (10 + i)),
                ],
                source="merged",
                domain=d,
            )
            rows.append(conversation_row(conv))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=CONVERSATION_SCHEMA), path)
    return path


def tokenized_parquet(path: Path) -> Path:
    """tokenize-style ``sample/1`` parquet: 2 code samples (10, 20 tokens), 1 math (5, cut)."""
    samples = [
        Sample(
            id="t1",
            source="a",
            domain="code",
            input_ids=list(range(10)),
            loss_mask=[0] * 4 + [1] * 6,
            num_tokens=10,
            num_loss_tokens=6,
        ),
        Sample(
            id="t2",
            source="a",
            domain="code",
            input_ids=list(range(20)),
            loss_mask=[1] * 20,
            num_tokens=20,
            num_loss_tokens=20,
        ),
        Sample(
            id="t3",
            source="b",
            domain="math",
            input_ids=list(range(5)),
            loss_mask=[0, 0, 1, 1, 1],
            num_tokens=5,
            num_loss_tokens=3,
            truncated=True,
        ),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(samples_table(samples), path)
    return path


def foreign_tokenized_parquet(path: Path) -> Path:
    """Tokenized parquet from elsewhere: only id, input_ids and loss_mask columns."""
    table = pa.table(
        {
            "id": ["f1", "f2"],
            "input_ids": [[1, 2, 3, 4], [5, 6]],
            "loss_mask": [[0, 1, 1, 1], [0, 0]],
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def completion(
    i: int,
    domain: str,
    finish: str = "stop",
    tokens: int = 100,
    reasoning: bool = False,
    endpoint: str = "http://e1",
) -> Completion:
    q = {"code": CODE_Q, "math": MATH_Q}.get(domain, GENERAL_Q)
    return Completion(
        id=f"r{i}",
        source="src-" + domain,
        domain=domain if domain != "unlabelled" else "",
        messages=[Message(role="user", content=q)],
        turns=[
            Turn(
                content="x" * tokens,
                reasoning="why" if reasoning else None,
                finish_reason=finish,
                usage=Usage(prompt_tokens=10, completion_tokens=tokens),
            )
        ],
        usage=Usage(prompt_tokens=10, completion_tokens=tokens),
        endpoint=endpoint,
        created=1000.0 + i,
    )


def run_dir(root: Path, with_metrics: bool = True) -> Path:
    """A generate run: 4 code + 2 math + 1 unlabelled completion, 2 failures, metrics."""
    run = Run.open(str(root), settings={"model": "test"}, writer_id="w1")
    with run:
        for i in range(4):
            run.add_completion(completion(i, "code", tokens=100 + 10 * i, reasoning=i == 0))
        run.add_completion(completion(4, "math", finish="length", tokens=300, endpoint="http://e2"))
        run.add_completion(completion(5, "math", tokens=50, endpoint="http://e2"))
        run.add_completion(completion(6, "unlabelled", tokens=20))
        run.add_failure(
            Failure(id="f1", reason="context_length", domain="code", message="too long")
        )
        run.add_failure(Failure(id="f2", reason="exhausted_retries", domain="math"))
        run.flush()
        if with_metrics:
            for t in range(3):
                run.write_metrics(metrics_snapshot(t))
    return root


def metrics_snapshot(t: int) -> dict[str, Any]:
    """A progress snapshot at ``t`` (0, 1, 2 ...) seconds in; the last one is final."""
    return {
        "format": "draftdata.metrics/1",
        "time": 1000.0 + 10 * t,
        "elapsed_s": 10.0 * t,
        "final": t == 2,
        "summary": {
            "completed": 3 * t,
            "failed": t,
            "output_tokens": 400 * t,
            "wall_s": 10.0 * t,
            "endpoints": {
                "http://e1": {"completed": 2 * t, "output_tokens": 300 * t, "errors": 0},
                "http://e2": {"completed": t, "output_tokens": 100 * t, "errors": t},
            },
        },
    }
