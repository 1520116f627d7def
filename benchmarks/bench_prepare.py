"""Benchmark: prepare end to end on a generated corpus in the six source schemas (193K rows, or
any size with --rows: the issue's 2M).

Generates (in a temporary folder) the expansion's shape — Infinity-Instruct ~98K (jsonl),
WebInstructSub 40K (parquet), CodeFeedback 29K (jsonl), MetaMathQA 24K (json array), Hermes FC
1.2K (jsonl, Python-literal tools) and AgentInstruct 553 (jsonl), scaled to --rows — where
about 10% of rows are planted near-duplicates of earlier rows (two word substitutions, a case
change, extra spaces). MetaMathQA's originals fill 40 fixed question templates (it is
rephrasings of the same questions), so its template families grow with the rows: the shape
that made candidate lists grow with the index. Then runs ``draftdata prepare`` in a child
process with near-dedup on and prints wall time, the child's peak RSS, and near-duplicate
recall (planted copies dropped / planted) with the false-drop rate on originals. Targets on
2 cores: <= 60 s at 193K rows, <= 300 s at 2M (in proportion between), <= 2 GiB.

    python benchmarks/bench_prepare.py                  # full size, 193,010 rows
    python benchmarks/bench_prepare.py --quick          # 20K rows
    python benchmarks/bench_prepare.py --rows 2000000   # the 2M-row case
    python benchmarks/bench_prepare.py --rows 2000000 --data /tmp/corpus-2m   # keep the corpus
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SHAPE = {  # source -> rows at full size (sums to 193,010)
    "infinity": 98_257,
    "webinstruct": 40_000,
    "codefeedback": 29_000,
    "metamath": 24_000,
    "hermes": 1_200,
    "agent": 553,
}
DUP_RATE = 0.10
VOCAB = [f"{a}{b}{c}" for a in "bcdfghjklmnprstvz" for b in "aeiou" for c in "klmnrstxz" + "aeiou"]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(VOCAB, k=n))


def _perturb(rng: random.Random, text: str) -> str:
    words = text.split(" ")
    for _ in range(2):
        words[rng.randrange(len(words))] = rng.choice(VOCAB)
    words[0] = words[0].upper()
    return "  ".join(words)


class Gen:
    """Generates one source's user texts, planting near-duplicates of its earlier rows."""

    def __init__(self, rng: random.Random, words: tuple[int, int]) -> None:
        self.rng, self.words = rng, words
        self.texts: list[str] = []
        self.planted: list[int] = []

    def next(self) -> str:
        i = len(self.texts)
        if i > 10 and self.rng.random() < DUP_RATE:
            text = _perturb(self.rng, self.texts[self.rng.randrange(i)])
            self.planted.append(i)
        else:
            text = _text(self.rng, self.rng.randint(*self.words))
        self.texts.append(text)
        return text


class TemplatedGen(Gen):
    """Like Gen, but each original fills one of a fixed set of question templates (MetaMathQA
    is rephrasings of a few thousand questions): 28 template words and 12 random ones, so two
    rows of one template are ~0.55 alike (below the threshold, not duplicates) and share an
    LSH band with ~1 in 10 of their template's rows. The templates stay fixed as rows grow,
    so each template's family grows with the source: the shape that made candidate lists
    grow with the index."""

    TEMPLATES = 40

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng, (40, 40))
        self.templates = [
            [rng.choice(VOCAB) if k % 10 < 7 else "" for k in range(40)]
            for _ in range(self.TEMPLATES)
        ]

    def next(self) -> str:
        i = len(self.texts)
        if i > 10 and self.rng.random() < DUP_RATE:
            text = _perturb(self.rng, self.texts[self.rng.randrange(i)])
            self.planted.append(i)
        else:
            template = self.templates[self.rng.randrange(self.TEMPLATES)]
            text = " ".join(w or self.rng.choice(VOCAB) for w in template)
        self.texts.append(text)
        return text


