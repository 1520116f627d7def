"""Benchmark: the loss-token planner of ``merge --mix-by tokens`` on a seed-job-sized input.

293,000 unique rows in five domains at the seed job's skew (77% code by rows), loss tokens per
row lognormal (agent answers ~4.5x longer than the rest), target
code=0.35,math=0.25,general=0.25,tool=0.1,agent=0.05. For each setting it prints the planner's
CPU time, the share of the loss tokens kept, how far that is from the relaxation's upper bound
(the most any plan could keep), and whether the search ran to the end.

    .venv/bin/python benchmarks/bench_token_plan.py
"""

from __future__ import annotations

import time

import numpy as np

from draftdata.merge.tokenplan import MAX_NODES, plan_tokens

SIZES = {"code": 225_000, "math": 25_000, "general": 30_000, "tool": 9_000, "agent": 4_000}
TARGET = {"code": 0.35, "math": 0.25, "general": 0.25, "tool": 0.1, "agent": 0.05}


def main() -> None:
    rng = np.random.default_rng(0)
    weights = {
        g: rng.lognormal(7.5 if g == "agent" else 6.0, 1.0, size=n).astype(np.int64) + 1
        for g, n in SIZES.items()
    }
    supply = sum(int(w.sum()) for w in weights.values())
    print(f"{sum(SIZES.values()):,} rows, {supply:,} loss tokens; search budget {MAX_NODES:,}")
    for tolerance, upsample in ((0.005, False), (0.02, False), (0.005, True)):
        start = time.process_time()
        plan = plan_tokens(weights, TARGET, tolerance=tolerance, upsample=upsample, max_repeat=4)
        took = time.process_time() - start
        unique = sum(plan.unique_kept.values())  # distinct loss tokens kept
        gap = plan.bound - unique
        print(
            f"tolerance {tolerance:g}{' upsample' if upsample else ''}: {took:.2f} s CPU, "
            f"keeps {unique / supply:.1%} (+{plan.total - unique:,} "
            f"copies), {gap:,} tokens ({gap / max(plan.bound, 1):.4%}) under the bound, "
            f"search {'complete' if plan.optimal else 'cut short'}"
        )


if __name__ == "__main__":
    main()
