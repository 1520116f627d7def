"""Benchmark: how much of a heterogeneous, flaky fleet's capacity the generation engine uses.

Eight simulated SGLang servers (``draftdata fleet sim`` in a child process), 64 sequences each;
server 0 decodes at half speed and server 1 crashes at about 40% of the run and comes back after
5% of it. Outputs are long-tailed (the simulator's lognormal, sigma 0.8, capped by max tokens at
3x the mean: the job's shape scaled down in tokens so that the simulator stays cheap); time is
scaled so that the ideal fleet finishes in ``seconds``.

Efficiency = completed output tokens per second / the fleet's ideal, where the ideal is the sum
over servers of the saturated decode rate (64 tokens per ``step_s(64)``, halved for the slow
server) times the time that server was up (its /health polled every 20 ms), both measured from
the start through the last completion. The clients' modules are imported before the start: a
Python import is a fixed ~0.3 s that the time-scaled job (a multi-day run compressed into
minutes) would otherwise count a thousand-fold; the engine's own start-up (probes, the prompt
scan, opening the run) is counted. Tokens of requests lost in the crash count for nothing.
The same fleet (restarted fresh) then serves a baseline client: one global semaphore of 8 x 64
over round-robin endpoints, retrying a failed request on the next endpoint -- the script
draftdata replaces. Target: >= 0.97 of ideal at 40K; the baseline's figure is printed beside.

A short job cannot reach 0.95 whatever the client does: its last long answers decode at small
batch while the rest of the fleet idles (the real job has ~380 requests per slot; at 12K prompts,
~23 per slot, a perfect greedy dispatcher reaches 0.868, at the default 40K, ~78 per slot, 0.956).
So the script also prints ``greedy_bound``: what a zero-overhead greedy dispatcher (every freed
slot refilled at once, no hedging) reaches on the same job shape in a discrete-event model, and
our figure as a share of it. It is a reference, not a strict ceiling: placing long answers by
expected finish time and hedging the slow server's last requests onto idle ones beat it.

``--short`` is the job users run most (pilots, per-domain top-ups, reruns): 3,000 prompts on
8 x 32 slots (target >= 1.0 of the greedy bound). ``--mixed`` gives the prompts domains whose
mean lengths differ like math 6,000 / code 3,000 / general 1,500 / agent 800 / tool 300 tokens
(scaled, shuffled in the file; the simulator draws around each prompt's domain mean) and also
prints the greedy bound when the longest-expected domain goes first (target: >= 1.10 of the
file-order greedy bound). ``--order file`` runs draftdata with its length ordering off.

    python benchmarks/bench_generate_efficiency.py           # 40K prompts, 2 runs of ~1.5-3 min
    python benchmarks/bench_generate_efficiency.py --short --clients draftdata   # ~30 s
    python benchmarks/bench_generate_efficiency.py --short --mixed --clients draftdata
    python benchmarks/bench_generate_efficiency.py --short --mixed --bound-only  # the bounds
    python benchmarks/bench_generate_efficiency.py --quick   # 1.2K prompts (a smoke run)

The run is sensitive to CPU starvation (the simulator, the engine and the baseline share the
machine's cores; ~130 requests/s): the load average, the simulator's CPU share and the servers'
mean running/waiting sequences mid-run are printed. Running below 64 with nothing waiting means
the client left slots idle; running below 64 with requests waiting means the simulator itself
is starved of CPU (its scheduler admits late) and the figure measures the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from draftdata.errors import FatalRequestError, ServerError
from draftdata.generate.config import GenerateConfig, Sampling
from draftdata.generate.engine.client import EndpointClient
from draftdata.generate.engine.request import Request
from draftdata.generate.stage import generate
from draftdata.records import Message, Prompt
from draftdata.shared.endpoints import parse_loads
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimProcess
from draftdata.store.read import iter_completions, iter_failures

SERVERS = 8
SLOW = 0  # server index at half speed
RESTART = 1  # server index that crashes and restarts
TARGET = 0.97  # of ideal, on the 40K job
TARGET_GREEDY = 1.0  # of the greedy bound, uniform job
TARGET_MIXED = 1.10  # of the file-order greedy bound, mixed-domain job
WORDS = ["alpha", "beta", "gamma", "delta", "sort", "graph", "tree", "prime", "sum"]
# mixed-domain jobs: each domain's mean output tokens on the real job (uniform jobs: 2,700),
# scaled with the shape's mean; prompts start with their domain's name (the simulator's
# --mean-output-tokens-for draws around that mean) and come in shuffled order
DOMAINS = {"math": 6000, "code": 3000, "general": 1500, "agent": 800, "tool": 300}
REAL_MEAN = 2700


class Shape(msgspec.Struct, kw_only=True, frozen=True):
    """One benchmark size."""

    prompts: int
    mean_tokens: int
    max_tokens: int
    seconds: float  # the ideal run time the time scale is chosen for
    slots: int = 64  # sequences per server
    mixed: bool = False  # domains of different lengths (DOMAINS), shuffled
    down: float = 0.05  # share of the ideal run the restarting server is down
    crash_at: float | None = None  # crash at this share of the ideal run (None: 40% of requests)

    def domain_means(self) -> dict[str, int]:
        """Each domain's mean output tokens at this shape's scale."""
        return {d: max(8, round(self.mean_tokens * m / REAL_MEAN)) for d, m in DOMAINS.items()}


FULL = Shape(prompts=40_000, mean_tokens=192, max_tokens=580, seconds=90.0)
QUICK = Shape(prompts=1_200, mean_tokens=128, max_tokens=400, seconds=7.0)
# the short jobs users run most (pilots, top-ups): 3,000 prompts on 8 x 32 slots
SHORT = Shape(prompts=3_000, mean_tokens=192, max_tokens=580, seconds=20.0, slots=32)


def domains_for(n: int, seed: int) -> list[str]:
    """The domain of each prompt of a mixed job, in file order (shuffled, equal shares)."""
    names = list(DOMAINS)
    out = [names[i % len(names)] for i in range(n)]
    random.Random(seed).shuffle(out)
    return out


def draw_lengths(shape: Shape, domains: list[str] | None, seed: int) -> list[int]:
    """Output lengths like the simulator's (lognormal, its sigma and minimum, capped at max
    tokens), around each prompt's domain mean when ``domains`` is given."""
    import math

    cfg = SimConfig(max_running=shape.slots)
    rng = random.Random(seed)
    means = shape.domain_means()
    out = []
    for i in range(shape.prompts):
        mean = means[domains[i]] if domains is not None else shape.mean_tokens
        mu = math.log(mean) - cfg.output_sigma**2 / 2
        drawn = round(rng.lognormvariate(mu, cfg.output_sigma))
        out.append(min(shape.max_tokens, max(cfg.min_output_tokens, drawn)))
    return out


