"""Benchmark (issue 33): what scheduling by expected answer length buys on short jobs.

The short job users run most (``bench_generate_efficiency.py --short``): 3,000 prompts on 8
simulated servers x 32 sequences, server 0 at half speed, server 1 crashing at ~40% of the run
and down for 3 s (15% of the ideal 20 s), long-tailed outputs (lognormal, sigma 0.8, capped
at 3x the mean). The crash comes at a time, 8 s in (SIGUSR1 to the simulator), not at a request
count, so that it lands at the same moment whatever the order. Two jobs:

- **five domains** whose mean answers differ like math 6,000 / code 3,000 / general 1,500 /
  agent 800 / tool 300 tokens (scaled, shuffled in the file);
- **one domain**, mean 2,700 (scaled).

draftdata runs each job as users would, each on a fresh fleet: after a pilot (``generate
--pilot 150``, off the clock: the rest is measured, its lengths known from the pilot's
answers), learnt online (no pilot: the run learns each domain's lengths from its own answers),
and, on the five-domain job, with ``--order file`` (the same placement and hedging, prompts in
file order: the time the order saved). Efficiency is completed output tokens over the fleet's
ideal from the start of the command through its last completion
(``bench_generate_efficiency.measure``).

The reference is a zero-overhead greedy dispatcher in a discrete-event model of the same
fleet (``greedy_on``: every freed slot refilled at once, no start-up, no hedging, the crash's
work requeued at once), once in file order and once knowing each domain's mean and sending
the longest-expected domain first, run on the job's actual answer lengths (the simulator
draws each prompt's length from the prompt, so every run of a job answers the same lengths;
they are read back from each run's completions). A model bound from fresh draws moves by
+-0.05 from one draw to the next (a few capped answers, where the crash lands), so the
reference is the same job, not a job like it; the mean over five draws is printed beside.
``--jobs N`` runs N jobs of each shape (their prompts' texts drawn with other seeds: the
simulator answers other lengths) and prints the medians.
Targets: five domains >= 1.0 of the greedy that knows the means and >= 0.86 of ideal; one
domain >= 0.85 of ideal; learnt online within 0.02 of the pilot's figure.

The controls ``five-rest`` and ``one-rest`` (``--only``, not run by default) run the prompts a
pilot leaves -- the same job as the ``-pilot`` runs measure -- learnt online with nothing known:
a pilot's figure against them is what its knowledge buys, apart from its job being 5% shorter
than the ``-online`` runs' (a shorter job has relatively more tail).

    python benchmarks/bench_generate_order.py                  # all runs, ~4 min
    python benchmarks/bench_generate_order.py --jobs 3         # three jobs of each shape
    python benchmarks/bench_generate_order.py --repeat 2       # each run twice
    python benchmarks/bench_generate_order.py --only five-pilot,five-online
    python benchmarks/bench_generate_order.py --only one-pilot,one-rest --repeat 3

The simulator, the engine and this script share the machine's cores: the load average is
printed beside the figures; on a busy machine the simulator is starved and every figure drops.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench_generate_efficiency import (
    SHORT,
    Result,
    Shape,
    domains_for,
    engine_settings,
    greedy_bound,
    greedy_on,
    measure,
    report,
    time_scale_for,
    write_prompts,
)
from draftdata.cli import main as cli_main
from draftdata.generate.config import GenerateConfig
from draftdata.generate.plan.pilot_sample import draw, parse_pilot
from draftdata.generate.prompts.source import prompt_files
from draftdata.generate.stage import generate
from draftdata.records import Prompt
from draftdata.store.read import iter_completions, iter_failures

PILOT = 150  # prompts (5%): a few per slot, so that every domain is measured
DOWN = 0.15  # the restarting server is down 3 s of the ideal 20 s
TARGET_KNOWN = 1.0  # of the greedy that knows each domain's mean (five domains)
TARGET_FIVE = 0.86  # of ideal (five domains)
TARGET_ONE = 0.85  # of ideal (one domain)
TARGET_ONLINE = 0.02  # learnt online: at most this far below the pilot's figure
CRASH_AT = 0.4  # of the ideal 20 s: the restarting server crashes at 8 s (SIGUSR1)
FIVE = msgspec.structs.replace(SHORT, mixed=True, down=DOWN, crash_at=CRASH_AT)
ONE = msgspec.structs.replace(SHORT, mixed=False, down=DOWN, crash_at=CRASH_AT)
RUNS = {  # name -> (job, pilot, order)
    "five-pilot": (FIVE, True, "length"),
    "five-online": (FIVE, False, "length"),
    "five-file": (FIVE, False, "file"),
    "one-pilot": (ONE, True, "length"),
    "one-online": (ONE, False, "length"),
}
# controls, not run by default: the prompts a pilot leaves (the same job as ``-pilot``'s
# measured part), learnt online with nothing known: what the pilot's figures buy on that job
CONTROLS = {
    "five-rest": (FIVE, False, "length"),
    "one-rest": (ONE, False, "length"),
}

Runner = Callable[[list[str], Path, list[Prompt]], tuple[int, int, float, int]]


def runner(shape: Shape, scale: float, out: Path, order: str, lines: list[str]) -> Runner:
    """draftdata into ``out`` (a pilot may have written there first); what it counts is the
    completions committed since it started."""

    def run(
        urls: list[str], prompts_path: Path, prompts: list[Prompt]
    ) -> tuple[int, int, float, int]:
        started = time.time()
        settings: dict[str, Any] = {**engine_settings(shape, scale), "order": order}
        cfg = msgspec.convert(
            {"prompts": str(prompts_path), "endpoints": urls, "out": str(out), **settings},
            GenerateConfig,
        )
        summary = generate(cfg, log=lines.append, handle_signals=False)
        lines.append(
            f"engine: {summary.requests} requests, {summary.retries} retries, {summary.hedges} "
            f"hedges ({summary.hedges_won} won)"
        )
        if summary.run is not None:
            lines.extend(line.strip() for line in summary.run.lines() if "domain " in line)
        tokens = completed = 0
        last = 0.0
        for c in iter_completions(str(out)):
            if c.created >= started:
                tokens += c.usage.completion_tokens
                completed += 1
                last = max(last, c.created)
        failed = sum(1 for f in iter_failures(str(out)) if f.created >= started)
        return tokens, completed, last, failed

    return run


def pilot(shape: Shape, scale: float, out: Path, prompts_path: Path) -> Callable[[list[str]], None]:
    """``draftdata generate --pilot PILOT`` over the fleet, as a user types it."""

    def run(urls: list[str]) -> None:
        s = engine_settings(shape, scale)
        args = ["generate", "--prompts", str(prompts_path), "--out", str(out), "--pilot"]
        args += [str(PILOT), "--max-tokens", str(s["max_tokens"]), "--reasoning", "on"]
        args += ["--progress", "off", "-q"]
        for url in urls:
            args += ["--endpoint", url]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            cli_main(args)

    return run


def one_run(name: str, work: Path, job: int) -> tuple[Result, list[str], Shape, Path]:
    """Run ``name`` on job ``job`` (its prompts' texts drawn with seed ``job + 1``: another
    job draws other answer lengths)."""
    shape, with_pilot, order = {**RUNS, **CONTROLS}[name]
    scale = time_scale_for(shape)
    prompts_path = work / f"{'five' if shape.mixed else 'one'}-{job}.jsonl"
    if not prompts_path.exists():
        write_prompts(prompts_path, shape, seed=job + 1)
    if name in CONTROLS:
        prompts_path = rest_of(prompts_path)
    prompts: list[Prompt] = []  # read by the baseline client only
    out = work / f"run-{name}-{time.time_ns()}"
    lines: list[str] = []
    result = measure(
        name,
        shape,
        scale,
        prompts_path,
        prompts,
        runner(shape, scale, out, order, lines),
        before=pilot(shape, scale, out, prompts_path) if with_pilot else None,
        before_requests=PILOT if with_pilot else 0,
    )
    return result, lines, shape, out


def rest_of(prompts_path: Path) -> Path:
    """The prompts of ``prompts_path`` that ``generate --pilot PILOT`` (seed 0) leaves."""
    rest = prompts_path.with_suffix(".rest.jsonl")
    if not rest.exists():
        spec = parse_pilot(str(PILOT))
        taken = draw(prompt_files(str(prompts_path)), spec).ids
        with prompts_path.open("rb") as src, rest.open("wb") as out:
            for line in src:
                if msgspec.json.decode(line)["id"] not in taken:
                    out.write(line)
    return rest


def job_bounds(out: Path, shape: Shape, since: float) -> tuple[float, float | None]:
    """The greedy bounds (file order; knowing each domain's mean) on the prompts a run
    answered since ``since`` (after a pilot: the rest), at their actual lengths (the simulator
    draws each from its prompt: every run of the job answers the same), in file order."""
    got = {
        c.id: c.usage.completion_tokens for c in iter_completions(str(out)) if c.created >= since
    }
    domains = domains_for(shape.prompts, seed=1) if shape.mixed else None
    keep = [i for i in range(shape.prompts) if f"p{i:06d}" in got]
    lengths = [got[f"p{i:06d}"] for i in keep]
    kept = [domains[i] for i in keep] if domains is not None else None
    part = msgspec.structs.replace(shape, prompts=len(keep))
    lef = greedy_on(part, lengths, kept, longest_first=True) if kept is not None else None
    return greedy_on(part, lengths, kept), lef


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="jobs of each shape (other lengths)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration per job")
    ap.add_argument(
        "--only",
        default=",".join(RUNS),
        help="which runs (comma-separated; also the controls " + ", ".join(CONTROLS) + ")",
    )
    ap.add_argument("--verbose", action="store_true", help="print the engine's per-domain lines")
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    drawn = {
        "five": [greedy_bound(FIVE, k, longest_first=True) for k in range(5)],
        "one": [greedy_bound(ONE, k) for k in range(5)],
    }
    print(
        f"jobs: {FIVE.prompts:,} prompts, 8 sim servers x {FIVE.slots} seqs, server 0 at half "
        f"speed, server 1 down {DOWN * FIVE.seconds:.0f} s from 8 s; five domains "
        + ", ".join(f"{d} {m}" for d, m in FIVE.domain_means().items())
        + f" tokens; one domain mean {ONE.mean_tokens}; pilot {PILOT} prompts; "
        + f"{args.jobs} job(s) of each, {args.repeat} run(s) each"
    )
    print(
        "greedy bound (zero overhead, no hedging) on fresh draws of the shapes: five domains "
        f"knowing each domain's mean {statistics.mean(drawn['five']):.3f} "
        f"({min(drawn['five']):.3f}-{max(drawn['five']):.3f}), one domain "
        f"{statistics.mean(drawn['one']):.3f} ({min(drawn['one']):.3f}-{max(drawn['one']):.3f})"
    )
    load0 = os.getloadavg()[0]
    # per run: (name, job, result); per (name, job): the greedy bounds on its answer lengths
    runs: list[tuple[str, int, Result]] = []
    bounds: dict[tuple[str, int], tuple[float, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-order-") as tmp:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        for job in range(args.jobs):
            for _ in range(args.repeat):
                for name in names:
                    load = os.getloadavg()[0]
                    result, lines, shape, out = one_run(name, Path(tmp), job)
                    runs.append((name, job, result))
                    if (name, job) not in bounds:  # the same prompts' actual lengths
                        bounds[(name, job)] = job_bounds(out, shape, result.start)
                    fifo, lef = bounds[(name, job)]
                    ref = lef if lef is not None else fifo
                    print(
                        f"job {job} {report(result, shape.slots)}; greedy on its lengths: file "
                        f"order {fifo:.3f}"
                        + (f", knowing the means {lef:.3f}" if lef is not None else "")
                        + f" -> {result.efficiency / ref:.3f} of it; load {load:.1f}"
                    )
                    if args.verbose:
                        for line in lines:
                            if line.startswith(("domain ", "engine:", "generate: output lengths")):
                                print(f"    {line}")
    load1 = os.getloadavg()[0]

    def median(name: str, of: Callable[[str, int, Result], float]) -> float | None:
        got = [of(n, j, r) for n, j, r in runs if n == name]
        return statistics.median(got) if got else None

    def eff(n: str, j: int, r: Result) -> float:
        return r.efficiency

    def to_known(n: str, j: int, r: Result) -> float:
        fifo, lef = bounds[(n, j)]
        return r.efficiency / (lef if lef is not None else fifo)

    many = " (medians)" if len(runs) > len(names) else ""
    for kind, target in (("five", TARGET_FIVE), ("one", TARGET_ONE)):
        p, o = median(f"{kind}-pilot", eff), median(f"{kind}-online", eff)
        parts = []
        for label, e, name in (
            ("with a pilot", p, f"{kind}-pilot"),
            ("learnt online", o, f"{kind}-online"),
        ):
            if e is None:
                continue
            ratio = median(name, to_known)
            assert ratio is not None
            part = f"{label} {e:.3f} of ideal"
            if kind == "five":
                part += f" = {ratio:.3f} of the greedy that knows each domain's mean"
                ok = e >= target and ratio >= TARGET_KNOWN
            else:
                part += f" = {ratio:.3f} of the file-order greedy"
                ok = e >= target
            parts.append(part + f" ({'PASS' if ok else 'BELOW TARGET'})")
        if p is not None and o is not None:
            ok = o >= p - TARGET_ONLINE
            parts.append(
                f"online - pilot {o - p:+.3f} (target >= -{TARGET_ONLINE}: "
                f"{'PASS' if ok else 'BELOW TARGET'})"
            )
        if parts:
            head = "five domains" if kind == "five" else "one domain"
            print(f"efficiency{many}, {head}: " + "; ".join(parts))
    for shape_name in ("five", "one"):
        rest = median(f"{shape_name}-rest", eff)
        with_pilot = median(f"{shape_name}-pilot", eff)
        if rest is not None:
            line = f"control{many}, {shape_name}: the pilot's rest learnt online {rest:.3f}"
            if with_pilot is not None:
                line += f"; with the pilot's figures {with_pilot:.3f} ({with_pilot - rest:+.3f})"
            print(line)
    saved = [
        (rf.last - rf.start) - (ro.last - ro.start)
        for nf, jf, rf in runs
        if nf == "five-file"
        for no, jo, ro in runs
        if no == "five-online" and jo == jf
    ]
    file_walls = [r.last - r.start for n, _, r in runs if n == "five-file"]
    if saved and file_walls:
        e_file = median("five-file", eff)
        assert e_file is not None
        wall = statistics.median(file_walls)
        gain = statistics.median(saved)
        print(
            f"the order saved{many}: {gain:.2f} s of {wall:.2f} s ({gain / wall:.1%}) on the "
            f"five-domain job (--order file {e_file:.3f} of ideal, learnt online against it)"
        )
    print(f"load average at start / end: {load0:.2f} / {load1:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
