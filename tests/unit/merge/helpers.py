"""Dataset factories for the merge tests: tokenized parquet, chat JSONL, runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from draftdata.records import Completion, Message, Turn
from draftdata.shared.formats import SAMPLE_SCHEMA
from draftdata.store.write import parquet_bytes

# Texts the domain classifier puts in each domain (checked in test_stage).
CHAT_TEXT = {
    "code": "Write a python function that reverses the string number {i} using recursion.",
    "math": "Solve 3x + {i} = 11 for x. How many integer solutions are there?",
    "general": "Tell me a short story about the old lighthouse keeper called Sam {i}.",
}


def token_samples(
    folder: Path,
    domains: dict[str, int],
    *,
    prefix: str,
    seed: int = 0,
    shards: int = 1,
    content_from: int = 0,
) -> Path:
    """Write ``sum(domains)`` tokenized samples (``domain -> rows``) as parquet shards.

    Row ``k`` has id ``{prefix}{k}`` and input_ids derived from ``content_from + k``, so two
    calls with the same ``content_from`` produce the same contents under different ids.
    """
    folder.mkdir(parents=True, exist_ok=True)
    labels = [d for d, n in domains.items() for _ in range(n)]
    rng = np.random.default_rng(seed)
    rng.shuffle(labels)
    rows = []
    for k, label in enumerate(labels):
        digest = hashlib.sha256(str(content_from + k).encode()).digest()
        ids = [int(b) for b in digest[: 6 + (k % 7)]]
        rows.append(
            {
                "id": f"{prefix}{k}",
                "source": prefix,
                "domain": label,
                "input_ids": ids,
                "loss_mask": [0] * 3 + [1] * (len(ids) - 3),
                "num_tokens": len(ids),
                "num_loss_tokens": len(ids) - 3,
                "truncated": False,
            }
        )
    per = max(1, -(-len(rows) // shards))
    for s in range(shards):
        part = rows[s * per : (s + 1) * per]
        table = pa.Table.from_pylist(part, schema=SAMPLE_SCHEMA)
        (folder / f"part-{s:05d}.parquet").write_bytes(parquet_bytes(table))
    return folder


def chat_rows(domains: dict[str, int], *, prefix: str, style: str = "specforge") -> list[Any]:
    """Unlabelled chat rows whose text the classifier files under each domain."""
    rows: list[dict[str, Any]] = []
    k = 0
    for domain, n in domains.items():
        for _ in range(n):
            question = CHAT_TEXT[domain].format(i=f"{prefix}{k}")
            answer = f"Here is the answer to {prefix}{k}."
            if style == "sharegpt":
                conv = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
            else:
                conv = [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": answer},
                ]
            rows.append({"id": f"{prefix}{k}", "conversations": conv})
            k += 1
    return rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Write rows as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_dir(url: str, domains: dict[str, int], *, prefix: str, model: str = "m") -> str:
    """A generate run at ``url`` with labelled completions (``domain -> rows``) answered by
    ``model`` (in the server's default thinking mode, on)."""
    from draftdata.store.run import Run

    run = Run.open(url, settings={"model": model}, writer_id="w1")
    k = 0
    for domain, n in domains.items():
        for _ in range(n):
            pid = f"{prefix}{k}"
            run.add_completion(
                Completion(
                    id=pid,
                    domain=domain,
                    source="gen",
                    messages=[Message(role="user", content=CHAT_TEXT[domain].format(i=pid))],
                    turns=[Turn(content=f"answer {pid}", reasoning="hmm", finish_reason="stop")],
                    model=model,
                    server_thinking=True,
                )
            )
            k += 1
    run.close()
    return url


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by relative path."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
