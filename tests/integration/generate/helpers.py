"""Prompt files and a fast GenerateConfig for the engine tests against the simulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftdata.generate.config import GenerateConfig
from draftdata.records import Completion, Failure
from draftdata.sim.answers import digest
from draftdata.store.read import iter_completions, iter_failures

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def write_prompts(path: Path, n: int, *, kind: str = "plain", start: int = 0) -> list[str]:
    """``n`` prompts of one kind (plain, tools, multi, mixed); returns their ids."""
    ids = []
    with path.open("a", encoding="utf-8") as f:
        for i in range(start, start + n):
            k = kind if kind != "mixed" else ("plain", "tools", "multi")[i % 3]
            pid = f"{k}-{i:05d}"
            row: dict[str, Any] = {
                "id": pid,
                "source": k,
                "domain": ("math", "code", "general")[i % 3],
            }
            if k == "multi":
                row["messages"] = [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": f"Question {i}: what is {i} + 1?"},
                    {"role": "assistant", "content": "An answer the target replaces."},
                    {"role": "user", "content": "And times two?"},
                ]
            else:
                row["messages"] = [{"role": "user", "content": f"Question {i} about item {i}."}]
            if k == "tools":
                row["tools"] = TOOLS
            f.write(json.dumps(row) + "\n")
            ids.append(pid)
    return ids


def fast_config(prompts: Path, out: Path, urls: list[str], **changes: Any) -> GenerateConfig:
    """A config with test-sized timings (short backoff, quick probes, no output)."""
    base: dict[str, Any] = {
        "prompts": str(prompts),
        "endpoints": urls,
        "out": str(out),
        "progress": "off",
        "flush_seconds": 0.2,
        "flush_records": 32,
        "backoff_base": 0.02,
        "backoff_max": 0.5,
        "probe_interval": 0.1,
        "load_interval": 0.2,
        "hedge_min_age": 0.3,
        "connect_timeout": 2.0,
        "read_timeout": 20.0,
        "metrics_interval": 1.0,
        "grace_seconds": 5.0,
    }
    base.update(changes)
    return GenerateConfig(**base)


def completions(out: Path) -> list[Completion]:
    """Every committed completion of the run."""
    return list(iter_completions(str(out)))


def failures(out: Path) -> list[Failure]:
    """The run's unresolved failures."""
    return list(iter_failures(str(out)))


def simulated_run(
    root: Path,
    prompts: list[dict[str, Any]],
    *,
    mean_output_tokens: int,
    max_tokens: int,
    flush_records: int,
    n: int = 1,
) -> tuple[Path, str]:
    """``root/run``: ``prompts`` (rows of the prompts JSONL) generated on a one-server
    simulator that answers with the demo tokenizer's ids (written to ``root/tok``), ``n``
    samples each, a shard every ``flush_records`` completions; returns (run, tokenizer)."""
    from draftdata.demo.tokenizer import ensure_demo_tokenizer
    from draftdata.generate.stage import generate
    from draftdata.sim.run import SimConfig, SimFleet

    tok = str(ensure_demo_tokenizer(root / "tok"))
    path = root / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    sim = SimConfig(
        tokenizer=tok, time_scale=0, mean_output_tokens=mean_output_tokens, tool_call_rate=0.0
    )
    with SimFleet(1, sim) as fleet:
        config = GenerateConfig(
            prompts=str(path), endpoints=fleet.urls, out=str(root / "run"), n=n,
            progress="off", max_tokens=max_tokens, flush_records=flush_records,
        )  # fmt: skip
        generate(config, handle_signals=False, log=lambda _line: None)
    return root / "run", tok


def user_prompts(n: int, question: str, id_format: str = "p{:04d}") -> list[dict[str, Any]]:
    """``n`` one-turn prompts: ``question`` formatted with the row number ``i``."""
    return [
        {"id": id_format.format(i), "messages": [{"role": "user", "content": question.format(i=i)}]}
        for i in range(n)
    ]


def code_chat_file(path: Path, n: int, question: str) -> Path:
    """``n`` SpecForge chat rows (``question`` formatted with ``i``, a short Python answer)."""
    with path.open("w") as fh:
        for i in range(n):
            conv = [
                {"role": "user", "content": question.format(i=i)},
                {"role": "assistant", "content": f"def f{i}(xs):\n    return sorted(xs)"},
            ]
            fh.write(json.dumps({"id": f"c{i}", "conversations": conv}) + "\n")
    return path


def is_bad_prompt(first_user: str, rate: float) -> bool:
    """Whether the simulator's ``--bad-prompts RATE`` refuses a prompt whose first user message
    is ``first_user`` (its rule: a hash of that message)."""
    return digest("bad prompt", first_user) < rate * 2**64


def write_bad_and_good(
    path: Path, *, bad: int, good: int, rate: float, bad_first: bool
) -> tuple[set[str], set[str]]:
    """``bad`` prompts the simulator's ``--bad-prompts RATE`` refuses and ``good`` ones it
    answers, the bad ones first or last in the file; returns (bad ids, good ids)."""
    rows: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    i = 0
    while len(rows[True]) < bad or len(rows[False]) < good:
        text = f"Question {i} about item {i}."
        is_bad = is_bad_prompt(text, rate)
        if len(rows[is_bad]) < (bad if is_bad else good):
            kind = "b" if is_bad else "g"
            rows[is_bad].append(
                {"id": f"{kind}-{i:05d}", "messages": [{"role": "user", "content": text}]}
            )
        i += 1
    order = rows[True] + rows[False] if bad_first else rows[False] + rows[True]
    with path.open("w", encoding="utf-8") as f:
        for row in order:
            f.write(json.dumps(row) + "\n")
    return {str(r["id"]) for r in rows[True]}, {str(r["id"]) for r in rows[False]}
