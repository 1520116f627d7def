"""The forecast of a whole generate run from its pilot (``pilot.py``): tokens, time, the mix.

``forecast(...)`` is arithmetic on what the pilot measured, in named steps (``_pool`` the
pilot's pairs per domain, ``_pilot_warnings``, ``_rest`` the rest's tokens and their bootstrap,
``_domain`` a domain's row, ``_time``), and returns the typed record ``forecast.json`` holds
(``store/forecast.py``'s ``Forecast``); ``pilot_outcome`` and ``remaining_pairs`` read what it
needs from the run and the prompt files. The estimate is
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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftdata.errors import InputError
from draftdata.generate.plan.pilot_sample import PilotSample, Stratum, scope_keys
from draftdata.generate.plan.saturation import Throughput
from draftdata.records import FATAL_REASONS
from draftdata.shared.formats import COMPLETION_FORMAT, FAILURE_FORMAT
from draftdata.shared.tokens import ESTIMATE_ERROR
from draftdata.store.base import Store
from draftdata.store.doneset import hash_pairs
from draftdata.store.forecast import DomainForecast, FleetRate, Forecast, PilotFigures
from draftdata.store.read import (
    COMPLETIONS_PREFIX,
    FAILURES_PREFIX,
    output_tokens,
    read_shards_parallel,
    shard_keys,
    turn_finish_reasons,
)
from draftdata.store.resume import rebuild_done_sets
from draftdata.support.metrics import StageStats

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
        are estimated from its text, ``draftdata.shared.tokens.turns_tokens``)."""
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


class _Resampler:
    """The seeded bootstrap: ``BOOTSTRAP`` means of ``values`` resampled with replacement.
    Every draw advances one generator, so the order of the calls is part of the result."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, values: list[int]) -> np.ndarray[Any, Any]:
        arr = np.asarray(values, dtype=np.float64)
        idx = self.rng.integers(0, len(arr), size=(BOOTSTRAP, len(arr)))
        return np.asarray(arr[idx].mean(axis=1))


@dataclass
class _Pooled:
    """The pilot's settled pairs per domain (a failure is a pair of 0 tokens)."""

    pairs: dict[str, list[int]]
    completions: dict[str, list[int]]  # output tokens of the completed pairs
    cuts: dict[str, int]
    failures: dict[str, int]

    @property
    def everything(self) -> list[int]:
        """Every settled pair, domain by domain."""
        return [v for values in self.pairs.values() for v in values]


def _pool(outcome: Outcome, strata: list[Stratum], domains: list[str]) -> _Pooled:
    """The outcome's strata pooled per domain."""
    pooled = _Pooled(
        pairs={d: [] for d in domains},
        completions={d: [] for d in domains},
        cuts=dict.fromkeys(domains, 0),
        failures=dict.fromkeys(domains, 0),
    )
    for s in strata:
        d = s[1]
        pooled.pairs[d] += outcome.pairs(s)
        pooled.completions[d] += outcome.tokens.get(s, [])
        pooled.cuts[d] += sum(outcome.cut.get(s, []))
        pooled.failures[d] += outcome.failed.get(s, 0)
    return pooled


def _pilot_warnings(outcome: Outcome, pairs: int) -> list[str]:
    """What the pilot's size and its token counts say of the whole forecast; InputError when
    no answer's tokens were counted (nothing measured)."""
    warnings: list[str] = []
    if pairs < MIN_PILOT:
        warnings.append(
            f"the pilot has {pairs} answered pairs (< {MIN_PILOT}): too small for an "
            "interval; run a larger --pilot"
        )
    if not pairs:
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
    return warnings


@dataclass
class _Rest:
    """The rest of the run's output tokens per domain: the point estimate and, with a
    bootstrap, one value per round; the strata that borrowed their domain's mean."""

    point: dict[str, float]
    draws: dict[str, np.ndarray[Any, Any]] | None
    borrowed: list[str]

    @property
    def total(self) -> float:
        """The rest's point estimate."""
        return sum(self.point.values())

    def total_draws(self) -> np.ndarray[Any, Any] | None:
        """The rest's bootstrap values (None: no bootstrap)."""
        if self.draws is None:
            return None
        return np.asarray(np.sum(list(self.draws.values()), axis=0))


def _rest(
    outcome: Outcome,
    strata: list[Stratum],
    left: dict[Stratum, int],
    pooled: _Pooled,
    resample: _Resampler | None,
) -> _Rest:
    """Each stratum's pairs left times its mean per pair: its own pilot pairs', else its
    domain's, else the whole pilot's (module docstring); bootstrapped when ``resample``."""
    domains = list(pooled.pairs)
    everything = pooled.everything
    overall = float(np.mean(everything)) if everything else 0.0
    rest = _Rest(
        point=dict.fromkeys(domains, 0.0),
        draws={d: np.zeros(BOOTSTRAP) for d in domains} if resample is not None else None,
        borrowed=[],
    )
    # the draws of the pooled means come first: the generator's order is the result's
    by_domain = (
        {d: resample(v) for d, v in pooled.pairs.items() if v} if resample is not None else {}
    )
    whole = resample(everything) if resample is not None and everything else None
    for s in strata:
        k = left.get(s, 0)
        if not k:
            continue
        own = outcome.pairs(s)
        d = s[1]
        draw: np.ndarray[Any, Any] | None
        if own:
            mean = float(np.mean(own))
            draw = resample(own) if resample is not None else None
        elif pooled.pairs[d]:
            rest.borrowed.append(f"{s[0] or '(no source)'}/{d or '(none)'}")
            mean = float(np.mean(pooled.pairs[d]))
            draw = by_domain.get(d)
        else:
            mean, draw = overall, whole
        rest.point[d] += k * mean
        if rest.draws is not None and draw is not None:
            rest.draws[d] += k * draw
    return rest