def saturated_rate(cfg: SimConfig, slow: float) -> float:
    """Output tokens/s of one server decoding a full batch (prefill stalls not counted)."""
    return cfg.max_running / cfg.step_s(cfg.max_running, slow)


def greedy_bound(shape: Shape, seed: int = 0, *, longest_first: bool = False) -> float:
    """The efficiency a zero-overhead greedy dispatcher (no hedging) reaches on this job shape.

    A discrete-event model of the same fleet: output lengths drawn like the simulator's
    (``draw_lengths``; mixed jobs: around each prompt's domain mean, domains in the job's
    file order), every freed slot refilled at once from one queue, server ``RESTART`` down for
    ``shape.down`` of the run from 40% on (its in-flight work lost and requeued). The queue is
    in file order, or with ``longest_first`` sorted by the domain's mean (the longest-expected
    domain first; what a dispatcher that knew each domain's mean in advance would do). What it
    loses is the job's own tail -- the last long answers decode at small batch while the rest
    of the fleet idles -- which only a longer job amortises. ``greedy_on`` runs the same model
    on given lengths (a job's actual ones).
    """
    domains = domains_for(shape.prompts, seed=1) if shape.mixed else None
    lengths = draw_lengths(shape, domains, seed)
    return greedy_on(shape, lengths, domains, longest_first=longest_first)


