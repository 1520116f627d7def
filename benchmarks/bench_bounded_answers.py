"""Benchmark: generate's peak memory when a server answers with huge bodies (issue 24).

A misbehaving OpenAI-compatible server (aiohttp, in this process, on 127.0.0.1) passes
``/health`` and ``/v1/models`` and answers every chat request with a valid completion whose
content is ``--mb`` MB; a simulated fleet (``draftdata fleet sim``, one server) answers
normally. ``draftdata generate`` runs in a child process with ``--concurrency 10`` over both
and reports its own peak RSS (``ru_maxrss``) when it exits. A second run over the simulator
alone is the baseline. Printed: both peaks, their ratio, and how many bytes the huge server
managed to send (the client stops reading at the bound tied to ``--max-tokens`` and hangs up).

    python benchmarks/bench_bounded_answers.py            # 50 MB answers, 200 prompts
    python benchmarks/bench_bounded_answers.py --mb 10    # smaller answers

Target: the peak with 50 MB answers within 1.5x of the baseline (it was 2.8 GB before answers
were bounded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from aiohttp import web

MODEL = "Qwen3.6-27B-sim"
RUNNER = (
    "import resource, sys\n"
    "from draftdata.cli import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "    print(f'PEAK_RSS_KB {peak}', file=sys.stderr)\n"
)


class HugeServer:
    """Answers every chat request with ``size`` bytes of content; counts bytes sent."""

    def __init__(self, size: int) -> None:
        body = {
            "id": "x",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x" * size},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        self.body = json.dumps(body).encode()
        self.sent = 0
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self.url = ""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(self.body)
        try:
            await resp.prepare(request)
            for i in range(0, len(self.body), 1 << 20):
                await resp.write(self.body[i : i + (1 << 20)])
                self.sent += min(1 << 20, len(self.body) - i)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", lambda r: asyncio.sleep(0, web.Response()))
        models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
        app.router.add_get("/v1/models", lambda r: asyncio.sleep(0, web.json_response(models)))
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)


def _prompts(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            row = {"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}
            f.write(json.dumps(row) + "\n")


def _generate(prompts: Path, out: Path, urls: list[str]) -> tuple[int, str]:
    cmd = [sys.executable, "-c", RUNNER, "generate", "-p", str(prompts), "-o", str(out)]
    for url in urls:
        cmd += ["-e", url]
    cmd += ["--progress", "off", "--concurrency", "10", "--max-tokens", "256"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    peak = next(
        (int(x.split()[1]) for x in res.stderr.splitlines() if x.startswith("PEAK_RSS_KB")), 0
    )
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
    return peak, res.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=50, help="size of each huge answer (MB)")
    ap.add_argument("--prompts", type=int, default=200)
    args = ap.parse_args()
    huge = HugeServer(args.mb << 20)
    huge.start()
    with tempfile.TemporaryDirectory(prefix="bench-bounded-") as tmp:
        root = Path(tmp)
        prompts = root / "p.jsonl"
        _prompts(prompts, args.prompts)
        sim = subprocess.Popen(
            [
                *(sys.executable, "-c", "from draftdata.cli import main; main()", "fleet", "sim"),
                *("-n", "1", "--out", str(root / "fleet.yaml"), "--time-scale", "0.01"),
                *("--mean-output-tokens", "60"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            import time

            for _ in range(300):
                if (root / "fleet.yaml").exists():
                    break
                time.sleep(0.1)
            from draftdata.shared.fleetspec import read_fleet

            sim_url = read_fleet(str(root / "fleet.yaml")).endpoints[0].url
            base, _ = _generate(prompts, root / "base", [sim_url])
            peak, said = _generate(prompts, root / "huge", [huge.url, sim_url])
        finally:
            sim.terminate()
            sim.wait()
    taken = [x for x in said.splitlines() if "impossible" in x]
    print(f"baseline (simulator only): peak RSS {base / 1024:.0f} MiB")
    print(
        f"with {args.mb} MB answers at concurrency 10: peak RSS {peak / 1024:.0f} MiB "
        f"({peak / max(1, base):.2f}x the baseline)"
    )
    print(
        f"huge server: {huge.requests} requests, {huge.sent / 2**20:.1f} MiB sent of "
        f"{huge.requests * len(huge.body) / 2**20:.0f} MiB asked to send"
    )
    print(taken[0] if taken else "the huge server was not taken out")


if __name__ == "__main__":
    main()
