"""Benchmark: resume start-up of a large run (issue 4).

Builds (in a temporary folder) a run of 1,000,000 prompts of which 990,000 are committed, as a
generate run would leave them: ``manifest.json`` plus ``completions/part-*.parquet`` shards of
256 records each (the default flush size; ~3,900 shards) and the rollups their writers leave
every 64 shards (``index/``, see ``draftdata.store.rollup``), with the 10,000 uncommitted prompts
at the END of the prompt file (the worst case: resume must pass 990,000 done prompts before it
finds work). Then a fresh child process does what a resumed ``generate`` needs before its first
request: ``Run.open`` (list, manifest check, done-set rebuild from the rollups and the id/sample
columns), stream the prompt file skipping done prompts by their id alone, 4,096 lines at a
time through ``Run.done_mask`` (only the first new prompt is parsed and validated), and send
it to a simulated server (``SimFleet``). When the engine is installed, the real ``draftdata
generate`` is measured too, from spawn to the simulator's first chat request. Printed: those
times (interpreter start-up and imports included), the done-set rebuild time, CPU time, and
each child's peak RSS (``wait4``).
Targets: <= 10 s and <= 1 GiB.

Answer texts are short: the rebuild reads only the ``id`` and ``sample`` column chunks, so the
shards' other columns cost disk, not resume time.

    python benchmarks/bench_resume.py            # 1,000,000 prompts, 990,000 committed
    python benchmarks/bench_resume.py --quick    # 100,000 prompts, 99,000 committed
    python benchmarks/bench_resume.py --s3       # also on a local moto S3 server (slower)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

TARGET_S = 10.0
TARGET_RSS_MIB = 1024.0
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
SETTINGS = {"model": "bench", "sampling": {"temperature": 0.6}, "prompts": "bench-1"}


def _ids(n: int) -> list[str]:
    return [f"bench/{i:07d}" for i in range(n)]


def write_prompts(path: Path, n: int) -> None:
    """``n`` single-turn prompts, one JSON line each."""
    with path.open("wb") as fh:
        for pid in _ids(n):
            line = {"id": pid, "source": "bench", "domain": "general"}
            line["messages"] = [{"role": "user", "content": f"Explain item {pid} briefly."}]
            fh.write(json.dumps(line).encode() + b"\n")


def create_run(url: str, prompts: Path, endpoint: str, env: dict[str, str]) -> bool:
    """Let ``draftdata generate --limit 1`` create the run (its manifest, one completion), so
    that a later ``generate`` over the same prompts resumes it; False without the engine."""
    import importlib.util

    if importlib.util.find_spec("draftdata.generate.stage") is None:
        return False
    cmd = [*CLI, "generate", "--prompts", str(prompts), "--endpoint", endpoint, "--out", url]
    subprocess.run(
        [*cmd, "--limit", "1", "--progress", "off"], env=env, check=True, capture_output=True
    )
    return True


def build_run(url: str, n_done: int, shard: int, first: int = 0) -> int:
    """Commit completions for prompts ``first .. n_done-1`` as shards (creating the run with
    the benchmark's own settings when ``first`` is 0); returns the shard count."""
    import pyarrow as pa

    from draftdata.records import Completion, Message, Turn, Usage
    from draftdata.shared.formats import completions_table
    from draftdata.store import Run, read_manifest, write_parquet_shard
    from draftdata.store.rollup import ROLLUP_EVERY, rollup_table

    settings = SETTINGS if first == 0 else read_manifest(url)["effective_settings"]
    run = Run.open(url, settings=settings, writer_id="builder")
    template = completions_table(
        Completion(
            id=f"t{i}",
            source="bench",
            domain="general",
            messages=[Message(role="user", content="Explain an item briefly.")],
            turns=[
                Turn(
                    content="A short answer. " * 8,
                    reasoning="Some thinking. " * 8,
                    finish_reason="stop",
                )
            ],
            usage=Usage(prompt_tokens=12, completion_tokens=60),
            model="bench",
            endpoint="http://127.0.0.1:1",
        )
        for i in range(shard)
    )
    ids = _ids(n_done)[first:]
    col = template.schema.get_field_index("id")

    def write(index: int) -> None:
        chunk = ids[index * shard : (index + 1) * shard]
        table = template.slice(0, len(chunk)).set_column(
            col, template.schema.field(col), pa.array(chunk, pa.string())
        )
        write_parquet_shard(run.store, key_of(index), table)

    def key_of(index: int) -> str:
        return f"completions/part-w{index % 8}-{index:06d}.parquet"

    def rollup(lo: int, hi: int) -> None:
        entries = [
            (
                key_of(i),
                ids[i * shard : (i + 1) * shard],
                [0] * len(ids[i * shard : (i + 1) * shard]),
                None,
            )
            for i in range(lo, hi)
        ]
        key = f"index/rollup-builder-{lo // ROLLUP_EVERY:06d}.parquet"
        write_parquet_shard(run.store, key, rollup_table(entries))

    shards = (len(ids) + shard - 1) // shard
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, range(shards)))
        # what the writers do every ROLLUP_EVERY shards: one rollup object of their ids
        groups = range(0, shards, ROLLUP_EVERY)
        list(pool.map(lambda g: rollup(g, min(g + ROLLUP_EVERY, shards)), groups))
    run.close()
    return shards


