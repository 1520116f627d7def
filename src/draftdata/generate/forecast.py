"""The forecast of a whole generate run from its pilot (``pilot.py``): tokens, time, the mix.

``forecast(...)`` is arithmetic on what the pilot measured; ``pilot_outcome`` and
``remaining_pairs`` read what it needs from the run and the prompt files. The estimate is
stratified: each (source, domain) stratum's output tokens per (prompt, sample) pair are the mean
of its pilot pairs (a fatally failed pair counts 0: it yields nothing), times the pairs the run
has left in that stratum; a stratum the pilot has no answer for takes its domain's mean, else
the pilot's. Per domain it gives the prompts in scope, the mean and p90 output tokens of a
completion, the share cut at the limit, the run's output tokens (what is committed plus the
rest) and their share of the whole: the token mix the run will produce.

Time: the rest's output tokens over the fleet's saturated rate, plus the drain at the end
(about one request life) and the command's start-up and closing, all from the pilot
(``saturation.py``); GPU-hours are that wall time times the fleet's GPUs (``gpu`` of each
endpoint in fleet.yaml, else one per endpoint).

Uncertainty: a 90% interval from a stratified bootstrap of the pilot's pairs (each stratum
resampled with replacement, ``BOOTSTRAP`` times, seeded), for the tokens and, at the measured
rate, the time; the rate itself is one measurement and the interval does not include its error.
A domain with fewer than ``MIN_INTERVAL`` pilot pairs gets no interval, and one with fewer than
``MIN_DOMAIN`` a warning; a pilot with fewer than ``MIN_PILOT`` pairs gets no interval at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftdata.errors import InputError
from draftdata.formats import COMPLETION_FORMAT, FAILURE_FORMAT
from draftdata.generate.pilot_sample import PilotSample, Stratum, scope_keys
from draftdata.generate.saturation import Throughput
from draftdata.metrics import StageStats
from draftdata.records import FATAL_REASONS
from draftdata.store.base import Store
from draftdata.store.doneset import hash_pairs
from draftdata.store.forecast import FORECAST_FORMAT
from draftdata.store.read import (
    COMPLETIONS_PREFIX,
    FAILURES_PREFIX,
    output_tokens,
    read_shards_parallel,
    shard_keys,
    turn_finish_reasons,
)
from draftdata.store.resume import rebuild_done_sets
from draftdata.tokens import ESTIMATE_ERROR

BOOTSTRAP = 1000
MIN_PILOT = 30  # pilot pairs below which no interval is given
MIN_INTERVAL = 10  # a domain's pilot pairs below which it gets no interval
MIN_DOMAIN = 30  # a domain's pilot pairs below which its figures are called rough
_BLOCK = 4096


class Outcome:
    """The pilot's settled pairs per stratum: completion tokens and cut flags, fatal failures."""

    def __init__(self) -> None:
        self.tokens: dict[Stratum, list[int]] = {}
        self.cut: dict[Stratum, list[bool]] = {}
        self.failed: dict[Stratum, int] = {}
        self.estimated = 0  # completions whose tokens are estimated from their text

    def add(self, stratum: Stratum, tokens: int, cut: bool, estimated: bool = False) -> None:
        """One completed pair (``estimated``: its servers counted no output tokens, so they
        are estimated from its text, ``draftdata.tokens.turns_tokens``)."""
        self.tokens.setdefault(stratum, []).append(tokens)
        self.cut.setdefault(stratum, []).append(cut)
        self.estimated += estimated

    @property
    def completions(self) -> int:
        """Completed pairs."""
        return sum(len(v) for v in self.tokens.values())

    def fail(self, stratum: Stratum) -> None:
        """One fatally failed pair."""
        self.failed[stratum] = self.failed.get(stratum, 0) + 1

    def pairs(self, stratum: Stratum) -> list[int]:
        """The stratum's per-pair output tokens (a failure is 0)."""
        return self.tokens.get(stratum, []) + [0] * self.failed.get(stratum, 0)


