"""``measure_acceptance(config) -> Acceptance``: where the current drafter is weak, per domain.

The fleet that generates the data can also run the current drafter: SGLang with a draft model
(EAGLE-3, DFlash), vLLM with ``--speculative-config``. This stage sends an evaluation set of
prompts (a prompts JSONL or prepare's folder, each prompt's first request as generate would send
it) to such servers and reports, per domain, how often the drafter's tokens are accepted
(``measure.py`` says how the counts are attributed). With ``out`` it writes ``acceptance.json``
and ``suggested_mix.json`` (``result.py``: the mix rule) create-only, local or on S3.

It generates no training data and writes no run: its answers are thrown away.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import msgspec

from draftdata.acceptance.measure import (
    WARMUP_MAX_TOKENS,
    Job,
    Measurement,
    SpecServer,
    chunks,
    probe_spec,
)
from draftdata.errors import AlreadyExistsError, ConfigError, FleetError, InputError, Interrupted
from draftdata.generate.config import Reasoning, Sampling
from draftdata.generate.engine.client import EndpointClient, request_body
from draftdata.generate.engine.request import Request
from draftdata.generate.prompts.source import prompt_files
from draftdata.records import parse_prompt
from draftdata.shared.conversation import TurnPlan
from draftdata.shared.endpoints import api_key_from_env, base_url
from draftdata.shared.fleetspec import read_fleet
from draftdata.shared.speculation import (
    ACCEPTANCE_FILE,
    DEFAULT_MIN_SHARE,
    MIX_FILE,
    Acceptance,
    DomainAcceptance,
    mix_document,
    suggest_mix,
)
from draftdata.store.base import Store
from draftdata.store.opener import open_store
from draftdata.store.prompts import iter_prompt_lines
from draftdata.support.redact import redact_url
from draftdata.support.workerpool import interrupts

Log = Callable[[str], None]


@dataclass(frozen=True)
class AcceptanceConfig:
    """What to measure and how (every field but ``prompts`` and the servers has a default)."""

    prompts: str
    endpoints: tuple[str, ...] = ()
    fleet: str | None = None
    out: str | None = None
    per_domain: int = 200
    max_tokens: int = 512
    temperature: float | None = None
    seed: int | None = 0
    reasoning: Reasoning = "server"
    concurrency: int | None = None
    chunk: int | None = None
    api_key_env: str | None = None
    unavailable_timeout: float = 300.0  # give up when no server served for this long
    min_share: float = DEFAULT_MIN_SHARE
    domains: tuple[str, ...] = field(default_factory=tuple)


def validate(config: AcceptanceConfig) -> None:
    """One-line ConfigErrors for values that cannot work."""
    if not config.endpoints and not config.fleet:
        raise ConfigError("acceptance: give the servers with --endpoint URL ... or --fleet FILE")
    if config.per_domain < 1:
        raise ConfigError("acceptance: --per-domain must be at least 1")
    if config.max_tokens < 1:
        raise ConfigError("acceptance: --max-tokens must be at least 1")
    if config.concurrency is not None and config.concurrency < 1:
        raise ConfigError("acceptance: --concurrency must be at least 1")
    if config.chunk is not None and config.chunk < 1:
        raise ConfigError("acceptance: --chunk must be at least 1")
    if not config.unavailable_timeout >= 0:  # NaN too
        raise ConfigError("acceptance: --unavailable-timeout must be 0 or more seconds")
    if not 0 <= config.min_share <= 1:
        raise ConfigError("acceptance: --min-share must be in [0, 1]")
    if config.reasoning not in ("on", "off", "server"):
        raise ConfigError("acceptance: --reasoning must be on, off or server")


def load_jobs(config: AcceptanceConfig, log: Log) -> list[Job]:
    """Up to ``per_domain`` prompts of each domain, in file order, as first-request bodies;
    lines that are not valid prompts are skipped and counted in one line."""
    taken: dict[str, int] = collections.Counter()
    held: set[str] = set()  # every domain the file holds, measured or not
    wanted = set(config.domains)
    sampling = Sampling(temperature=config.temperature, seed=config.seed)
    jobs: list[Job] = []
    bad = 0
    for path in prompt_files(config.prompts):
        for n, raw in iter_prompt_lines(path):
            try:
                prompt = parse_prompt(raw, f"{path}:{n}")
            except InputError:
                bad += 1
                continue
            domain = prompt.domain or "unknown"
            held.add(domain)
            if (wanted and domain not in wanted) or taken[domain] >= config.per_domain:
                continue
            plan = TurnPlan(prompt.messages)
            if not len(plan):
                bad += 1
                continue
            request = Request(
                messages=plan.context(0, []),
                tools=prompt.tools,
                model="",
                max_tokens=config.max_tokens,
                sampling=sampling,
                reasoning=config.reasoning,
            )
            body = request_body(request)
            body.pop("model")
            jobs.append(Job(prompt.id, domain, body, config.max_tokens))
            taken[domain] += 1
    if bad:
        log(f"acceptance: {bad} line(s) of {config.prompts} are not prompts and were skipped")
    missing = wanted - set(taken)
    if missing and held:
        raise InputError(
            f"acceptance: no prompt of domain(s) {', '.join(sorted(missing))} in "
            f"{config.prompts}; it holds {', '.join(sorted(held))}"
        )
    if not jobs:
        raise InputError(f"acceptance: {config.prompts} holds no prompt to measure with")
    return jobs


def _urls(config: AcceptanceConfig) -> list[str]:
    if config.fleet:
        if not os.path.exists(config.fleet):
            raise ConfigError(f"--fleet {config.fleet}: no such file")
        return [base_url(e.url) for e in read_fleet(config.fleet).endpoints]
    urls = [base_url(u) for u in config.endpoints]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ConfigError(
            f"--endpoint {redact_url(bad[0])}: give a URL such as http://127.0.0.1:30000"
        )
    return list(dict.fromkeys(urls))


async def _measure(
    config: AcceptanceConfig,
    jobs: list[Job],
    log: Log,
    started: Callable[[list[SpecServer], Measurement], None],
) -> tuple[list[SpecServer], Measurement]:
    key = api_key_from_env(config.api_key_env)
    clients = [EndpointClient(u, api_key=key) for u in _urls(config)]
    warmup = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": WARMUP_MAX_TOKENS}
    try:
        async with aiohttp.ClientSession() as session:
            servers = [await probe_spec(session, c, warmup) for c in clients]
            models = {s.model for s in servers if s.model}
            if len(models) > 1:
                raise ConfigError(
                    f"acceptance: the servers serve different models ({', '.join(sorted(models))})"
                    "; measure one target's drafter at a time"
                )
            m = Measurement(
                servers,
                session,
                concurrency=config.concurrency,
                log=log,
                unavailable_timeout=config.unavailable_timeout,
            )
            started(servers, m)  # what a signal leaves is still written
            size = config.chunk or max(4 * max(m.width(s) for s in servers), 8)
            await m.run(chunks(jobs, size))
            return servers, m
    finally:
        for c in clients:
            await c.close()


def measure_acceptance(config: AcceptanceConfig, log: Log | None = None) -> Acceptance:
    """Measure, write ``acceptance.json`` and ``suggested_mix.json`` when ``out`` is given, and
    return the measurement. A measurement that ends early (no server served for
    ``unavailable_timeout``: FleetError; SIGINT or SIGTERM: Interrupted) writes what it
    measured first, saying in its warnings that it is partial."""
    say: Log = log or (lambda _line: None)
    validate(config)
    store = open_store(config.out) if config.out else None
    if store is not None:
        for name in (ACCEPTANCE_FILE, MIX_FILE):
            if store.exists(name):
                raise AlreadyExistsError(
                    f"acceptance: {store.key_url(name)} exists; give another --out "
                    "(a measurement is never overwritten)"
                )
    jobs = load_jobs(config, say)
    begun: list[tuple[list[SpecServer], Measurement]] = []
    try:
        with interrupts():
            servers, m = asyncio.run(
                _measure(config, jobs, say, lambda sv, me: begun.append((sv, me)))
            )
    except Interrupted as exc:
        if begun and begun[0][1].tallies:
            servers, m = begun[0]
            m.left = m.total_jobs - m.done_jobs
            m.warnings.append(
                f"stopped by {exc.signame}: {m.left} of {m.total_jobs} prompts were not "
                "measured; the figures are of the measured ones"
            )
            _finish(config, store, servers, m, say)
        raise
    if m.gave_up and not m.tallies:
        raise FleetError(
            f"acceptance: no server served for {m.unavailable_timeout:g} s; none of the "
            f"{m.total_jobs} prompts was measured"
        )
    if m.gave_up:
        m.warnings.append(
            f"every server failed for {m.unavailable_timeout:g} s: {m.left} of {m.total_jobs} "
            "prompts were not measured; the figures are of the measured ones"
        )
    result = _finish(config, store, servers, m, say)
    if m.gave_up:  # what was measured is kept (written above), and the command says it failed
        kept = f"; what was measured is in {store.key_url(ACCEPTANCE_FILE)}" if store else ""
        raise FleetError(
            f"acceptance: no server served for {m.unavailable_timeout:g} s; {m.left} of "
            f"{m.total_jobs} prompts were not measured{kept}"
        )
    return result


def _finish(
    config: AcceptanceConfig,
    store: Store | None,
    servers: list[SpecServer],
    m: Measurement,
    say: Log,
) -> Acceptance:
    """The measurement as a record, its warnings said, and its files written to ``store``."""
    by_domain = {
        d: DomainAcceptance.of(
            t.counts, prompts=t.prompts, failed=t.failed, output_tokens=t.output_tokens
        )
        for d, t in sorted(m.tallies.items())
    }
    total_counts = None
    for t in m.tallies.values():
        total_counts = t.counts if total_counts is None else total_counts.plus(t.counts)
    assert total_counts is not None
    total = DomainAcceptance.of(
        total_counts,
        prompts=sum(t.prompts for t in m.tallies.values()),
        failed=sum(t.failed for t in m.tallies.values()),
        output_tokens=sum(t.output_tokens for t in m.tallies.values()),
    )
    result = Acceptance(
        created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        model=next((s.model for s in servers if s.model), None),
        endpoints=[
            {
                "url": s.url,
                "engine": s.engine,
                "figures": "per_request" if s.per_request else "counters",
            }
            for s in servers
        ],
        settings={
            "prompts": config.prompts,
            "per_domain": config.per_domain,
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "seed": config.seed,
            "reasoning": config.reasoning,
        },
        by_domain=by_domain,
        total=total,
        warnings=m.warnings,
    )
    for w in m.warnings:
        say(f"warning: {w}")
    if store is not None:
        mix = suggest_mix({d: a.acceptance_rate for d, a in by_domain.items()}, config.min_share)
        store.put_new(ACCEPTANCE_FILE, msgspec.json.format(msgspec.json.encode(result)) + b"\n")
        doc = mix_document(mix, config.min_share, store.key_url(ACCEPTANCE_FILE))
        store.put_new(MIX_FILE, msgspec.json.format(msgspec.json.encode(doc)) + b"\n")
    return result