class _Id(msgspec.Struct):
    """Only the id of a prompt line."""

    id: str = ""


def child(url: str, prompts: str, endpoint: str) -> None:
    """The measured process: open the run, skip done prompts, send the first new one."""
    t_start = time.time()
    import urllib.request

    from draftdata.records import parse_prompt
    from draftdata.store import Run, read_manifest
    from draftdata.store.prompts import iter_prompt_lines

    t_imports = time.time()
    run = Run.open(url, settings=read_manifest(url)["effective_settings"])
    t_open = time.time()
    skipped = 0
    first = None
    # The id alone decides whether a prompt is done: decode the ids of a batch of lines in one
    # call, ask the done-set about the whole batch (Run.done_mask), parse only new prompts.
    ids = msgspec.json.Decoder(list[_Id])
    batch: list[tuple[int, bytes]] = []

    def first_new(batch: list[tuple[int, bytes]]) -> Any:
        nonlocal skipped
        done = run.done_mask(
            [p.id for p in ids.decode(b"[" + b",".join(r for _, r in batch) + b"]")]
        )
        for (lineno, raw), is_done in zip(batch, done.tolist(), strict=True):
            if not is_done:
                return parse_prompt(raw, f"{prompts}:{lineno}")
            skipped += 1
        return None

    for item in iter_prompt_lines(Path(prompts)):
        batch.append(item)
        if len(batch) == 4096:
            first = first_new(batch)
            batch = []
            if first is not None:
                break
    if first is None and batch:
        first = first_new(batch)
    assert first is not None, "every prompt is done"
    body = {
        "model": "m",
        "messages": [{"role": m.role, "content": m.content} for m in first.messages],
        "max_completion_tokens": 8,
    }
    req = urllib.request.Request(
        endpoint + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t_sent = time.time()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
    print(
        json.dumps(
            {
                "t_start": t_start,
                "imports_s": t_imports - t_start,
                "open_s": t_open - t_imports,
                "scan_s": t_sent - t_open,
                "t_sent": t_sent,
                "skipped": skipped,
                "first": first.id,
                "done": run.resumed_done,
                "rebuild_s": run.stats.timings.get("store.done_set_rebuild", 0.0),
                "list_s": run.stats.timings.get("store.list", 0.0),
                "rollups_s": run.stats.timings.get("store.read_rollups", 0.0),
                "doneset_mib": run._completed.nbytes / 2**20,
            }
        ),
        flush=True,
    )


def measure(url: str, prompts: Path, endpoint: str, env: dict[str, str]) -> dict[str, Any]:
    """Spawn the child, wait for it with wait4, return its figures plus wall time and RSS."""
    t_spawn = time.time()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", url, str(prompts), endpoint],
        stdout=subprocess.PIPE,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}): {out}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["first_request_s"] = result["t_sent"] - t_spawn
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # KiB on Linux
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    return result


