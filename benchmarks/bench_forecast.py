"""Benchmark: a 1% pilot's forecast of a whole generate run against the run itself.

A simulated fleet (``draftdata fleet sim`` in a child process) of eight SGLang servers, 64
sequences each, server 0 decoding at half speed (the slow server). Answer lengths depend on the
domain: the simulator classifies each request's conversation with the classifier prepare tags
prompts with and draws a lognormal length (sigma 0.8) around that domain's mean (``--domain-mean``;
math 240, code 120, general 80, agent 48 per turn over two turns, tool 24 tokens: 10x apart, the
real job's shape scaled down so that the simulator stays cheap), cut at ``--max-tokens`` 720.
The prompts are the seed job's size (150,000 by default) from five sources whose domain mixes
differ, shuffled, each tagged with its domain by that classifier (as ``prepare`` does).

1. ``generate --pilot 0.01`` (``run_pilot``): a stratified 1% sample (1,500 prompts) into the run,
   then the forecast of the rest: output tokens, wall seconds, GPU-hours, the token mix.
2. The same command without ``--pilot``: the rest of the run, timed.

It prints the forecast (with its 90% interval) against what the rest of the run did: output
tokens and wall time (target: both within 10%), the per-endpoint saturated rates against what
each endpoint did over the rest, the per-domain mean lengths and the token mix, and the pilot's
own cost. Time is scaled (``--time-scale``) so that the ideal fleet would finish the job in
``--seconds``. The default (the job at ~150 requests/s, ~17 min ideal for 150K prompts) keeps the
simulator and the engine well below what the 2-core box serves (~400 requests/s with servers
that answer at once): the run must measure the modelled fleet, not the machine. A box loaded by
other work makes the rest of the run slower than the modelled fleet (its engine and simulator
answer late), which no pilot taken at another moment can foresee, so the load average before and
after is printed. 150K requests cannot pass through HTTP on two shared cores in a few minutes;
``--prompts`` runs a smaller job (with a 1% pilot the fleet's 512 slots need about 100K prompts
to keep every server full for a request life).

    python benchmarks/bench_forecast.py                       # 150K prompts, ~20 min
    python benchmarks/bench_forecast.py --prompts 40000 --pilot 1500     # ~5 min
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from draftdata.generate.config import GenerateConfig
from draftdata.generate.plan.pilot import run_pilot
from draftdata.generate.plan.pilot_sample import parse_pilot
from draftdata.generate.stage import generate
from draftdata.records import Message, Prompt
from draftdata.shared.domains import classify_domain
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimProcess
from draftdata.stats.runfigures import run_figures
from draftdata.store.opener import open_store

SERVERS = 8
SLOTS = 64
SLOW = 0  # server index at half speed
SIGMA = 0.8
MAX_TOKENS = 720
# mean output tokens per request, by domain (agent prompts take two requests)
MEANS = {"math": 240, "code": 120, "general": 80, "agent": 48, "tool": 24}
TURNS = {"agent": 2}
# source -> domain weights (the job's mix: code heavy, some of everything)
SOURCES = {
    "infinity_instruct": {"general": 0.45, "code": 0.35, "math": 0.2},
    "codefeedback": {"code": 0.85, "general": 0.15},
    "metamath": {"math": 1.0},
    "hermes_fc": {"tool": 1.0},
    "agentinstruct": {"agent": 1.0},
}
SOURCE_SHARE = {
    "infinity_instruct": 0.35,
    "codefeedback": 0.3,
    "metamath": 0.15,
    "hermes_fc": 0.12,
    "agentinstruct": 0.08,
}
WORDS = ["tree", "graph", "prime", "sum", "order", "list", "value", "cost", "path", "node"]
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
TARGET = 0.10


def _messages(domain: str, rng: random.Random, i: int) -> list[Message]:
    w = " ".join(rng.choices(WORDS, k=rng.randint(4, 14)))
    if domain == "math":
        a, b = rng.randint(2, 40), rng.randint(1, 99)
        text = f"Solve for x: {a}x + {b} = {a * 3 + b}. What is the probability of {w}? ({i})"
    elif domain == "code":
        text = f"Write a python function that sorts the {w} and explain the algorithm ({i})."
    elif domain == "tool":
        text = f"What is the weather where the {w} is? ({i})"
    elif domain == "agent":
        return [
            Message(
                role="user",
                content=f"You are an agent in a web shop. Take exactly one of the available "
                f"actions. Find {w} ({i}).",
            ),
            Message(role="assistant", content="Thought: I search first. Action: search[item]"),
            Message(role="user", content="Observation: 10 results. Available actions: click."),
        ]
    else:
        text = f"Tell me about the {w} in a few sentences ({i})."
    return [Message(role="user", content=text)]


def write_prompts(path: Path, n: int, seed: int = 0) -> dict[str, int]:
    """``n`` prompts from the five sources, shuffled; returns the count per domain."""
    rng = random.Random(seed)
    rows: list[Prompt] = []
    counts: dict[str, int] = {}
    for i in range(n):
        source = rng.choices(list(SOURCE_SHARE), weights=list(SOURCE_SHARE.values()))[0]
        mix = SOURCES[source]
        domain = rng.choices(list(mix), weights=list(mix.values()))[0]
        messages = _messages(domain, rng, i)
        tools = TOOLS if domain == "tool" else None
        tagged = classify_domain(messages, tools)  # as prepare's domain: auto tags it
        counts[tagged] = counts.get(tagged, 0) + 1
        rows.append(
            Prompt(id=f"{source}/{i:07d}", source=source, domain=tagged, messages=messages,
                   tools=tools)
        )  # fmt: skip
    rng.shuffle(rows)
    with path.open("wb") as fh:
        for p in rows:
            fh.write(msgspec.json.encode(p) + b"\n")
    return counts


def lognormal_mean(mean: float) -> float:
    """The mean of the simulator's length draw capped at MAX_TOKENS (numerically)."""
    mu = math.log(mean) - SIGMA * SIGMA / 2
    rng = random.Random(1)
    draws = [min(MAX_TOKENS, round(rng.lognormvariate(mu, SIGMA))) for _ in range(20000)]
    return sum(draws) / len(draws)


