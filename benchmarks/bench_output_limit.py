"""Benchmark: the share of answers cut by the output limit, old fixed default against the new one.

A simulated SGLang server with an 8K context and the simulator's default answer lengths (a
lognormal with mean 2,700 tokens, sigma 0.8: a reasoning target) answers the same prompts twice
through ``draftdata.generate``: once with the old default ``--max-tokens 4096``, once with the
new default (no ``--max-tokens``: each request may fill the context, i.e. the context length
minus that request's prompt tokens). Printed: the share of answers with ``finish_reason:
length`` in each run (all answers, single-turn prompts' answers, and second turns, which carry
the first answer and so have less of the context left), and the share of prompts that failed
``context_length``.

    python benchmarks/bench_output_limit.py             # 400 prompts (1 in 4 multi-turn)
    python benchmarks/bench_output_limit.py --quick     # 100 prompts
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.records import Turn
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store.read import iter_completions, iter_failures

CONTEXT = 8192


def write_prompts(path: Path, n: int) -> None:
    """``n`` prompts; every fourth has two user turns (the second carries the first answer)."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            msgs: list[dict[str, Any]] = [
                {"role": "user", "content": f"Question {i}: explain item {i} step by step."}
            ]
            if i % 4 == 3:
                msgs += [
                    {"role": "assistant", "content": "(replaced by the target's answer)"},
                    {"role": "user", "content": "Now check your answer."},
                ]
            f.write(json.dumps({"id": f"q{i:05d}", "messages": msgs}) + "\n")


def run(prompts: Path, out: Path, urls: list[str], max_tokens: int | None) -> dict[str, float]:
    """One generate run; the shares of cut answers and of context_length failures."""
    cfg = GenerateConfig(
        prompts=str(prompts),
        endpoints=urls,
        out=str(out),
        max_tokens=max_tokens,
        progress="off",
        flush_seconds=0.5,
        hedge=False,
    )
    t0 = time.perf_counter()
    generate(cfg, log=lambda line: None)
    wall = time.perf_counter() - t0
    got = list(iter_completions(str(out)))
    failed = [f for f in iter_failures(str(out)) if f.reason == "context_length"]
    turns = [t for c in got for t in c.turns]
    single = [c.turns[0] for c in got if len(c.turns) == 1]
    later = [t for c in got for t in c.turns[1:]]
    return {
        "cut": share(turns),
        "single": share(single),
        "later": share(later),
        "context_failed": len(failed) / max(1, len(got) + len(failed)),
        "wall": wall,
    }


def share(turns: list[Turn]) -> float:
    """The share of ``turns`` cut by the output limit."""
    return sum(t.finish_reason == "length" for t in turns) / max(1, len(turns))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 prompts instead of 400")
    args = ap.parse_args()
    n = 100 if args.quick else 400
    config = SimConfig(time_scale=0.0, context_length=CONTEXT, max_running=64)
    with tempfile.TemporaryDirectory() as tmp, SimFleet(2, config) as fleet:
        root = Path(tmp)
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, n)
        old = run(prompts, root / "old", fleet.urls, 4096)
        new = run(prompts, root / "new", fleet.urls, None)
    print(
        f"output limit on a simulated {CONTEXT}-token-context server, {n} prompts "
        f"(lognormal answers, mean {config.mean_output_tokens} tokens, sigma "
        f"{config.output_sigma}; 1 in 4 multi-turn):"
    )
    for name, r in (("old default --max-tokens 4096", old), ("new default (fill context)", new)):
        print(
            f"  {name:30s}: {r['cut']:6.1%} of answers cut (finish_reason length): "
            f"single-turn prompts {r['single']:.1%}, second turns {r['later']:.1%}; "
            f"{r['context_failed']:.1%} of prompts failed context_length ({r['wall']:.1f} s)"
        )
    print(
        f"  answers cut: {old['cut']:.1%} -> {new['cut']:.1%}; single-turn answers "
        f"{old['single']:.1%} -> {new['single']:.1%} (a second turn carries the first answer, "
        "so less of the context is left for it)"
    )


if __name__ == "__main__":
    main()