def _tools_literal(name: str) -> str:
    spec = {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Look up {name}",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    return repr([spec])


def _system(i: int) -> str:
    return f"<tools>\n{_tools_literal(f'f{i % 50}')}\n</tools>"


def _call(i: int) -> str:
    return (
        "<tool_call>\n" + repr({"name": f"f{i % 50}", "arguments": {"q": "x"}}) + "\n</tool_call>"
    )


def generate(root: Path, scale: float, seed: int = 0) -> dict[str, list[int]]:
    """Write the six sources under ``root``; return source -> planted duplicate row indices."""
    rng = random.Random(seed)
    n = {k: max(20, round(v * scale)) for k, v in SHAPE.items()}
    planted: dict[str, list[int]] = {}

    def jsonl(name: str, rows: Any) -> None:
        with (root / name).open("w") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")

    g = Gen(rng, (60, 260))
    jsonl(
        "infinity.jsonl",
        (
            {
                "id": f"ii{i}",
                "conversations": [
                    {"from": "human", "value": g.next()},
                    {"from": "gpt", "value": "answer"},
                ],
                "label": {"ability_en": ["x"]},
                "langdetect": "en",
                "source": "s",
            }
            for i in range(n["infinity"])
        ),
    )
    planted["infinity"] = g.planted
    g = Gen(rng, (40, 200))
    rows = [
        {"question": "Solve for x: " + g.next(), "answer": "x = 1", "source": "mathstackexchange"}
        for _ in range(n["webinstruct"])
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "webinstruct.parquet")
    planted["webinstruct"] = g.planted
    g = Gen(rng, (40, 200))
    jsonl(
        "codefeedback.jsonl",
        (
            {"query": "Write a python function: " + g.next(), "answer": "```py\n```",
             "resource": "r", "lang": "python"}
            for _ in range(n["codefeedback"])
        ),
    )  # fmt: skip
    planted["codefeedback"] = g.planted
    g = TemplatedGen(rng)
    rows = [
        {"type": "GSM_AnsAug", "query": f"How many {g.next()}?", "original_question": "q",
         "response": "The answer is: 3"}
        for _ in range(n["metamath"])
    ]  # fmt: skip
    (root / "metamath.json").write_text(json.dumps(rows))
    planted["metamath"] = g.planted
    g = Gen(rng, (20, 80))
    jsonl(
        "hermes.jsonl",
        (
            {
                "id": f"h{i}",
                "conversations": [
                    {"from": "system", "value": _system(i)},
                    {"from": "human", "value": g.next()},
                    {"from": "gpt", "value": _call(i)},
                    {"from": "tool", "value": "<tool_response>\n{'ok': True}\n</tool_response>"},
                    {"from": "gpt", "value": "done"},
                ],
            }
            for i in range(n["hermes"])
        ),
    )  # fmt: skip
    planted["hermes"] = g.planted
    g = Gen(rng, (60, 200))
    jsonl(
        "agent.jsonl",
        (
            {
                "id": f"a{i}",
                "conversations": [
                    {"from": "human", "loss": False, "value": g.next()},
                    {"from": "gpt", "loss": True, "value": "Think: x\nAct: bash"},
                    {"from": "human", "loss": False, "value": "The output of the OS: 1"},
                    {"from": "gpt", "loss": True, "value": "Act: answer(1)"},
                ],
            }
            for i in range(n["agent"])
        ),
    )
    planted["agent"] = g.planted
    return planted


CONFIG = """\
sources:
  - {name: infinity, schema: infinity_instruct, path: infinity.jsonl, domain: auto}
  - {name: webinstruct, schema: webinstruct, path: webinstruct.parquet, domain: math}
  - {name: codefeedback, schema: codefeedback, path: codefeedback.jsonl, domain: code}
  - {name: metamath, schema: metamath, path: metamath.json, domain: math}
  - {name: hermes, schema: hermes_fc, path: hermes.jsonl, domain: tool}
  - {name: agent, schema: agentinstruct, path: agent.jsonl, domain: agent}
out: out
existing: {counts: {code: 77000, general: 15000, math: 8000}}
mix: {code: 0.4, general: 0.3, math: 0.25, tool: 0.03, agent: 0.02}
dedup: {threshold: 0.8}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20K rows instead of 193K")
    ap.add_argument(
        "--rows", type=int, default=None, help="total rows (e.g. 2000000); the six sources scale"
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="keep the generated corpus in this folder and reuse it on the next run with the "
        "same --rows (generating 2M rows takes minutes)",
    )
    args = ap.parse_args()
    total = args.rows if args.rows else 20_000 if args.quick else sum(SHAPE.values())
    scale = total / sum(SHAPE.values())
    target_s = (
        60.0
        if total <= sum(SHAPE.values())
        else 60.0
        + 240.0 * min(1.0, (total - sum(SHAPE.values())) / (2_000_000 - sum(SHAPE.values())))
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if args.data is None else args.data
        t0 = time.perf_counter()
        marker = root / f"planted-{total}.json"
        if args.data is not None and marker.exists():
            planted = json.loads(marker.read_text())
        else:
            root.mkdir(parents=True, exist_ok=True)
            planted = generate(root, scale)
            marker.write_text(json.dumps(planted))
        gen_s = time.perf_counter() - t0
        (root / "prepare.yaml").write_text(CONFIG)
        shutil.rmtree(root / "out", ignore_errors=True)
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        exe = str(Path(sys.executable).parent / "draftdata")
        cmd = [exe, "prepare", str(root / "prepare.yaml"),
               "--out", str(root / "out"), "-q"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"prepare failed:\n{proc.stdout}\n{proc.stderr}")
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss_mib = usage.ru_maxrss / 1024
        cpu_s = usage.ru_utime + usage.ru_stime
        kept: dict[str, set[int]] = {}
        for shard in sorted((root / "out").glob("prompts-*.jsonl")):
            with shard.open("rb") as fh:
                for line in fh:
                    p = json.loads(line)
                    kept.setdefault(p["source"], set()).add(p["meta"]["row"])
        report = json.loads((root / "out" / "prepare_report.json").read_text())
        rows = report["totals"]["read"]
        n_planted = sum(len(v) for v in planted.values())
        missed = sum(len(set(v) & kept.get(s, set())) for s, v in planted.items())
        originals = rows - n_planted
        dropped_originals = originals - sum(
            len(kept.get(s, set()) - set(v)) for s, v in planted.items()
        )
        print(f"rows: {rows:,} (planted near-duplicates: {n_planted:,}); generated in {gen_s:.1f}s")
        print(
            f"prepare wall time: {wall:.1f} s (target <= {target_s:.0f} s: "
            f"{wall / target_s:.2f} of budget) -> "
            f"{rows / wall:,.0f} rows/s; CPU {cpu_s:.1f} s; load average "
            f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        print(f"peak RSS: {rss_mib:,.0f} MiB (target <= 2048 MiB: {rss_mib / 2048:.2f})")
        print(
            f"near-duplicate recall: {(n_planted - missed) / max(n_planted, 1):.4f} "
            f"({n_planted - missed:,} of {n_planted:,})"
        )
        print(f"originals dropped (false positives): {dropped_originals} of {originals:,}")
        print(
            f"taken: {report['totals']['taken']:,}; duplicates: {report['totals']['duplicates']:,}"
        )


if __name__ == "__main__":
    main()
