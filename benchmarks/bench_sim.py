"""Benchmark: the simulator's own speed, and whether its timing follows its model.

1. Throughput: one server at ``--time-scale 0`` (answers without modelled delay), 64 concurrent
   aiohttp clients, short answers: requests/s the simulator sustains (client cost included).
   A benchmark of a client against the simulator is only meaningful well below this rate.
2. Timing model: with every answer cut at ``max_tokens`` (the mean output length is set far
   above it), B requests against ``max_running`` = B decode together in T steps of
   ``step_s(B) = (base_step_s + per_seq_step_s * B) * time_scale``; 2B requests take two
   rounds (the second half waits). Printed: measured wall time against the model, per batch
   size, and the decode rate in tokens/s against B / step_s(B).

    python benchmarks/bench_sim.py            # 4,000 requests; batches 8, 32, 64
    python benchmarks/bench_sim.py --quick    # 1,000 requests; batches 8, 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import aiohttp

from draftdata.sim.run import SimConfig, SimFleet

USER = [{"role": "user", "content": "Explain the idea briefly."}]


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status


async def throughput(url: str, n: int, concurrency: int = 64) -> float:
    """Requests/s of ``n`` short requests with ``concurrency`` in flight."""
    body = {"messages": USER, "max_completion_tokens": 16}
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def one(i: int) -> int:
            async with sem:
                return await _post(session, url, {**body, "seed": i})

        t0 = time.perf_counter()
        codes = await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    assert all(c == 200 for c in codes), set(codes)
    return n / wall


async def batch_wall(url: str, requests: int, tokens: int) -> float:
    """Wall time of ``requests`` simultaneous requests cut at ``tokens`` output tokens."""
    body = {"messages": USER, "max_completion_tokens": tokens}
    conn = aiohttp.TCPConnector(limit=requests)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        codes = await asyncio.gather(
            *(_post(session, url, {**body, "seed": i}) for i in range(requests))
        )
        wall = time.perf_counter() - t0
    assert all(c == 200 for c in codes), set(codes)
    return wall


def main() -> None:
    """Run both parts and print measured figures against the model."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and batch sizes")
    args = ap.parse_args()
    n = 1_000 if args.quick else 4_000
    with SimFleet(n=1, config=SimConfig(time_scale=0.0, mean_output_tokens=16)) as fleet:
        rps = asyncio.run(throughput(fleet.urls[0], n))
    print(
        f"throughput at --time-scale 0: {rps:,.0f} requests/s over {n:,} requests "
        f"(64 in flight, one server, client included; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores)"
    )
    tokens, scale = 100, 0.2
    for b in (8, 32) if args.quick else (8, 32, 64):
        config = SimConfig(
            time_scale=scale, max_running=b, mean_output_tokens=1_000_000, context_length=1 << 20
        )
        with SimFleet(n=1, config=config) as fleet:
            one = asyncio.run(batch_wall(fleet.urls[0], b, tokens))
            two = asyncio.run(batch_wall(fleet.urls[0], 2 * b, tokens))
        model = tokens * config.step_s(b)
        rate, model_rate = b * tokens / one, b / config.step_s(b)
        print(
            f"batch {b:>2}: {b} x {tokens} tokens in {one:.3f} s (model {model:.3f} s, ratio "
            f"{one / model:.2f}); {2 * b} requests in {two:.3f} s (model {2 * model:.3f} s, "
            f"ratio {two / (2 * model):.2f}); decode {rate:,.0f} tokens/s (model "
            f"{model_rate:,.0f}, time scale {scale})"
        )


if __name__ == "__main__":
    main()
