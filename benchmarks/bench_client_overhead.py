"""Benchmark: the engine's per-request overhead beside the official openai client and bare aiohttp.

A zero-delay simulated fleet (``draftdata fleet sim --time-scale 0`` in a child process, pinned to
the second core when there is one) answers at once, so completions per second measure only the
client side. Three loops, each pinned to core 0 (``os.sched_setaffinity``), send the same request
bodies (``client.request_body``: reasoning on, token ids asked) with the same concurrency:

- draftdata: ``generate(config)`` end to end -- prompt reading, dispatch, parsing, and durable
  create-only parquet writes to a local run folder, read back afterwards to check the count;
- openai: ``AsyncOpenAI.chat.completions.create`` in worker tasks (no writes);
- bare: ``aiohttp`` post + ``msgspec`` decode in worker tasks (no writes): the ceiling.

Targets: draftdata >= 2x the openai loop and >= 0.6 of the bare loop. The baselines do less work
than the engine (no parsing into records, no writes), so the comparison is conservative. When
the simulator's own core is saturated (its CPU share is printed) the bare figure is the
simulator's ceiling, not the client's. On a shared, loaded machine the wall figures measure the
scheduler as much as the client, so each loop is also reported per CPU-second of the client
process (its own user + system time, all threads): what it would do alone on its core.

    python benchmarks/bench_client_overhead.py           # 6,000 requests per loop
    python benchmarks/bench_client_overhead.py --quick   # 1,500
    python benchmarks/bench_client_overhead.py --profile # also py-spy the engine (if installed)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CORE_CLIENT = 0
CORE_SIM = 1
SERVERS = 2
CONCURRENCY = 64  # per endpoint, every loop
MODEL = "Qwen3.6-27B-sim"
TARGET_OPENAI = 2.0
TARGET_BARE = 0.6


def pin(pid: int, core: int) -> bool:
    """Pin ``pid`` (0: this process) to ``core`` when the machine has it."""
    if not hasattr(os, "sched_setaffinity") or core >= (os.cpu_count() or 1):
        return False
    try:
        os.sched_setaffinity(pid, {core})
    except OSError:
        return False
    return True


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_prompts(path: Path, n: int) -> list[Any]:
    import msgspec

    from draftdata.records import Message, Prompt

    rng = random.Random(3)
    out = []
    with path.open("wb") as fh:
        for i in range(n):
            text = f"Question {i}: " + " ".join(rng.choices(["sort", "tree", "sum", "map"], k=8))
            p = Prompt(id=f"q{i:06d}", messages=[Message(role="user", content=text)])
            out.append(p)
            fh.write(msgspec.json.encode(p) + b"\n")
    return out


def bodies(prompts: list[Any]) -> list[dict[str, Any]]:
    from draftdata.generate.config import Sampling
    from draftdata.generate.engine.client import request_body
    from draftdata.generate.engine.request import Request

    return [
        request_body(
            Request(
                messages=p.messages,
                model=MODEL,
                max_tokens=256,
                sampling=Sampling(),
                reasoning="on",
                token_ids=True,
            )
        )
        for p in prompts
    ]


# -- the three loops -----------------------------------------------------------------------------


def run_engine(urls: list[str], prompts_path: Path, out: Path, n: int) -> tuple[float, float]:
    import msgspec

    from draftdata.generate.config import GenerateConfig
    from draftdata.generate.stage import generate
    from draftdata.store.read import iter_completion_tables

    cfg = msgspec.convert(
        {
            "prompts": str(prompts_path),
            "endpoints": urls,
            "out": str(out),
            "max_tokens": 256,
            "reasoning": "on",
            "concurrency": CONCURRENCY,
            "progress": "off",
            "hedge": False,
        },
        GenerateConfig,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    generate(cfg, log=lambda line: None, handle_signals=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    done = sum(t.num_rows for t in iter_completion_tables(str(out), columns=["id"]))
    if done != n:
        raise SystemExit(f"engine committed {done} of {n} completions")
    return wall, cpu


async def _workers(n: int, width: int, one: Any) -> None:
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(width)))


def run_openai(urls: list[str], reqs: list[dict[str, Any]]) -> tuple[float, float]:
    from openai import AsyncOpenAI

    async def go() -> tuple[float, float]:
        clients = [AsyncOpenAI(base_url=u + "/v1", api_key="none", max_retries=0) for u in urls]
        results: list[Any] = [None] * len(reqs)

        async def one(i: int) -> None:
            body = reqs[i]
            extra = {k: v for k, v in body.items() if k not in ("model", "messages", "max_tokens")}
            resp = await clients[i % len(clients)].chat.completions.create(
                model=body["model"],
                messages=body["messages"],
                max_tokens=body["max_tokens"],
                extra_body=extra,
            )
            results[i] = resp.choices[0].message.content

        t0, c0 = time.perf_counter(), time.process_time()
        await _workers(len(reqs), CONCURRENCY * len(urls), one)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        for c in clients:
            await c.close()
        assert all(r is not None for r in results)
        return wall, cpu

    return asyncio.run(go())


def run_bare(urls: list[str], reqs: list[dict[str, Any]]) -> tuple[float, float]:
    import aiohttp
    import msgspec

    async def go() -> tuple[float, float]:
        encode = msgspec.json.Encoder().encode
        decode = msgspec.json.Decoder().decode
        width = CONCURRENCY * len(urls)
        chat = [u + "/v1/chat/completions" for u in urls]
        results: list[Any] = [None] * len(reqs)
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=width)) as s:

            async def one(i: int) -> None:
                async with s.post(chat[i % len(chat)], data=encode(reqs[i]), headers=headers) as r:
                    data = decode(await r.read())
                results[i] = data["choices"][0]["message"]["content"]

            t0, c0 = time.perf_counter(), time.process_time()
            await _workers(len(reqs), width, one)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert all(r is not None for r in results)
        return wall, cpu

    return asyncio.run(go())


def profile_engine(urls: list[str], prompts_path: Path, out: Path, n: int) -> None:
    """Run the engine loop under py-spy (top functions by own time) when it is installed."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("profile: py-spy not installed (pip install py-spy)")
        return
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "import bench_client_overhead as b; from pathlib import Path; b.pin(0, b.CORE_CLIENT); "
        f"print(b.run_engine({urls!r}, Path({str(prompts_path)!r}), Path({str(out)!r}), {n}))"
    )
    raw = out.parent / "profile.txt"
    subprocess.run(
        [spy, "record", "-f", "raw", "-o", str(raw), "-r", "200", "--", sys.executable, "-c", code],
        check=False,
        capture_output=True,
    )
    if not raw.exists():
        print("profile: py-spy failed (needs ptrace permission)")
        return
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        own[leaf] = own.get(leaf, 0) + int(count)
        total += int(count)
    print("profile: top functions by own time (engine loop)")
    for leaf, c in sorted(own.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {100 * c / max(1, total):5.1f}%  {leaf}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,500 requests per loop")
    ap.add_argument("--requests", type=int, default=None, help="requests per loop")
    ap.add_argument("--profile", action="store_true", help="py-spy the engine loop afterwards")
    ap.add_argument(
        "--repeat", type=int, default=None, help="rounds (best kept; default 2, quick 1)"
    )
    args = ap.parse_args()
    n = args.requests or (1500 if args.quick else 6000)
    args.repeat = args.repeat or (1 if args.quick else 2)
    pinned = pin(0, CORE_CLIENT)

    from draftdata.sim.run import SimProcess

    load0 = os.getloadavg()[0]
    sim_args = ["--time-scale", "0", "--mean-output-tokens", "32", "--seed", "5"]
    with (
        tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp,
        SimProcess(n=SERVERS, args=sim_args) as fleet,
    ):
        sim_pinned = pin(fleet.pid, CORE_SIM)
        work = Path(tmp)
        prompts_path = work / "prompts.jsonl"
        prompts = write_prompts(prompts_path, n)
        reqs = bodies(prompts)
        print(
            f"{n} requests per loop, {SERVERS} zero-delay sim endpoints x concurrency "
            f"{CONCURRENCY}; client pinned to core {CORE_CLIENT}: {pinned}, simulator pinned to "
            f"core {CORE_SIM}: {sim_pinned}"
        )
        # warm-ups: connections, lazy imports (pyarrow, pydantic models), caches
        warm_path = work / "warm.jsonl"
        write_prompts(warm_path, 200)
        run_bare(fleet.urls, reqs[:200])
        run_openai(fleet.urls, reqs[:200])
        run_engine(fleet.urls, warm_path, work / "warm-run", 200)
        rates: dict[str, float] = {}
        per_cpu: dict[str, float] = {}
        loops = {
            "bare": lambda k: run_bare(fleet.urls, reqs),
            # the openai loop is slow: a quarter of the requests measure its rate well enough
            "openai": lambda k: run_openai(fleet.urls, reqs[: max(500, n // 4)]),
            "draftdata": lambda k: run_engine(fleet.urls, prompts_path, work / f"run-{k}", n),
        }
        for k in range(args.repeat):
            for name, fn in loops.items():
                sim0 = cpu_seconds(fleet.pid)
                wall, cpu = fn(k)
                sim_share = (cpu_seconds(fleet.pid) - sim0) / wall
                m = max(500, n // 4) if name == "openai" else n
                rates[name] = max(rates.get(name, 0.0), m / wall)
                per_cpu[name] = max(per_cpu.get(name, 0.0), m / cpu)
                print(
                    f"{name:<10} {m / wall:8,.0f} completions/s wall, {m / cpu:8,.0f} per client "
                    f"CPU-second (client CPU {cpu / wall:.0%}, simulator CPU {sim_share:.0%})"
                )
        if args.profile:
            profile_engine(fleet.urls, prompts_path, work / "run-profile", n)
    for label, figures in (("wall, best", rates), ("per CPU-second, best", per_cpu)):
        ours = figures["draftdata"]
        r_openai = ours / figures["openai"]
        r_bare = ours / figures["bare"]
        ok = r_openai >= TARGET_OPENAI and r_bare >= TARGET_BARE
        print(
            f"client overhead ({label}): draftdata {ours:,.0f}/s = {r_openai:.2f}x openai "
            f"(target >= {TARGET_OPENAI:.1f}x), {r_bare:.2f} of bare aiohttp (target >= "
            f"{TARGET_BARE}) -> {'PASS' if ok else 'BELOW TARGET'}"
        )
    load1 = os.getloadavg()[0]
    print(f"load average at start / end: {load0:.2f} / {load1:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