def greedy_on(
    shape: Shape, lengths: list[int], domains: list[str] | None, *, longest_first: bool = False
) -> float:
    """``greedy_bound``'s model on ``lengths`` (file order; ``domains`` of each, for
    ``longest_first``)."""
    import heapq
    import math

    cfg = SimConfig(max_running=shape.slots)
    capacity = shape.slots
    if longest_first and domains is not None:
        means = shape.domain_means()
        order = sorted(range(len(lengths)), key=lambda i: -means[domains[i]])
        lengths = [lengths[i] for i in order]
    slow = [2.0 if i == SLOW else 1.0 for i in range(SERVERS)]

    def run(crash: tuple[float, float] | None) -> tuple[int, float, float]:
        """(tokens completed, time of the last completion, down time) of one model run."""
        queue = list(reversed(lengths))
        steps = [0.0] * SERVERS  # decode steps each server has taken
        heaps: list[list[tuple[float, int]]] = [[] for _ in range(SERVERS)]  # (end step, length)
        up = [True] * SERVERS
        t, tokens, last, back, down = 0.0, 0, 0.0, math.inf, 0.0

        def step_s(i: int) -> float:
            return cfg.step_s(len(heaps[i]), slow[i])

        def fill(i: int) -> None:
            while up[i] and queue and len(heaps[i]) < capacity:
                length = queue.pop()
                heapq.heappush(heaps[i], (steps[i] + length, length))

        for i in range(SERVERS):
            fill(i)
        while any(heaps) or (queue and back < math.inf):
            nxt = [((h[0][0] - steps[i]) * step_s(i), i) for i, h in enumerate(heaps) if h]
            dt, i = min(nxt) if nxt else (back - t, -1)
            event = "done"
            if crash is not None and t + dt >= crash[0]:
                dt, event = crash[0] - t, "crash"
            elif back < math.inf and t + dt >= back:
                dt, event = back - t, "back"
            for j in range(SERVERS):
                if heaps[j]:
                    steps[j] += dt / step_s(j)
            t += dt
            if event == "crash" and crash is not None:
                queue.extend(length for _, length in heaps[RESTART])
                heaps[RESTART], up[RESTART] = [], False
                back, down, crash = t + crash[1], crash[1], None
            elif event == "back":
                up[RESTART], back = True, math.inf
                fill(RESTART)
            else:
                tokens += heapq.heappop(heaps[i])[1]
                last = t
                fill(i)
        return tokens, last, down

    rates = [saturated_rate(cfg, f) for f in slow]
    if shape.crash_at is None:
        _, span, _ = run(None)  # sizes the run, so that the crash lands at 40% of it
        tokens, last, down = run((0.4 * span, shape.down * span))
    else:  # at a share of the ideal run, down a share of it (the time-scaled job's seconds)
        span = sum(lengths) / sum(rates)
        tokens, last, down = run((shape.crash_at * span, shape.down * span))
    ideal = sum(rates) * last - rates[RESTART] * min(down, last)
    return tokens / ideal


def time_scale_for(shape: Shape) -> float:
    """The time scale at which the ideal fleet finishes ``shape`` in ``shape.seconds``."""
    base = SimConfig(max_running=shape.slots)
    rate = sum(saturated_rate(base, 2.0 if i == SLOW else 1.0) for i in range(SERVERS))
    mean = shape.mean_tokens
    if shape.mixed:
        mean = round(sum(shape.domain_means().values()) / len(DOMAINS))
    tokens = shape.prompts * mean
    return shape.seconds * rate / tokens