def report(where: str, r: dict[str, Any], n: int, n_done: int, shards: int, build_s: float) -> None:
    """Print one block of figures and their ratios to the targets."""
    print(
        f"[{where}] {n:,} prompts, {r['done']:,} committed in {shards:,} shards "
        f"(built in {build_s:.1f} s); first new prompt {r['first']} after skipping "
        f"{r['skipped']:,}"
    )
    print(
        f"[{where}] imports {r['imports_s']:.2f} s, Run.open {r['open_s']:.2f} s "
        f"(list {r['list_s']:.2f} s, done-set rebuild {r['rebuild_s']:.2f} s of which rollups "
        f"{r['rollups_s']:.2f} s; done-set {r['doneset_mib']:.1f} MiB), prompt scan "
        f"{r['scan_s']:.2f} s"
    )
    print(
        f"[{where}] time to first new request: {r['first_request_s']:.2f} s "
        f"(target <= {TARGET_S:.0f} s: {r['first_request_s'] / TARGET_S:.2f} of budget); "
        f"child CPU {r['cpu_s']:.2f} s; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    print(
        f"[{where}] peak RSS: {r['peak_rss_mib']:.0f} MiB "
        f"(target <= {TARGET_RSS_MIB:.0f} MiB: {r['peak_rss_mib'] / TARGET_RSS_MIB:.2f} of budget)"
    )
    assert r["done"] == n_done, f"resumed {r['done']} of {n_done}"


def measure_engine(url: str, prompts: Path, fleet: Any, env: dict[str, str]) -> dict[str, float]:
    """Spawn the real ``draftdata generate`` on the run; time until the simulator sees its
    first chat request, then kill it and read its peak RSS and CPU time (wait4)."""
    before = fleet.stats(0).requests
    cmd = [*CLI, "generate", "--prompts", str(prompts), "--endpoint", fleet.urls[0]]
    cmd += ["--out", url, "--progress", "off"]
    t_spawn = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = None
    while proc.poll() is None:
        if fleet.stats(0).requests > before:
            first = time.time() - t_spawn
            break
        time.sleep(0.01)
    proc.kill()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if first is None:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"generate exited ({proc.returncode}) before any request: {err}")
    if proc.stderr:
        proc.stderr.close()
    return {
        "first_request_s": first,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def report_engine(where: str, r: dict[str, float]) -> None:
    """Print the engine's figures and their ratios to the targets."""
    print(
        f"[{where}] draftdata generate: time to first new request {r['first_request_s']:.2f} s "
        f"(target <= {TARGET_S:.0f} s: {r['first_request_s'] / TARGET_S:.2f} of budget), "
        f"peak RSS {r['peak_rss_mib']:.0f} MiB "
        f"(target <= {TARGET_RSS_MIB:.0f} MiB: {r['peak_rss_mib'] / TARGET_RSS_MIB:.2f}), "
        f"CPU {r['cpu_s']:.2f} s"
    )


def main() -> None:
    """Parse options, build the run(s), measure, print."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100K prompts, 99K committed")
    ap.add_argument("--prompts", type=int, default=None, help="total prompts (default 1,000,000)")
    ap.add_argument("--shard", type=int, default=256, help="records per shard (default 256)")
    ap.add_argument("--s3", action="store_true", help="also measure on a moto S3 server")
    ap.add_argument(
        "--child", nargs=3, metavar=("URL", "PROMPTS", "ENDPOINT"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    n = args.prompts or (100_000 if args.quick else 1_000_000)
    n_done = n * 99 // 100

    from draftdata.sim.run import SimConfig, SimFleet

    with (
        tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp,
        SimFleet(n=1, config=SimConfig(time_scale=0.0)) as fleet,
    ):
        prompts = Path(tmp) / "prompts.jsonl"
        write_prompts(prompts, n)
        url = str(Path(tmp) / "run")
        _bench("local", url, prompts, fleet, dict(os.environ), n, n_done, args.shard)
        if args.s3:
            _measure_s3(prompts, fleet, n, n_done, args.shard)


def _bench(
    where: str,
    url: str,
    prompts: Path,
    fleet: Any,
    env: dict[str, str],
    n: int,
    n_done: int,
    shard: int,
) -> None:
    t0 = time.perf_counter()
    engine = create_run(url, prompts, fleet.urls[0], env)
    shards = build_run(url, n_done, shard, first=1 if engine else 0) + (1 if engine else 0)
    build_s = time.perf_counter() - t0
    report(where, measure(url, prompts, fleet.urls[0], env), n, n_done, shards, build_s)
    if engine:
        report_engine(where, measure_engine(url, prompts, fleet, env))


def _measure_s3(prompts: Path, fleet: Any, n: int, n_done: int, shard: int) -> None:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_EC2_METADATA_DISABLED="true",
    )
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        boto3.client("s3").create_bucket(Bucket="bench")
        _bench("s3/moto", "s3://bench/run", prompts, fleet, env, n, n_done, shard)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


if __name__ == "__main__":
    main()
