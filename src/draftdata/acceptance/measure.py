"""Running prompts on speculative servers and attributing what the drafter got right to domains.

Each server is probed first (``probe_spec``): SGLang reports its speculative algorithm in
``/server_info`` and gives per-request figures (``return_spec_tokens_details``); vLLM exposes
``vllm:spec_decode_*`` counters in ``/metrics``. A server with neither does not decode
speculatively and is refused in one line.

Attribution: per-request figures (SGLang) are added to the request's domain directly, so any
schedule works. Counters (vLLM) are global to the server, so the measurement isolates domains in
time: the prompts are cut into *chunks* of one domain each, every server works on one chunk at a
time (many requests at once, all of the chunk's domain), reads its counters before sending the
chunk and after its last answer, and adds the difference to that domain. Nothing else is sent
to a server meanwhile; the server's own generated-token counter is compared with the tokens the
chunk's answers report, and a difference (another client on the same server) is a warning that
names the server and the domain. Chunks of different domains run on different servers at once.

Failures are waited out as generate waits them out, with generate's parts and settings
(``GenerateConfig``'s defaults): a request that fails for a server fault (a 503, a reset, a
timeout) is retried after generate's backoff (``retry.backoff``), up to ``max_attempts``; each
server has generate's circuit breaker (``breaker.Breaker``: ``breaker_failures`` failures in a
row open it). A server whose breaker opens, or that refuses or dies, is taken out: its chunk
goes back to the queue for the others and its counts are thrown away (no partial chunk is
attributed); it is then probed as generate's reviver probes (``keeper.probe_pause``: every
0.2 s at first, a restart of seconds) and takes chunks again once it answers. The measurement
gives up only when no server has been serving for ``unavailable_timeout`` seconds; what it
measured until then is kept (``left`` says how many prompts were not). A prompt that fails for
its own reason (too long), or after every attempt, is counted as failed.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from draftdata.errors import EndpointFaultError, FatalRequestError, FleetError, ServerError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.breaker import Breaker
from draftdata.generate.engine.client import EndpointClient
from draftdata.generate.engine.endpoint import check_alive
from draftdata.generate.engine.keeper import probe_pause
from draftdata.generate.engine.retry import backoff
from draftdata.shared.endpoints import base_url, parse_prometheus, probe_capacity
from draftdata.shared.speculation import SpecCounts, from_sglang, from_vllm_metrics

Log = Callable[[str], None]
POLICY = GenerateConfig()  # generate's retry, breaker and probe settings, as it has them
GENERATED = "vllm:generation_tokens_total"


WARMUP_MAX_TOKENS = 8  # the output limit of the warm-up request ``probe_spec`` sends


@dataclass(frozen=True)
class Job:
    """One request to send: a prompt's first request, already a chat body but for the model."""

    id: str
    domain: str
    body: dict[str, Any]
    max_tokens: int | None = None  # the limit the body carries (the answer's size bound)


@dataclass
class SpecServer:
    """A server that decodes speculatively, and how its figures are read. ``url`` is the form
    every message, table and file shows (a password masked); ``address`` the one requests go
    to."""

    url: str
    address: str
    engine: str
    model: str | None
    per_request: bool  # SGLang's per-request details; else vLLM's global counters
    capacity: int | None
    client: EndpointClient = field(repr=False)
    breaker: Breaker = field(default_factory=lambda: Breaker(POLICY.breaker_failures))


@dataclass
class DomainTally:
    """What one domain has accrued so far."""

    counts: SpecCounts = field(default_factory=SpecCounts)
    prompts: int = 0
    failed: int = 0
    output_tokens: int = 0


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str] | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return resp.status, await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


async def read_counters(
    session: aiohttp.ClientSession, url: str
) -> tuple[SpecCounts, float] | None:
    """vLLM's spec-decode counters and its generated-token counter, or None."""
    got = await _get(session, base_url(url) + "/metrics")
    if got is None or got[0] != 200:
        return None
    counts = from_vllm_metrics(got[1])
    if counts is None:
        return None
    return counts, parse_prometheus(got[1]).get(GENERATED, 0.0)