def write_prompts(path: Path, shape: Shape, seed: int) -> list[Prompt]:
    """``shape.prompts`` short single-turn prompts (prepare's JSONL format); in a mixed job
    each starts with its domain's name and carries the domain."""
    rng = random.Random(seed)
    domains = domains_for(shape.prompts, seed=1) if shape.mixed else None
    prompts = []
    with path.open("wb") as fh:
        for i in range(shape.prompts):
            text = f"Question {i}: explain " + " ".join(rng.choices(WORDS, k=rng.randint(5, 25)))
            domain = domains[i] if domains is not None else ""
            if domain:
                text = f"{domain} {text}"
            p = Prompt(id=f"p{i:06d}", domain=domain, messages=[Message(role="user", content=text)])
            prompts.append(p)
            fh.write(msgspec.json.encode(p) + b"\n")
    return prompts


class UpTime:
    """Polls one server's /health every 20 ms; ``up_between(a, b)`` is its up time in [a, b]."""

    def __init__(self, url: str) -> None:
        self.url = url + "/health"
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=2.0) as resp:
                    ok = resp.status == 200
            except urllib.error.HTTPError as exc:
                ok = exc.code != 503  # 503: restarting
            except urllib.error.URLError as exc:
                ok = not isinstance(exc.reason, ConnectionRefusedError)
            except OSError as exc:
                # a slow answer on a starved machine is not a server that is down
                ok = not isinstance(exc, ConnectionError)
            self.samples.append((t, ok))
            self._stop.wait(0.02)

    def __enter__(self) -> UpTime:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def up_between(self, a: float, b: float) -> float:
        total = 0.0
        for (t0, ok), (t1, _) in itertools.pairwise([*self.samples, (b, True)]):
            lo, hi = max(a, t0), min(b, t1)
            if ok and hi > lo:
                total += hi - lo
        return total

    def down_intervals(self, end: float) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        start = None
        for t, ok in [*self.samples, (end, True)]:
            if not ok and start is None:
                start = t
            elif ok and start is not None:
                out.append((start, t))
                start = None
        return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sim_args(shape: Shape, scale: float, crash_n: int) -> list[str]:
    means = []
    if shape.mixed:
        for domain, mean in shape.domain_means().items():
            means += ["--mean-output-tokens-for", f"{domain}:{mean}"]
    return [
        *means,
        "--max-running",
        str(shape.slots),
        "--mean-output-tokens",
        str(shape.mean_tokens),
        "--context-length",
        "4096",
        "--time-scale",
        f"{scale:.6f}",
        "--slow",
        f"{SLOW}:2",
        "--crash-after",
        f"{RESTART}:{crash_n}",
        "--restart-after",
        f"{shape.down * shape.seconds:.3f}",  # down ~5% of the run (+ its starting period)
        "--starting-seconds",
        f"{0.01 * shape.seconds:.3f}",
        "--seed",
        "7",
    ]


class Result(msgspec.Struct, kw_only=True):
    """What one client achieved."""

    name: str
    tokens: int
    completed: int
    failed: int
    start: float
    last: float
    ideal_tokens: float
    down: list[tuple[float, float]]
    sim_cpu: float  # the simulator's CPU seconds per wall second (1.0: one core saturated)
    mid_run: tuple[float, float]  # mean (running, waiting) per server mid-run

    @property
    def efficiency(self) -> float:
        return self.tokens / self.ideal_tokens if self.ideal_tokens else 0.0