def pilot_outcome(store: Store, sample: PilotSample) -> Outcome:
    """What the run holds for the sample's ids (committed completions and standing fatal
    failures), per stratum of the draw. Reads only the needed columns."""

    stratum_of = {pid: s for s, ids in sample.drawn.items() for pid in ids}
    wanted = pa.array(sorted(stratum_of), pa.string())
    out = Outcome()
    done: set[tuple[str, int]] = set()
    cols = ["id", "sample", "usage", "turns.list.element.finish_reason"]
    keys = shard_keys(store, COMPLETIONS_PREFIX)
    tables = read_shards_parallel(store, keys, COMPLETION_FORMAT, cols)
    for key, table in zip(keys, tables, strict=True):
        mine = pc.is_in(table.column("id"), value_set=wanted)
        if not pc.any(mine).as_py():
            continue
        counted, estimated = output_tokens(store, key, table)  # the shard's rows, in order
        keep = mine.to_pylist()
        table = table.filter(mine)
        rows = zip(
            table.column("id").to_pylist(),
            table.column("sample").to_pylist(),
            (n for n, k in zip(counted, keep, strict=True) if k),
            (e for e, k in zip(estimated, keep, strict=True) if k),
            turn_finish_reasons(table.column("turns")),
            strict=True,
        )
        for pid, smp, tok, est, reasons in rows:
            if (pid, smp) in done:
                continue
            done.add((pid, smp))
            out.add(stratum_of[pid], tok, "length" in reasons, est)
    failed: set[tuple[str, int]] = set()
    keys = shard_keys(store, FAILURES_PREFIX)
    for table in read_shards_parallel(store, keys, FAILURE_FORMAT, ["id", "sample", "reason"]):
        table = table.filter(pc.is_in(table.column("id"), value_set=wanted))
        fails = zip(
            table.column("id").to_pylist(),
            table.column("sample").to_pylist(),
            table.column("reason").to_pylist(),
            strict=True,
        )
        for pid, smp, reason in fails:
            if reason in FATAL_REASONS and (pid, smp) not in done and (pid, smp) not in failed:
                failed.add((pid, smp))
                out.fail(stratum_of[pid])
    return out


def remaining_pairs(
    store: Store,
    files: list[Any],
    *,
    n: int,
    limit: int | None,
    partition: Any,
    retry_failed: bool = False,
) -> tuple[dict[Stratum, int], dict[Stratum, int]]:
    """Per stratum of the prompts in scope: (pairs the run has not settled, prompts with such
    a pair). Settled: completed, or failed fatally (unless ``retry_failed``)."""

    completed, fatal, _ = rebuild_done_sets(store, store.list(""), StageStats("forecast"))
    pairs: dict[Stratum, int] = {}
    prompts: dict[Stratum, int] = {}

    def count(block: list[tuple[str, str, str]]) -> None:
        ids = [pid for pid, _, _ in block]
        left = np.zeros(len(ids), dtype=np.int64)
        for smp in range(n):
            h = hash_pairs(ids, [smp] * len(ids) if smp else None)
            done = completed.contains_many(h)
            if not retry_failed:
                done |= fatal.contains_many(h)
            left += ~done
        for (_, source, domain), k in zip(block, left.tolist(), strict=True):
            s = (source, domain)
            pairs[s] = pairs.get(s, 0) + k
            prompts[s] = prompts.get(s, 0) + (k > 0)

    block: list[tuple[str, str, str]] = []
    seen: set[str] = set()  # a repeated id is rejected by the reader: not work left
    for keys in scope_keys(files, limit=limit, partition=partition):
        if keys[0] in seen:
            continue
        seen.add(keys[0])
        block.append(keys)
        if len(block) >= _BLOCK:
            count(block)
            block = []
    if block:
        count(block)
    return pairs, prompts


def _interval(values: np.ndarray[Any, Any] | None, digits: int = 0) -> list[float] | None:
    """The 5th and 95th percentiles of bootstrap ``values`` (None: no interval)."""
    if values is None:
        return None
    lo, hi = np.percentile(values, [5, 95])
    return [round(float(lo), digits), round(float(hi), digits)]


