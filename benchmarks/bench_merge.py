"""Benchmark: merge 2M tokenized samples; peak RSS must stay <= 2 GiB (issue 7).

Generates two tokenized inputs in a temp folder with numpy/pyarrow (fast, no Python loop per
row): an "existing" set at 77% code and an expansion, 3:1, with 1% of the expansion repeating
existing ids and 1% repeating existing contents under new ids (the dedup path runs). Samples are
short (8-48 tokens, mean 28) so the disk stays small and the figure is about row count: the
merge's own memory is its per-row keys (~40 bytes/row) plus one bucket and one shard, which do
not grow with the row count.

The merge runs in a child process (the CLI), so its peak RSS is measured alone (``wait4``).
It mixes by loss tokens (merge's default; ``--mix-by rows`` for the row mix) with
``--allow-drop``: the scenario keeps less than half of the code, which is the point of it.

    .venv/bin/python benchmarks/bench_merge.py            # 2,000,000 rows
    .venv/bin/python benchmarks/bench_merge.py --quick    # 200,000 rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftdata.shared.formats import SAMPLE_SCHEMA
from draftdata.store.write import parquet_bytes

TARGET_RSS = 2 << 30
MIX = "code=0.35,math=0.2,general=0.3,tool=0.1,agent=0.05"
SHARD = 100_000


def _write_input(
    folder: Path, prefix: str, n: int, domains: dict[str, float], rng: np.random.Generator
) -> tuple[pa.Array, pa.Array]:
    """Write ``n`` samples in shards; returns (ids, input_ids) of the first shard for dups."""
    folder.mkdir(parents=True)
    names = list(domains)
    first: tuple[pa.Array, pa.Array] | None = None
    for s, start in enumerate(range(0, n, SHARD)):
        k = min(SHARD, n - start)
        ids = pc.binary_join_element_wise(
            prefix, pc.cast(pa.array(np.arange(start, start + k)), pa.string()), ""
        )
        lengths = rng.integers(8, 49, k).astype(np.int32)
        offsets = np.zeros(k + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = rng.integers(0, 150_000, int(offsets[-1]), dtype=np.int32)
        mask = np.ones(int(offsets[-1]), np.int8)
        mask[offsets[:-1]] = 0
        dom = np.asarray(names)[rng.choice(len(names), k, p=list(domains.values()))]
        table = pa.table(
            [
                ids,
                pa.array([prefix] * k, pa.string()),
                pa.array(dom, pa.string()),
                pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
                pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
                pa.array(lengths),
                pa.array(lengths - 1),
                pa.array(np.zeros(k, bool)),
            ],
            schema=SAMPLE_SCHEMA,
        )
        if first is None:
            first = (
                table.column("id").combine_chunks(),
                table.column("input_ids").combine_chunks(),
            )
        (folder / f"part-{s:05d}.parquet").write_bytes(parquet_bytes(table))
    assert first is not None
    return first


def _write_dups(folder: Path, ids: pa.Array, input_ids: pa.Array, n: int) -> None:
    """Two shards of duplicates of the existing set: same ids, and same contents."""
    k = min(n, len(ids) // 2)
    same_id = pa.table(
        {
            "id": ids.slice(0, k),
            "source": pa.array(["dup"] * k),
            "domain": pa.array(["math"] * k),
            "input_ids": pc.list_slice(input_ids.slice(k, k), 0, 4),  # other contents
        }
    )
    same_text = pa.table(
        {
            "id": pc.binary_join_element_wise("d", ids.slice(k, k), ""),
            "source": pa.array(["dup"] * k),
            "domain": pa.array(["math"] * k),
            "input_ids": input_ids.slice(k, k),
        }
    )
    for i, t in enumerate((same_id, same_text)):
        lens = pc.list_value_length(t.column("input_ids")).cast(pa.int32())
        offsets = np.zeros(t.num_rows + 1, np.int32)
        np.cumsum(lens.to_numpy(), out=offsets[1:])
        ones = pa.array(np.ones(int(offsets[-1]), np.int8))
        t = t.append_column("loss_mask", pa.ListArray.from_arrays(pa.array(offsets), ones))
        t = t.append_column("num_tokens", lens).append_column("num_loss_tokens", lens)
        t = t.append_column("truncated", pa.array(np.zeros(t.num_rows, bool)))
        t = t.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)
        (folder / f"part-dup{i}.parquet").write_bytes(parquet_bytes(t))


_CHILD = """
import json, sys
from draftdata.merge.config import MergeConfig
from draftdata.shared.mix import parse_mix
from draftdata.merge.stage import merge
a = json.loads(sys.argv[1])
s = merge(MergeConfig(existing=a["existing"], add=a["add"], mix=parse_mix(a["mix"]),
                      out=a["out"], seed=1, eval_fraction=0.01, tmp_dir=a["tmp"],
                      mix_by=a["mix_by"], allow_drop=True))