class Loads:
    """Polls every server's /v1/loads twice a second: (time, server, running, waiting)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = [u + "/v1/loads" for u in urls]
        self.samples: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for i, url in enumerate(self.urls):
                try:
                    with urllib.request.urlopen(url, timeout=2.0) as resp:
                        load = parse_loads(msgspec.json.decode(resp.read()))
                except (OSError, ValueError):
                    continue
                if load is not None:
                    self.samples.append((time.time(), i, load.running, load.waiting))

    def __enter__(self) -> Loads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def mid_run(self, start: float, last: float) -> tuple[float, float]:
        """Mean running and waiting sequences per server (the restarting one left out) between
        10% and 60% of the run, when there is always work queued."""
        a, b = start + 0.1 * (last - start), start + 0.6 * (last - start)
        got = [(r, w) for t, i, r, w in self.samples if a <= t <= b and i != RESTART]
        if not got:
            return 0.0, 0.0
        return sum(r for r, _ in got) / len(got), sum(w for _, w in got) / len(got)


def measure(
    name: str,
    shape: Shape,
    scale: float,
    prompts_path: Path,
    prompts: list[Prompt],
    run: Callable[[list[str], Path, list[Prompt]], tuple[int, int, float, int]],
    *,
    before: Callable[[list[str]], None] | None = None,
    before_requests: int = 0,
) -> Result:
    """Start a fresh fleet, run ``run(urls, prompts_path, prompts)`` -> (tokens, completed,
    last completion time, failed), and compute its efficiency. ``before(urls)`` runs on the
    fleet first, off the clock (a pilot of about ``before_requests`` requests: the crash
    still lands at ~40% of the measured run)."""
    crash_n = max(10, int((shape.prompts * 0.4 + before_requests) / (SERVERS - 0.5)))
    if shape.crash_at is not None:  # at a time: SIGUSR1 (a crash at the request count never)
        crash_n = 1 << 40
    base = SimConfig(max_running=shape.slots, time_scale=scale)
    with SimProcess(n=SERVERS, args=sim_args(shape, scale, crash_n)) as fleet:
        if before is not None:
            before(fleet.urls)
        with UpTime(fleet.urls[RESTART]) as watch, Loads(fleet.urls) as loads:
            cpu0 = cpu_seconds(fleet.pid)
            start = time.time()
            timer = None
            if shape.crash_at is not None:
                timer = threading.Timer(
                    shape.crash_at * shape.seconds, os.kill, (fleet.pid, signal.SIGUSR1)
                )
                timer.start()
            try:
                tokens, completed, last, failed = run(fleet.urls, prompts_path, prompts)
            finally:
                if timer is not None:
                    timer.cancel()
            sim_cpu = (cpu_seconds(fleet.pid) - cpu0) / max(1e-6, time.time() - start)
            time.sleep(0.05)
        ideal = 0.0
        for i in range(SERVERS):
            rate = saturated_rate(base, 2.0 if i == SLOW else 1.0)
            up = watch.up_between(start, last) if i == RESTART else last - start
            ideal += rate * up
    return Result(
        name=name,
        tokens=tokens,
        completed=completed,
        failed=failed,
        start=start,
        last=last,
        ideal_tokens=ideal,
        down=[(a - start, b - start) for a, b in watch.down_intervals(last)],
        sim_cpu=sim_cpu,
        mid_run=loads.mid_run(start, last),
    )


# -- the two clients ---------------------------------------------------------------------------


def engine_settings(shape: Shape, scale: float) -> dict[str, Any]:
    """GenerateConfig values for the time-scaled run (intervals shrunk with the clock)."""
    return {
        "max_tokens": shape.max_tokens,
        "reasoning": "on",
        "concurrency": "auto",
        "progress": "off",
        "probe_interval": 0.25,
        "load_interval": 1.0,
        "backoff_base": 0.1,
        "backoff_max": 2.0,
        "connect_timeout": 2.0,
        "hedge_min_age": 1.0,
        "flush_seconds": 2.0,
        "max_attempts": 20,
    }


def run_engine(
    shape: Shape, scale: float, workdir: Path, **settings: Any
) -> Callable[..., tuple[int, int, float, int]]:
    """Our engine over the fleet, writing a local run; results read back from the store."""

    def run(
        urls: list[str], prompts_path: Path, prompts: list[Prompt]
    ) -> tuple[int, int, float, int]:
        out = workdir / f"run-{time.time_ns()}"
        cfg = msgspec.convert(
            {
                "prompts": str(prompts_path),
                "endpoints": urls,
                "out": str(out),
                **engine_settings(shape, scale),
                **settings,
            },
            GenerateConfig,
        )
        changes = 0

        def log(line: str) -> None:  # keep the output readable: breaker events only
            nonlocal changes
            if "concurrency" in line and "->" in line:
                changes += 1
            elif "taken out" in line or "is back" in line:
                print(f"  engine: {line}")

        summary = generate(cfg, log=log, handle_signals=False)
        print(
            f"  engine: {summary.requests} requests, {summary.retries} retries, "
            f"{summary.hedges} hedges sent ({summary.hedges_won} won, "
            f"{getattr(summary, 'hedges_wasted', '?')} "
            f"wasted), {changes} concurrency changes"
        )
        tokens = completed = 0
        last = 0.0
        for c in iter_completions(str(out)):
            tokens += c.usage.completion_tokens
            completed += 1
            last = max(last, c.created)
        failed = sum(1 for _ in iter_failures(str(out)))
        return tokens, completed, last, failed

    return run


def run_baseline(shape: Shape, scale: float) -> Callable[..., tuple[int, int, float, int]]:
    """One global semaphore over round-robin endpoints; a failed request moves to the next."""

    def run(
        urls: list[str], prompts_path: Path, prompts: list[Prompt]
    ) -> tuple[int, int, float, int]:
        return asyncio.run(_baseline(urls, prompts, shape))

    return run


async def _baseline(
    urls: list[str], prompts: list[Prompt], shape: Shape
) -> tuple[int, int, float, int]:
    width = SERVERS * shape.slots
    clients = [EndpointClient(u, pool_size=width, connect_timeout=2.0) for u in urls]
    sem = asyncio.Semaphore(width)
    rr = itertools.cycle(range(len(clients)))
    totals = {"tokens": 0, "completed": 0, "failed": 0, "last": 0.0}
    sampling = Sampling()

    async def one(p: Prompt) -> None:
        body = Request(
            messages=p.messages,
            model="Qwen3.6-27B-sim",
            max_tokens=shape.max_tokens,
            sampling=sampling,
            reasoning="on",
            token_ids=True,
        )
        async with sem:
            for attempt in range(20):
                client = clients[next(rr)]
                try:
                    turns = await client.chat(body)
                except ServerError as exc:
                    if isinstance(exc, FatalRequestError):
                        break
                    await asyncio.sleep(min(2.0, 0.1 * 2**attempt) * random.random())
                    continue
                totals["tokens"] += sum(t.usage.completion_tokens for t in turns)
                totals["completed"] += 1
                totals["last"] = time.time()
                return
            totals["failed"] += 1

    try:
        await asyncio.gather(*(one(p) for p in prompts))
    finally:
        for c in clients:
            await c.close()
    return (
        int(totals["tokens"]),
        int(totals["completed"]),
        float(totals["last"]),
        int(totals["failed"]),
    )


def report(r: Result, slots: int) -> str:
    wall = r.last - r.start
    down = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in r.down) or "none seen"
    return (
        f"{r.name:<9} {r.efficiency:6.3f} of ideal  ({r.tokens / wall:,.0f} tok/s completed, "
        f"ideal {r.ideal_tokens / wall:,.0f}; {r.completed} done, {r.failed} failed, "
        f"{wall:.1f} s to the last completion; server {RESTART} down {down}; simulator "
        f"CPU {r.sim_cpu:.0%}; mid-run each server running {r.mid_run[0]:.1f}/{slots} with "
        f"{r.mid_run[1]:.1f} waiting)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small run (< 30 s in all)")
    ap.add_argument(
        "--short", action="store_true", help="the short job: 3,000 prompts on 8 x 32 slots"
    )
    ap.add_argument(
        "--mixed", action="store_true", help="domains of different lengths, shuffled (DOMAINS)"
    )
    ap.add_argument("--prompts", type=int, default=None, help="override the number of prompts")
    ap.add_argument("--slots", type=int, default=None, help="override sequences per server")
    ap.add_argument("--seconds", type=float, default=None, help="override the ideal run time")
    ap.add_argument("--order", default="length", help="draftdata's --order (length or file)")
    ap.add_argument(
        "--clients", default="draftdata,baseline", help="which clients to run (comma-separated)"
    )
    ap.add_argument("--bound-only", action="store_true", help="print the greedy bounds and leave")
    args = ap.parse_args()
    shape = QUICK if args.quick else SHORT if args.short else FULL
    changes: dict[str, Any] = {"mixed": args.mixed}
    if args.prompts:
        changes["prompts"] = args.prompts
    if args.slots:
        changes["slots"] = args.slots
    if args.seconds:
        changes["seconds"] = args.seconds
    shape = msgspec.structs.replace(shape, **changes)
    bound = greedy_bound(shape)
    bound_lef = greedy_bound(shape, longest_first=True) if shape.mixed else None
    what = (
        "mixed-domain (" + ", ".join(f"{d} {m}" for d, m in shape.domain_means().items()) + ")"
        if shape.mixed
        else f"mean {shape.mean_tokens}"
    )
    bounds = f"greedy bound (zero-overhead greedy, file order) {bound:.3f}"
    if bound_lef is not None:
        bounds += f"; longest-expected-domain-first greedy {bound_lef:.3f}"
    if args.bound_only:
        print(f"{shape.prompts} prompts, {SERVERS} x {shape.slots} slots, {what}: {bounds}")
        return
    scale = time_scale_for(shape)
    base = SimConfig(max_running=shape.slots, time_scale=scale)
    load0 = os.getloadavg()[0]
    print(
        f"fleet: {SERVERS} sim servers x {shape.slots} seqs, server {SLOW} at half speed, server "
        f"{RESTART} crashes and restarts; {shape.prompts} prompts, lognormal outputs {what} "
        f"cap {shape.max_tokens}; time scale {scale:.4f} "
        f"(one server saturated: {saturated_rate(base, 1.0):,.0f} tok/s)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-gen-") as tmp:
        work = Path(tmp)
        prompts_path = work / "prompts.jsonl"
        prompts = write_prompts(prompts_path, shape, seed=1)
        runners = {
            # (the default order is left out: the script also runs against older draftdata)
            "draftdata": run_engine(
                shape, scale, work, **({"order": args.order} if args.order != "length" else {})
            ),
            "baseline": run_baseline(shape, scale),
        }
        results: dict[str, Result] = {}
        for name in args.clients.split(","):
            results[name] = measure(name, shape, scale, prompts_path, prompts, runners[name])
            print(report(results[name], shape.slots))
    load1 = os.getloadavg()[0]
    print(bounds)
    parts = []
    if "draftdata" in results:
        eff = results["draftdata"].efficiency
        ratio = eff / bound
        line = f"draftdata {eff:.3f} of ideal = {ratio:.3f} of the greedy bound"
        if shape.mixed:
            line += f" (target >= {TARGET_MIXED:.2f}"
            line += f"; {'PASS' if ratio >= TARGET_MIXED else 'BELOW TARGET'})"
            if bound_lef is not None:
                line += f", {eff / bound_lef:.3f} of the longest-first greedy"
        elif shape.prompts >= FULL.prompts:
            line += f" (target >= {TARGET:.2f} of ideal; "
            line += f"{'PASS' if eff >= TARGET else 'BELOW TARGET'})"
        else:
            line += f" (target >= {TARGET_GREEDY:.2f}"
            line += f"; {'PASS' if ratio >= TARGET_GREEDY else 'BELOW TARGET'})"
        parts.append(line)
    if "baseline" in results:
        b = results["baseline"].efficiency
        parts.append(f"baseline (global semaphore, round-robin) {b:.3f} = {b / bound:.3f} of it")
    print("efficiency: " + "; ".join(parts))
    print(f"load average at start / end: {load0:.2f} / {load1:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