def forecast(
    sample: PilotSample,
    outcome: Outcome,
    left: dict[Stratum, int],
    left_prompts: dict[Stratum, int],
    *,
    committed: dict[str, int],
    committed_active_s: float,
    throughput: Throughput | None,
    gpus: int,
    endpoints: int,
    n: int = 1,
    max_tokens: int | None = None,
    run_id: str | None = None,
    pilot_wall_s: float | None = None,
) -> dict[str, Any]:
    """The forecast (module docstring) as the JSON-ready dict ``forecast.json`` holds.

    ``left``/``left_prompts``: per stratum, the pairs and prompts the run has not settled;
    ``committed``: domain -> output tokens the run holds now.
    """
    rng = np.random.default_rng(sample.seed)
    strata = sorted(set(sample.strata) | set(left))
    domains = sorted({d for _, d in strata} | set(committed))
    pooled: dict[str, list[int]] = {d: [] for d in domains}
    comp: dict[str, list[int]] = {d: [] for d in domains}
    cuts: dict[str, int] = dict.fromkeys(domains, 0)
    fails: dict[str, int] = dict.fromkeys(domains, 0)
    for s in strata:
        pooled[s[1]] += outcome.pairs(s)
        comp[s[1]] += outcome.tokens.get(s, [])
        cuts[s[1]] += sum(outcome.cut.get(s, []))
        fails[s[1]] += outcome.failed.get(s, 0)
    everything = [v for d in domains for v in pooled[d]]
    total_pairs = len(everything)
    overall = float(np.mean(everything)) if everything else 0.0
    warnings: list[str] = []
    boot = total_pairs >= MIN_PILOT
    if not boot:
        warnings.append(
            f"the pilot has {total_pairs} answered pairs (< {MIN_PILOT}): too small for an "
            "interval; run a larger --pilot"
        )
    if not everything:
        warnings.append("the pilot has no answer: no lengths measured; the forecast is empty")
    if outcome.completions and outcome.estimated == outcome.completions:
        raise InputError(
            f"--pilot: the servers counted no output tokens for any of the pilot's "
            f"{outcome.completions:,} answers (no usage, or 0) and returned no token ids: "
            "nothing measured to forecast from; use servers that report usage, or ask for "
            "token ids (--token-ids on); the answers are kept in the run"
        )
    if outcome.estimated:
        warnings.append(
            f"{outcome.estimated:,} of the pilot's {outcome.completions:,} answers had no "
            f"output token count from their servers: their tokens are {ESTIMATE_ERROR}"
        )

    def resampled(values: list[int]) -> np.ndarray[Any, Any]:
        arr = np.asarray(values, dtype=np.float64)
        idx = rng.integers(0, len(arr), size=(BOOTSTRAP, len(arr)))
        return np.asarray(arr[idx].mean(axis=1))

    # per domain: the rest's tokens (point, and one value per bootstrap round)
    point: dict[str, float] = dict.fromkeys(domains, 0.0)
    draws: dict[str, np.ndarray[Any, Any]] = {d: np.zeros(BOOTSTRAP) for d in domains}
    pooled_draw = {d: resampled(v) for d, v in pooled.items() if v} if boot else {}
    overall_draw = resampled(everything) if boot and everything else None
    borrowed: list[str] = []
    for s in strata:
        k = left.get(s, 0)
        if not k:
            continue
        own = outcome.pairs(s)
        d = s[1]
        if own:
            point[d] += k * float(np.mean(own))
            if boot:
                draws[d] += k * resampled(own)
        elif pooled[d]:
            borrowed.append(f"{s[0] or '(no source)'}/{d or '(none)'}")
            point[d] += k * float(np.mean(pooled[d]))
            if boot:
                draws[d] += k * pooled_draw[d]
        else:
            point[d] += k * overall
            if boot and overall_draw is not None:
                draws[d] += k * overall_draw
    if borrowed:
        shown = ", ".join(borrowed[:5]) + (
            f" and {len(borrowed) - 5} more" if len(borrowed) > 5 else ""
        )
        warnings.append(f"strata with no pilot answer take their domain's mean: {shown}")
    rest = sum(point.values())
    rest_draw: np.ndarray[Any, Any] | None = None
    if boot:
        rest_draw = np.sum([draws[d] for d in domains], axis=0)
    whole = sum(committed.values()) + rest
    by_domain: dict[str, Any] = {}
    for d in domains:
        name = d or "(none)"
        prompts = sum(c for s, c in sample.strata.items() if s[1] == d)
        settled = len(pooled[d])
        tokens = committed.get(d, 0) + point[d]
        row: dict[str, Any] = {
            "prompts": prompts,
            "pilot_prompts": sum(len(v) for s, v in sample.drawn.items() if s[1] == d),
            "pilot_completions": len(comp[d]),
            "pilot_failures": fails[d],
            "mean_output_tokens": round(float(np.mean(comp[d])), 1) if comp[d] else None,
            "p90_output_tokens": round(float(np.percentile(comp[d], 90)), 1) if comp[d] else None,
            "cut_share": round(cuts[d] / len(comp[d]), 4) if comp[d] else None,
            "failure_share": round(fails[d] / settled, 4) if settled else None,
            "output_tokens": round(tokens),
            "remaining_output_tokens": round(point[d]),
            "output_tokens_per_prompt": round(tokens / prompts, 1) if prompts else None,
            "share": round(tokens / whole, 4) if whole else None,
            "measured": bool(comp[d]),
        }
        small = settled < MIN_INTERVAL
        if boot and not small and comp[d]:
            row["mean_output_tokens_90"] = _interval(resampled(comp[d]), 1)
            row["output_tokens_90"] = _interval(np.asarray(committed.get(d, 0) + draws[d]))
        else:
            row["mean_output_tokens_90"] = row["output_tokens_90"] = None
        if prompts and settled < MIN_DOMAIN:
            warnings.append(
                f"domain {name}: {settled} pilot answers (< {MIN_DOMAIN}): its figures are "
                + ("rough" if settled else "not measured (the overall mean is used)")
                + _pilot_needed(prompts * n, sample.in_scope)
            )
        by_domain[name] = row
    remaining_prompts = sum(left_prompts.values())
    out: dict[str, Any] = {
        "format": FORECAST_FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_id": run_id,
        "pilot": {
            "spec": sample.spec.text(),
            "seed": sample.seed,
            "prompts": len(sample.ids),
            "completions": sum(len(v) for v in comp.values()),
            "failures": sum(fails.values()),
            "strata": len(sample.strata),
            "wall_s": round(pilot_wall_s, 3) if pilot_wall_s is not None else None,
        },
        "n": n,
        "max_tokens": max_tokens,
        "prompts": sample.in_scope,
        "remaining_prompts": remaining_prompts,
        "remaining_pairs": sum(left.values()),
        "committed_output_tokens": sum(committed.values()),
        "committed_active_s": round(committed_active_s, 3),
        "output_tokens": round(rest),
        "output_tokens_90": _interval(rest_draw),
        "run_output_tokens": round(whole),
        "run_output_tokens_90": None
        if rest_draw is None
        else _interval(np.asarray(sum(committed.values()) + rest_draw)),
        "endpoints": endpoints,
        "gpus": gpus,
    }
    rate = throughput.output_tokens_per_s if throughput is not None else None
    if throughput is not None:
        warnings += throughput.problems
    if rate:
        assert throughput is not None
        fixed = throughput.overhead_s + throughput.drain_s
        wall = fixed + rest / rate
        out["wall_s"] = round(wall, 1)
        out["wall_s_90"] = (
            [round(fixed + x / rate, 1) for x in _interval(rest_draw) or []] or None
            if rest_draw is not None
            else None
        )
        out["gpu_hours"] = round(gpus * wall / 3600, 3)
        out["gpu_hours_90"] = (
            [round(gpus * w / 3600, 3) for w in out["wall_s_90"]] if out["wall_s_90"] else None
        )
    else:
        out["wall_s"] = out["wall_s_90"] = out["gpu_hours"] = out["gpu_hours_90"] = None
        warnings.append(
            "the fleet's saturated rate was not measured (the pilot never kept the endpoints "
            "full for long): no time forecast; run a larger --pilot (a few prompts per slot)"
        )
    out["throughput"] = throughput.to_dict() if throughput is not None else None
    out["by_domain"] = by_domain
    out["warnings"] = warnings
    return out