async def probe_spec(
    session: aiohttp.ClientSession, client: EndpointClient, warmup: dict[str, Any]
) -> SpecServer:
    """Find out whether ``client``'s server decodes speculatively; FleetError (one line) when
    it does not answer or does not. ``warmup`` is a tiny request body: vLLM may list its
    counters only after its first speculative step."""
    address, url = client.base_url, client.shown
    cap = await probe_capacity(session, address)
    if cap is None:
        raise FleetError(f"acceptance: {url} does not answer (/v1/models)")
    if cap.engine == "sglang":
        got = await _get(session, address + "/server_info")
        info: Any = None
        if got is not None and got[0] == 200:
            try:
                info = msgspec.json.decode(got[1])
            except msgspec.DecodeError:
                info = None
        algo = info.get("speculative_algorithm") if isinstance(info, dict) else None
        if not algo:
            raise FleetError(
                f"acceptance: {url} (SGLang) does not decode speculatively "
                "(/server_info speculative_algorithm is null); start it with a draft model, "
                "e.g. --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFTER"
            )
        return SpecServer(url, address, "sglang", cap.model, True, cap.max_running, client)
    if await read_counters(session, address) is None:
        body = {**warmup, "model": cap.model} if cap.model else dict(warmup)
        try:
            await client.chat_json(body, max_tokens=WARMUP_MAX_TOKENS)
        except ServerError as exc:
            raise FleetError(f"acceptance: {url} does not serve a chat request ({exc})") from exc
        if await read_counters(session, address) is None:
            raise FleetError(
                f"acceptance: {url} does not decode speculatively (no vllm:spec_decode_* "
                "counters in /metrics); start vLLM with --speculative-config, e.g. "
                '\'{"method": "eagle3", "model": DRAFTER, "num_speculative_tokens": 3}\''
            )
    return SpecServer(url, address, cap.engine, cap.model, False, cap.max_running, client)


def chunks(jobs: list[Job], size: int) -> list[list[Job]]:
    """The jobs cut into chunks of one domain each, the domains taking turns (so servers work
    on different domains at once), each domain's prompts in their given order."""
    by_domain: dict[str, list[Job]] = collections.defaultdict(list)
    for job in jobs:
        by_domain[job.domain].append(job)
    per_domain = {
        d: [js[i : i + size] for i in range(0, len(js), size)] for d, js in by_domain.items()
    }
    out: list[list[Job]] = []
    rounds = max((len(c) for c in per_domain.values()), default=0)
    for r in range(rounds):
        for d in sorted(per_domain):
            if r < len(per_domain[d]):
                out.append(per_domain[d][r])
    return out