print(json.dumps({"train": s.train_rows, "eval": s.eval_rows, "files": len(s.files),
                  "timings": s.stats.timings, "elapsed": s.elapsed_s,
                  "dropped": s.report["dropped"], "achieved": s.report["achieved"],
                  "kept": s.report["plan"]["kept_share"], "unit": s.report["mix_by"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200K rows instead of 2M")
    parser.add_argument("--rows", type=int, default=None, help="total rows (overrides --quick)")
    parser.add_argument(
        "--mix-by", default="tokens", choices=("tokens", "rows"), help="merge's --mix-by"
    )
    args = parser.parse_args()
    total = args.rows or (200_000 if args.quick else 2_000_000)
    n_existing = total * 3 // 4
    n_dup = total // 400  # 0.25% of all rows, per kind of duplicate
    n_add = total - n_existing - 2 * n_dup
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        ids, toks = _write_input(
            root / "existing", "e", n_existing, {"code": 0.77, "math": 0.1, "general": 0.13}, rng
        )
        _write_input(
            root / "add",
            "a",
            n_add,
            {"code": 0.1, "math": 0.35, "general": 0.3, "tool": 0.15, "agent": 0.1},
            rng,
        )
        _write_dups(root / "add", ids, toks, n_dup)
        del ids, toks
        disk = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        gen_s = time.perf_counter() - t0
        print(
            f"bench_merge: generated {total:,} samples (8-48 tokens, mean 28) in 2 inputs, "
            f"{disk / 2**20:,.0f} MiB of parquet, in {gen_s:.1f}s"
        )
        spec = {
            "existing": [str(root / "existing")],
            "add": [str(root / "add")],
            "mix": MIX,
            "out": str(root / "out"),
            "tmp": str(root),
            "mix_by": args.mix_by,
        }
        t1 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(spec)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        wall = time.perf_counter() - t1
        if proc.returncode != 0:
            sys.exit(f"bench_merge: merge failed (exit {proc.returncode})")
        result = json.loads(out.strip().splitlines()[-1])
        peak = usage.ru_maxrss * 1024  # kilobytes on Linux
        cpu = usage.ru_utime + usage.ru_stime  # unaffected by other processes on the machine
        rows_out = result["train"] + result["eval"]
        t = result["timings"]
        print(
            f"bench_merge: merged {total:,} rows -> {result['train']:,} train + "
            f"{result['eval']:,} eval in {result['files']} files; dropped {result['dropped']}"
        )
        print(
            f"bench_merge: time {wall:.1f}s wall (merge {result['elapsed']:.1f}s: scan "
            f"{t.get('scan', 0):.1f}s, plan {t.get('plan', 0):.1f}s, route "
            f"{t.get('route', 0):.1f}s, write {t.get('write', 0):.1f}s); "
            f"{total / result['elapsed']:,.0f} input rows/s, {rows_out / result['elapsed']:,.0f} "
            f"output rows/s; CPU {cpu:.1f}s ({total / cpu:,.0f} input rows per CPU-second; "
            f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )
        print(
            f"bench_merge: peak RSS of the merge process {peak / 2**20:,.0f} MiB; target <= "
            f"{TARGET_RSS / 2**20:,.0f} MiB: {peak / TARGET_RSS:.2f}x of the limit "
            f"({'OK' if peak <= TARGET_RSS else 'OVER'})"
        )
        achieved = ", ".join(f"{d} {100 * v:.1f}%" for d, v in result["achieved"].items())
        print(
            f"bench_merge: achieved mix in {result['unit']} {achieved} (target {MIX}); "
            f"kept {100 * result['kept']:.1f}% of what the mix could use (--allow-drop)"
        )


if __name__ == "__main__":
    main()