def _pilot_needed(pairs: int, in_scope: int) -> str:
    """What pilot measures a domain of ``pairs`` (prompt, sample) pairs in a job of
    ``in_scope`` prompts to ``MIN_DOMAIN`` answers: a pilot of the job's share that holds them,
    never more than the job, or that no pilot of this job can."""
    if pairs < MIN_DOMAIN:
        return f"; it cannot be measured in this job (it has {pairs:,} to answer in all)"
    need = min(math.ceil(MIN_DOMAIN / pairs * in_scope), in_scope)
    return f"; a pilot of about {need:,} of the job's {in_scope:,} prompts measures it"


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def _span(iv: Any) -> str:
    return f" (90%: {_num(iv[0])}-{_num(iv[1])})" if iv else ""


def forecast_lines(data: dict[str, Any], where: str | None = None) -> list[str]:
    """The forecast as the CLI prints it."""
    p = data["pilot"]
    lines = [
        f"pilot: {p['prompts']:,} prompts ({p['spec']}, seed {p['seed']}, {p['strata']} "
        f"strata): {p['completions']:,} completions, {p['failures']:,} failed",
        f"{'domain':<12} {'prompts':>9} {'mean out':>9} {'p90 out':>9} {'cut':>6} "
        f"{'run tokens':>14} {'share':>6}",
    ]
    for name, d in data["by_domain"].items():
        cut = "-" if d["cut_share"] is None else f"{d['cut_share']:.1%}"
        share = "-" if d["share"] is None else f"{d['share']:.1%}"
        lines.append(
            f"{name:<12} {d['prompts']:>9,} {_num(d['mean_output_tokens']):>9} "
            f"{_num(d['p90_output_tokens']):>9} {cut:>6} {d['output_tokens']:>14,} {share:>6}"
        )
    lines.append(
        f"the rest of the run: {data['remaining_prompts']:,} prompts, "
        f"{data['output_tokens']:,} output tokens{_span(data['output_tokens_90'])}"
    )
    if data["wall_s"] is not None:
        rate = data["throughput"]["output_tokens_per_s"]
        lines.append(
            f"  at {rate:,.0f} output tok/s (the fleet's saturated rate): "
            f"{_duration(data['wall_s'])}{_span_t(data['wall_s_90'], data['wall_s'])}, "
            f"{data['gpu_hours']:,.2f} GPU-hours on {data['gpus']} GPU(s)"
            + (
                f" (90%: {data['gpu_hours_90'][0]:,.2f}-{data['gpu_hours_90'][1]:,.2f})"
                if data["gpu_hours_90"]
                else ""
            )
        )
    lines.append(
        f"the whole run: {data['run_output_tokens']:,} output tokens"
        f"{_span(data['run_output_tokens_90'])}"
    )
    for w in data["warnings"]:
        lines.append(f"note: {w}")
    if where:
        lines.append(f"forecast written to {where}")
    return lines


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:,.1f} s"
    if s < 7200:
        return f"{s / 60:,.1f} min"
    return f"{s / 3600:,.2f} h"


def _span_t(iv: Any, point: float) -> str:
    if not iv:
        return ""
    if point < 120:
        return f" (90%: {iv[0]:,.1f}-{iv[1]:,.1f} s)"
    if point < 7200:
        return f" (90%: {iv[0] / 60:,.1f}-{iv[1] / 60:,.1f} min)"
    return f" (90%: {iv[0] / 3600:,.2f}-{iv[1] / 3600:,.2f} h)"


def gpu_count(gpu_fields: Iterable[str | None]) -> list[int]:
    """GPUs of each endpoint from fleet.yaml's ``gpu`` ("0", "0,1", ...; none: 1)."""
    return [len([g for g in (f or "").split(",") if g.strip()]) or 1 for f in gpu_fields]