def time_scale(counts: dict[str, int], seconds: float) -> float:
    """The scale at which the ideal fleet (every slot busy) finishes the job in ``seconds``."""
    base = SimConfig(max_running=SLOTS)
    rate = sum(SLOTS / base.step_s(SLOTS, 2.0 if i == SLOW else 1.0) for i in range(SERVERS))
    tokens = sum(c * lognormal_mean(MEANS[d]) * TURNS.get(d, 1) for d, c in counts.items())
    return seconds * rate / tokens


def settings() -> dict[str, Any]:
    """GenerateConfig values for the time-scaled run (intervals shrunk with the clock)."""
    return {
        "max_tokens": MAX_TOKENS,
        "reasoning": "on",
        "progress": "off",
        "probe_interval": 0.25,
        "load_interval": 1.0,
        "backoff_base": 0.1,
        "backoff_max": 2.0,
        "connect_timeout": 5.0,
        "hedge_min_age": 1.0,
        "flush_seconds": 2.0,
        "flush_records": 1024,
        "max_attempts": 20,
    }


def _ratio(forecast: float | None, actual: float) -> str:
    if forecast is None or not actual:
        return "-"
    r = forecast / actual
    return f"{r:.3f} ({'within' if abs(r - 1) <= TARGET else 'OUTSIDE'} {TARGET:.0%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=150_000, help="the job's prompts")
    ap.add_argument("--pilot", default="0.01", help="--pilot F or N (default 0.01)")
    ap.add_argument(
        "--seconds", type=float, default=None, help="ideal fleet time (default: prompts/150)"
    )
    ap.add_argument("--seed", type=int, default=0, help="the prompts' and the simulator's seed")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else args.prompts / 150
    spec = parse_pilot(args.pilot)
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        work = Path(tmp)
        prompts = work / "prompts.jsonl"
        counts = write_prompts(prompts, args.prompts, args.seed)
        scale = time_scale(counts, seconds)
        sim_args = [
            "--max-running", str(SLOTS), "--time-scale", f"{scale:.6f}", "--seed", str(args.seed),
            "--output-sigma", str(SIGMA), "--slow", f"{SLOW}:2", "--context-length", "8192",
            *(a for d, m in MEANS.items() for a in ("--domain-mean", f"{d}:{m}")),
        ]  # fmt: skip
        print(
            f"job: {args.prompts:,} prompts "
            + ", ".join(f"{d} {c:,}" for d, c in sorted(counts.items()))
            + f"; fleet: {SERVERS} x {SLOTS} slots, server {SLOW} at half speed; time scale "
            f"{scale:.4f} (ideal {seconds:.0f} s)"
        )
        run = work / "run"
        with SimProcess(n=SERVERS, args=sim_args, timeout=120) as fleet:
            cfg = msgspec.convert(
                {"prompts": str(prompts), "fleet": str(fleet.fleet_yaml), "out": str(run),
                 **settings()},
                GenerateConfig,
            )  # fmt: skip
            _warm_up()
            load0 = os.getloadavg()[0]
            t0 = time.monotonic()
            pilot = run_pilot(cfg, spec, log=lambda line: None, handle_signals=False)
            pilot_s = time.monotonic() - t0
            fc = pilot.forecast
            assert fc is not None
            for line in pilot.lines():
                print("  " + line)
            before = run_figures(open_store(str(run)))
            t1 = time.monotonic()
            summary = generate(cfg, log=lambda line: None, handle_signals=False)
            wall = time.monotonic() - t1
            load1 = os.getloadavg()[0]
        after = run_figures(open_store(str(run)))
    tokens = after.output_tokens - before.output_tokens
    print(f"pilot: {len(pilot.sample.ids):,} prompts in {pilot_s:.1f} s (draw included)")
    print(
        f"rest of the run: {summary.completed:,} completions, {tokens:,} output tokens in "
        f"{wall:.1f} s; load average {load0:.1f} before, {load1:.1f} after"
    )
    iv = fc.output_tokens_90 or [None, None]
    print(
        f"output tokens: forecast {fc.output_tokens:,} (90% {iv[0]}-{iv[1]}) actual "
        f"{tokens:,}: ratio {_ratio(fc.output_tokens, tokens)}"
    )
    wv = fc.wall_s_90 or [None, None]
    print(
        f"wall seconds: forecast {fc.wall_s} (90% {wv[0]}-{wv[1]}) actual {wall:.1f}: "
        f"ratio {_ratio(fc.wall_s, wall)}"
    )
    print(
        f"gpu-hours (x{fc.gpus} GPUs): forecast {fc.gpu_hours} actual {fc.gpus * wall / 3600:.3f}"
    )
    by_url = {e.url: e.output_tokens for e in after.endpoints}
    was = {e.url: e.output_tokens for e in before.endpoints}
    for e in fc.throughput.endpoints if fc.throughput is not None else []:
        got = (by_url.get(e.url, 0) - was.get(e.url, 0)) / wall
        print(
            f"  endpoint {e.url}: saturated rate forecast {e.output_tokens_per_s} tok/s "
            f"(full {e.saturated_s} s, measured {e.measured}); the rest of the run "
            f"{got:,.0f} tok/s over its wall time"
        )
    rows = {}
    for name, d in fc.by_domain.items():
        actual = after.domains.get(name if name != "(none)" else "")
        mean = actual.output_tokens / actual.completions if actual and actual.completions else None
        share = actual.output_tokens / after.output_tokens if actual and after.output_tokens else 0
        rows[name] = {
            "forecast_mean": d.mean_output_tokens,
            "actual_mean": mean,
            "forecast_share": d.share,
            "actual_share": share,
        }
        print(
            f"  {name:<8} mean out: forecast {d.mean_output_tokens} actual "
            f"{mean if mean is None else round(mean, 1)}; token share: forecast "
            f"{d.share:.3f} actual {share:.3f}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "forecast": pilot.forecast_json(),
                    "actual_tokens": tokens,
                    "actual_wall_s": wall,
                    "domains": rows,
                },
                indent=1,
            ),
            encoding="utf-8",
        )


def _warm_up() -> None:
    """Import what the first command would otherwise pay once in this process (pyarrow's lazy
    imports, the parquet writer): the pilot and the rest are both measured warm, as two fresh
    commands each pay their own imports."""
    from draftdata.generate.stage import _warm_up as warm

    warm()


if __name__ == "__main__":
    main()