class Measurement:
    """The measurement over a set of servers (module docstring); ``run`` returns the tallies."""

    def __init__(
        self,
        servers: list[SpecServer],
        session: aiohttp.ClientSession,
        *,
        concurrency: int | None,
        log: Log,
        unavailable_timeout: float = POLICY.unavailable_timeout,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servers = servers
        self.session = session
        self.concurrency = concurrency
        self.log = log
        self.tallies: dict[str, DomainTally] = collections.defaultdict(DomainTally)
        self.warnings: list[str] = []
        self.queue: collections.deque[list[Job]] = collections.deque()
        self.done_jobs = 0
        self.total_jobs = 0
        self.in_flight = 0  # chunks being measured now
        self.changed = asyncio.Event()  # a chunk finished or came back, or a server did
        self.unavailable_timeout = unavailable_timeout
        self.clock = clock
        self.rng = random.Random()
        self.none_serving_since: float | None = None  # every server out since then
        self.gave_up = False  # no server served for unavailable_timeout: the rest is left
        self.left = 0  # prompts not measured (when it gave up)
        for server in servers:  # each answered its probe: in service
            server.breaker.mark_up(half_open=False)

    def width(self, server: SpecServer) -> int:
        """Requests in flight on ``server`` at once."""
        cap = server.capacity or 16
        return max(1, min(cap, self.concurrency) if self.concurrency else min(cap, 64))

    async def run(self, chunk_list: list[list[Job]]) -> dict[str, DomainTally]:
        """Measure every chunk, waiting out servers that fail (module docstring); when no
        server served for ``unavailable_timeout`` seconds, stop with what is measured
        (``gave_up``, ``left``)."""
        self.queue.extend(chunk_list)
        self.total_jobs = sum(len(c) for c in chunk_list)
        await asyncio.gather(*(self._worker(s) for s in self.servers))
        self.left = sum(len(c) for c in self.queue)
        return dict(self.tallies)

    def _finished(self) -> bool:
        return self.gave_up or (not self.queue and self.in_flight == 0)

    async def _worker(self, server: SpecServer) -> None:
        # A worker with nothing to take stays while another server's chunk is in flight: that
        # server may die and put its chunk back, and a live server must be there to take it.
        while not self._finished():
            if not self.queue:
                self.changed.clear()
                await self.changed.wait()
                continue
            chunk = self.queue.popleft()
            self.in_flight += 1
            try:
                await self._chunk(server, chunk)
            except EndpointFaultError as exc:  # it stopped answering during the chunk
                self.queue.appendleft(chunk)
                server.breaker.mark_down(exc.message)
                self.log(
                    f"acceptance: {server.url} taken out ({exc.said}); its chunk goes "
                    "elsewhere; it is probed until it answers again"
                )
            finally:
                self.in_flight -= 1
                self.changed.set()
            if server.breaker.state == "down":
                await self._revive(server)

    def _serving(self) -> bool:
        """Whether a server takes work; notes since when none does."""
        if any(s.breaker.state == "up" for s in self.servers):
            self.none_serving_since = None
            return True
        if self.none_serving_since is None:
            self.none_serving_since = self.clock()
        return False

    async def _revive(self, server: SpecServer) -> None:
        """Probe ``server`` (out of service) as generate's reviver does until it answers (it
        takes chunks again, half-open), the work is done, or no server served for
        ``unavailable_timeout`` seconds (``gave_up``)."""
        since = self.clock()
        while not self._finished():
            if not self._serving():
                out = self.clock() - (self.none_serving_since or since)
                if out >= self.unavailable_timeout:
                    self.gave_up = True
                    self.changed.set()
                    return
            await asyncio.sleep(probe_pause(self.clock() - since, POLICY.probe_interval))
            if await check_alive(self.session, server.address, min(5.0, POLICY.connect_timeout)):
                server.breaker.mark_up(half_open=True)
                self._serving()
                self.log(f"acceptance: {server.url} is back; it takes chunks again")
                self.changed.set()
                return

    async def _chunk(self, server: SpecServer, chunk: list[Job]) -> None:
        domain = chunk[0].domain
        before = None
        if not server.per_request:
            before = await read_counters(self.session, server.address)
            if before is None:
                raise EndpointFaultError("its /metrics counters cannot be read")
        sem = asyncio.Semaphore(self.width(server))
        got = await asyncio.gather(
            *(self._one(server, job, sem) for job in chunk), return_exceptions=True
        )
        for r in got:  # every request has ended: none is left running on a dead server
            if isinstance(r, BaseException):
                raise r
        results = [r for r in got if not isinstance(r, BaseException)]
        tally = DomainTally()
        for answered, tokens, counts in results:
            if answered:
                tally.prompts += 1
                tally.output_tokens += tokens
                if counts is not None:
                    tally.counts = tally.counts.plus(counts)
            else:
                tally.failed += 1
        if before is not None:
            after = await read_counters(self.session, server.address)
            if after is None:
                raise EndpointFaultError("its /metrics counters cannot be read")
            tally.counts = after[0].minus(before[0])
            generated = after[1] - before[1]
            if generated and abs(generated - tally.output_tokens) > max(8, 0.01 * generated):
                self.warnings.append(
                    f"{server.url}: generated {generated:,.0f} tokens while measuring {domain} "
                    f"but its answers hold {tally.output_tokens:,}: another client used the "
                    "server, so this domain's counts are mixed"
                )
        total = self.tallies[domain]
        total.counts = total.counts.plus(tally.counts)
        total.prompts += tally.prompts
        total.failed += tally.failed
        total.output_tokens += tally.output_tokens
        self.done_jobs += len(chunk)

    async def _one(
        self, server: SpecServer, job: Job, sem: asyncio.Semaphore
    ) -> tuple[bool, int, SpecCounts | None]:
        body = {**job.body, "model": server.model} if server.model else dict(job.body)
        if server.per_request:
            body["return_spec_tokens_details"] = True
        breaker = server.breaker
        async with sem:
            for attempt in range(1, POLICY.max_attempts + 1):
                if breaker.state != "up":  # another request of the chunk took it out
                    raise EndpointFaultError(breaker.fault or "taken out")
                try:
                    answer = await server.client.chat_json(body, max_tokens=job.max_tokens)
                except EndpointFaultError:
                    raise  # refused, impossible answers: the server's fault, out at once
                except ServerError as exc:
                    if isinstance(exc, FatalRequestError):
                        return False, 0, None  # the prompt's own (too long)
                    if breaker.failure(retryable=True):
                        raise EndpointFaultError(
                            f"{breaker.failures} failures in a row, the last {exc}"
                        ) from exc
                    if attempt < POLICY.max_attempts:
                        await asyncio.sleep(backoff(attempt, exc.retry_after, POLICY, self.rng))
                    continue
                breaker.success()
                usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
                tokens = int((usage or {}).get("completion_tokens") or 0)
                return True, tokens, from_sglang(answer) if server.per_request else None
        return False, 0, None  # failed at every attempt, the server still serving others