def _borrowed_warning(borrowed: list[str]) -> list[str]:
    """The note naming the strata that took their domain's mean (the first five)."""
    if not borrowed:
        return []
    shown = ", ".join(borrowed[:5]) + (
        f" and {len(borrowed) - 5} more" if len(borrowed) > 5 else ""
    )
    return [f"strata with no pilot answer take their domain's mean: {shown}"]


def _domain(
    d: str,
    sample: PilotSample,
    pooled: _Pooled,
    rest: _Rest,
    committed: int,
    whole: float,
    resample: _Resampler | None,
) -> DomainForecast:
    """One domain's row: the pilot's measurement, the run's tokens and their share; the
    intervals where the bootstrap runs and the domain has ``MIN_INTERVAL`` pilot pairs."""
    prompts = sum(c for s, c in sample.strata.items() if s[1] == d)
    comp = pooled.completions[d]
    settled = len(pooled.pairs[d])
    tokens = committed + rest.point[d]
    mean_90 = tokens_90 = None
    if resample is not None and rest.draws is not None and settled >= MIN_INTERVAL and comp:
        mean_90 = _interval(resample(comp), 1)
        tokens_90 = _interval(np.asarray(committed + rest.draws[d]))
    return DomainForecast(
        prompts=prompts,
        pilot_prompts=sum(len(v) for s, v in sample.drawn.items() if s[1] == d),
        pilot_completions=len(comp),
        pilot_failures=pooled.failures[d],
        mean_output_tokens=round(float(np.mean(comp)), 1) if comp else None,
        p90_output_tokens=round(float(np.percentile(comp, 90)), 1) if comp else None,
        cut_share=round(pooled.cuts[d] / len(comp), 4) if comp else None,
        failure_share=round(pooled.failures[d] / settled, 4) if settled else None,
        output_tokens=round(tokens),
        remaining_output_tokens=round(rest.point[d]),
        output_tokens_per_prompt=round(tokens / prompts, 1) if prompts else None,
        share=round(tokens / whole, 4) if whole else None,
        measured=bool(comp),
        mean_output_tokens_90=mean_90,
        output_tokens_90=tokens_90,
    )


def _domain_warning(name: str, settled: int, prompts: int, n: int, in_scope: int) -> list[str]:
    """The note of a domain with fewer than ``MIN_DOMAIN`` pilot answers (none without
    prompts in scope)."""
    if not prompts or settled >= MIN_DOMAIN:
        return []
    return [
        f"domain {name}: {settled} pilot answers (< {MIN_DOMAIN}): its figures are "
        + ("rough" if settled else "not measured (the overall mean is used)")
        + _pilot_needed(prompts * n, in_scope)
    ]


@dataclass
class _Time:
    """The rest's wall time and GPU-hours, with their intervals (all None: no rate)."""

    wall_s: float | None = None
    wall_s_90: list[float] | None = None
    gpu_hours: float | None = None
    gpu_hours_90: list[float] | None = None


def _time(
    throughput: Throughput | None, rest: float, draws: np.ndarray[Any, Any] | None, gpus: int
) -> _Time:
    """The rest's tokens over the fleet's saturated rate, plus the drain and the command's
    overhead; GPU-hours are that times ``gpus``."""
    rate = throughput.output_tokens_per_s if throughput is not None else None
    if throughput is None or not rate:
        return _Time()
    fixed = throughput.overhead_s + throughput.drain_s
    wall = fixed + rest / rate
    wall_90 = [round(fixed + x / rate, 1) for x in _interval(draws) or []] or None
    return _Time(
        wall_s=round(wall, 1),
        wall_s_90=wall_90,
        gpu_hours=round(gpus * wall / 3600, 3),
        gpu_hours_90=[round(gpus * w / 3600, 3) for w in wall_90] if wall_90 else None,
    )


