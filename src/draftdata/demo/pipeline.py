"""The whole draftdata pipeline on embedded defaults, in one process, on 127.0.0.1.

``run_demo(out)`` does what a user does for a real job, with stand-ins for what needs GPUs or
the network:

1. write the bundled sample sources (the six seed-job schemas, messy rows included) and a
   77%-code "existing training set" (``existing.jsonl``, SpecForge ``conversations`` rows);
2. train (once, cached) a small byte-level BPE tokenizer with a Qwen3-style chat template;
3. ``prepare`` the samples against the existing set (dedup, mix plan) into ``prompts/``;
4. start a simulated fleet (SGLang-shaped servers with continuous-batching timing, answering
   with token ids of the demo tokenizer) and ``generate`` every prompt into ``run/``;
5. ``tokenize`` the run token-exactly into ``tokenized/``;
6. ``merge`` the existing set and the new completions onto the target mix into ``merged/``;
7. ``stats`` before and after, and ``report`` everything into ``report.html``.

Every step is the same stage function the CLI calls. The output folder is created; a folder that
an earlier demo made (it holds ``.draftdata-demo``) is replaced, but for its tokenizer cache
``.cache``; any other non-empty folder is
refused, so the demo never deletes a user's data.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rich.table import Table

from draftdata.demo.existing import write_existing_set
from draftdata.demo.tokenizer import ensure_demo_tokenizer
from draftdata.errors import InputError
from draftdata.generate.config import GenerateConfig, Sampling
from draftdata.generate.stage import generate
from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge
from draftdata.prepare.config import ExistingConfig
from draftdata.prepare.samples import sample_config, write_sample_sources
from draftdata.prepare.stage import prepare
from draftdata.report.build import build_report
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet
from draftdata.stats.compute import compute_stats
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize

MARKER = ".draftdata-demo"
CACHE = ".cache"  # the default tokenizer cache, kept when a rerun replaces the folder

#: The mix the demo merges to (the existing set is 77% code).
DEMO_MIX = {"code": 0.35, "math": 0.25, "general": 0.25, "tool": 0.1, "agent": 0.05}
#: How far each domain's share of the loss tokens may sit from DEMO_MIX. The demo's few hundred
#: rows are whole units of a few hundred tokens each, so half a point (merge's default) keeps
#: almost nothing; a point keeps about half. The demo writes whatever the plan keeps
#: (allow_drop): its table says how much that is.
DEMO_TOLERANCE = 0.01


@dataclass
class DemoResult:
    """Where the demo wrote its outputs, and the figures of each stage."""

    out: Path
    paths: dict[str, Path]
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (stage, figure, value)
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise InputError(
                f"demo: {out} exists and is not empty (and was not made by the demo); "
                "give another --out"
            )
        for child in out.iterdir():  # everything but the tokenizer cache (OUT/.cache)
            if child.name == CACHE:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by `draftdata demo`; the next demo run replaces it\n")


def _share_line(counts: dict[str, int]) -> str:
    total = sum(counts.values()) or 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{d} {100 * n / total:.0f}%" for d, n in top)


def run_demo(
    out: Path,
    *,
    servers: int = 2,
    budget: int = 120,
    seed: int = 0,
    time_scale: float = 0.05,
    mean_output_tokens: int = 400,
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> DemoResult:
    """Run every stage on the embedded defaults into ``out``; return paths and figures."""

    start = time.perf_counter()
    out = out.resolve()
    _prepare_out(out)
    paths = {
        "samples": out / "samples",
        "existing": out / "existing.jsonl",
        "prompts": out / "prompts",
        "run": out / "run",
        "tokenized": out / "tokenized",
        "merged": out / "merged",
        "report": out / "report.html",
    }
    result = DemoResult(out=out, paths=paths)
    rows = result.rows

    log("demo: 1/7 sample sources and a 77%-code existing training set")
    write_sample_sources(paths["samples"])
    write_existing_set(paths["existing"], rows=400, seed=seed)
    before = compute_stats(str(paths["existing"]))
    result.before = before.domain_counts()
    rows.append(("existing set", "rows / mix", f"{before.rows} / {_share_line(result.before)}"))
    rows.append(("existing set", "loss-token mix (~)", _share_line(before.domain_loss_tokens())))

    log("demo: 2/7 tokenizer (trained locally once, then cached)")
    tokenizer = ensure_demo_tokenizer(cache_dir or out / CACHE)
    paths["tokenizer"] = tokenizer

    log("demo: 3/7 prepare")
    pcfg = sample_config(paths["samples"], paths["prompts"], budget=budget, seed=seed)
    pcfg = msgspec.structs.replace(pcfg, existing=ExistingConfig(path=str(paths["existing"])))
    prepared = prepare(pcfg)
    totals = prepared.report["totals"]
    rows.append(
        (
            "prepare",
            "read / rejected / duplicates / taken",
            f"{totals['read']} / {totals['rejected']} / {totals['duplicates']} / {totals['taken']}",
        )
    )

    log(f"demo: 4/7 generate on {servers} simulated servers")
    sim = SimConfig(
        tokenizer=str(tokenizer),
        time_scale=time_scale,
        mean_output_tokens=mean_output_tokens,
        max_running=16,
        context_length=8192,
        seed=seed,
    )
    with SimFleet(servers, sim) as fleet:
        gsum = generate(
            GenerateConfig(
                prompts=str(paths["prompts"]),
                endpoints=fleet.urls,
                out=str(paths["run"]),
                max_tokens=2048,
                reasoning="on",
                sampling=Sampling(temperature=0.6, top_p=0.95, seed=seed),
                progress="plain",
                log_interval=5.0,
                metrics_interval=1.0,
                flush_seconds=2.0,
            ),
            handle_signals=False,
            log=lambda line: log(f"  {line}"),
        )
    rows.append(
        (
            "generate",
            "completed / failed / output tokens",
            f"{gsum.completed} / {gsum.failures} / {gsum.output_tokens:,}",
        )
    )
    rate = gsum.output_tokens / gsum.wall_s if gsum.wall_s else 0.0
    rows.append(("generate", "wall / output tok/s", f"{gsum.wall_s:.1f} s / {rate:,.0f}"))

    log("demo: 5/7 tokenize (token-exact: server ids, verified against the template)")
    tsum = tokenize(
        TokenizeConfig(run=str(paths["run"]), tokenizer=str(tokenizer), out=str(paths["tokenized"]))
    )
    rows.append(
        (
            "tokenize",
            "samples / verified / mismatched",
            f"{tsum.count('samples')} / {tsum.count('verified')} / {tsum.count('mismatched')}",
        )
    )

    log("demo: 6/7 merge existing + new onto the target mix")
    # a small --budget may bring no rows of a domain: merge refuses a mix naming a domain no
    # input holds, so the demo leaves such domains out and says so
    held = set(result.before) | set(compute_stats(str(paths["run"])).domain_counts())
    mix = {d: s for d, s in DEMO_MIX.items() if d in held}
    if len(mix) < len(DEMO_MIX):
        absent = ", ".join(d for d in DEMO_MIX if d not in mix)
        rows.append(("merge", "note", f"no {absent} rows at this budget: left out of the mix"))
    msum = merge(
        MergeConfig(
            existing=[str(paths["existing"])],
            add=[str(paths["run"])],
            mix=mix,
            out=str(paths["merged"]),
            seed=seed,
            eval_fraction=0.05,
            tolerance=DEMO_TOLERANCE,
            allow_drop=True,
            format="sharegpt",
        )
    )
    after: dict[str, int] = {}
    for split in ("train", "eval"):
        for d, n in getattr(msum.report.after, split).items():
            after[d] = after.get(d, 0) + int(n)
    result.after = after
    rows.append(
        (
            "merge",
            "train / eval rows",
            f"{msum.train_rows} / {msum.eval_rows}",
        )
    )
    rows.append(("merge", "row mix", _share_line(after)))
    tokens: dict[str, int] = {}
    for split in ("train", "eval"):
        for d, n in getattr(msum.report.tokens.after, split).items():
            tokens[d] = tokens.get(d, 0) + int(n)
    rows.append(("merge", "loss-token mix (~)", _share_line(tokens)))
    plan = msum.report.plan
    kept = f"{100 * plan.kept_share:.0f}% (within {100 * DEMO_TOLERANCE:g} point of each target)"
    rows.append(("merge", "loss tokens kept", kept))
    if msum.message:
        rows.append(("merge", "note", msum.message))

    log("demo: 7/7 report")
    build_report(out, out=paths["report"], title="draftdata demo")
    result.wall_s = time.perf_counter() - start
    return result


def summary_table(result: DemoResult) -> Any:
    """A rich Table of the demo's figures (the CLI prints the output paths below it)."""

    table = Table(title=f"draftdata demo ({result.wall_s:.1f} s)", title_justify="left")
    table.add_column("stage")
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    for stage, figure, value in result.rows:
        table.add_row(stage, figure, value)
    return table