def _fleet_rate(throughput: Throughput) -> FleetRate:
    """The throughput as the forecast records it."""
    return msgspec.convert(throughput.to_dict(), FleetRate)


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
) -> Forecast:
    """The forecast (module docstring), the record ``forecast.json`` holds.

    ``left``/``left_prompts``: per stratum, the pairs and prompts the run has not settled;
    ``committed``: domain -> output tokens the run holds now.
    """
    strata = sorted(set(sample.strata) | set(left))
    domains = sorted({d for _, d in strata} | set(committed))
    pooled = _pool(outcome, strata, domains)
    pairs = len(pooled.everything)
    warnings = _pilot_warnings(outcome, pairs)
    resample = _Resampler(sample.seed) if pairs >= MIN_PILOT else None
    rest = _rest(outcome, strata, left, pooled, resample)
    warnings += _borrowed_warning(rest.borrowed)
    rest_draws = rest.total_draws()
    held = sum(committed.values())
    whole = held + rest.total
    by_domain: dict[str, DomainForecast] = {}
    for d in domains:
        name = d or "(none)"
        row = _domain(d, sample, pooled, rest, committed.get(d, 0), whole, resample)
        warnings += _domain_warning(name, len(pooled.pairs[d]), row.prompts, n, sample.in_scope)
        by_domain[name] = row
    time = _time(throughput, rest.total, rest_draws, gpus)
    if throughput is not None:
        warnings += throughput.problems
    if time.wall_s is None:
        warnings.append(
            "the fleet's saturated rate was not measured (the pilot never kept the endpoints "
            "full for long): no time forecast; run a larger --pilot (a few prompts per slot)"
        )
    return Forecast(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        run_id=run_id,
        pilot=PilotFigures(
            spec=sample.spec.text(),
            seed=sample.seed,
            prompts=len(sample.ids),
            completions=sum(len(v) for v in pooled.completions.values()),
            failures=sum(pooled.failures.values()),
            strata=len(sample.strata),
            wall_s=round(pilot_wall_s, 3) if pilot_wall_s is not None else None,
        ),
        n=n,
        max_tokens=max_tokens,
        prompts=sample.in_scope,
        remaining_prompts=sum(left_prompts.values()),
        remaining_pairs=sum(left.values()),
        committed_output_tokens=held,
        committed_active_s=round(committed_active_s, 3),
        output_tokens=round(rest.total),
        output_tokens_90=_interval(rest_draws),
        run_output_tokens=round(whole),
        run_output_tokens_90=None if rest_draws is None else _interval(held + rest_draws),
        endpoints=endpoints,
        gpus=gpus,
        wall_s=time.wall_s,
        wall_s_90=time.wall_s_90,
        gpu_hours=time.gpu_hours,
        gpu_hours_90=time.gpu_hours_90,
        throughput=_fleet_rate(throughput) if throughput is not None else None,
        by_domain=by_domain,
        warnings=warnings,
    )


def _pilot_needed(pairs: int, in_scope: int) -> str:
    """What pilot measures a domain of ``pairs`` (prompt, sample) pairs in a job of
    ``in_scope`` prompts to ``MIN_DOMAIN`` answers: a pilot of the job's share that holds them,
    never more than the job, or that no pilot of this job can."""
    if pairs < MIN_DOMAIN:
        return f"; it cannot be measured in this job (it has {pairs:,} to answer in all)"
    need = min(math.ceil(MIN_DOMAIN / pairs * in_scope), in_scope)
    return f"; a pilot of about {need:,} of the job's {in_scope:,} prompts measures it"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def _span(iv: list[float] | None) -> str:
    return f" (90%: {_num(iv[0])}-{_num(iv[1])})" if iv else ""


def forecast_lines(data: Forecast, where: str | None = None) -> list[str]:
    """The forecast as the CLI prints it."""
    p = data.pilot
    lines = [
        f"pilot: {p.prompts:,} prompts ({p.spec}, seed {p.seed}, {p.strata} "
        f"strata): {p.completions:,} completions, {p.failures:,} failed",
        f"{'domain':<12} {'prompts':>9} {'mean out':>9} {'p90 out':>9} {'cut':>6} "
        f"{'run tokens':>14} {'share':>6}",
    ]
    for name, d in data.by_domain.items():
        cut = "-" if d.cut_share is None else f"{d.cut_share:.1%}"
        share = "-" if d.share is None else f"{d.share:.1%}"
        lines.append(
            f"{name:<12} {d.prompts:>9,} {_num(d.mean_output_tokens):>9} "
            f"{_num(d.p90_output_tokens):>9} {cut:>6} {d.output_tokens:>14,} {share:>6}"
        )
    lines.append(
        f"the rest of the run: {data.remaining_prompts:,} prompts, "
        f"{data.output_tokens:,} output tokens{_span(data.output_tokens_90)}"
    )
    rate = data.throughput.output_tokens_per_s if data.throughput is not None else None
    if data.wall_s is not None and data.gpu_hours is not None and rate is not None:
        hours_90 = data.gpu_hours_90
        lines.append(
            f"  at {rate:,.0f} output tok/s (the fleet's saturated rate): "
            f"{_duration(data.wall_s)}{_span_t(data.wall_s_90, data.wall_s)}, "
            f"{data.gpu_hours:,.2f} GPU-hours on {data.gpus} GPU(s)"
            + (f" (90%: {hours_90[0]:,.2f}-{hours_90[1]:,.2f})" if hours_90 else "")
        )
    lines.append(
        f"the whole run: {data.run_output_tokens:,} output tokens{_span(data.run_output_tokens_90)}"
    )
    for w in data.warnings:
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


def _span_t(iv: list[float] | None, point: float) -> str:
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
