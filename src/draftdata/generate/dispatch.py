"""The dispatcher: one shared queue of jobs over all endpoints, never stalled by one of them.

Policy, in the order the loop applies it:

- **Pull, not push.** Whenever an endpoint has a free slot the next job goes to the endpoint
  with the most free slots, then the fewest outstanding tokens (a job that shares a system
  prompt / tools with recent ones goes where its prefix is cached when that endpoint has room).
  There are no shards and no round-robin, so a slow server simply frees slots less often.
- **Longest expected first.** New jobs wait in a ``LookAhead`` (``length.py``): with
  ``order: length`` the one expected to answer longest goes first (the estimate is learned
  from the run's completions); retries and requeued jobs go before them.
- **Outcomes, by the type the client raised** (``draftdata.errors``; one method each):
  ``RetryableServerError`` (429/5xx/timeouts/resets/malformed bodies) waits a jittered
  exponential backoff (or the server's Retry-After) and then prefers another endpoint; after
  ``max_attempts`` the job becomes a Failure ``exhausted_retries``. ``FatalRequestError``
  (context length, invalid request) becomes a Failure of its ``reason`` at once.
  ``EndpointFaultError`` (a 401/403/404/405/501 refusal, or an impossible answer: over its
  size bound, impossible usage, ``bounds.py``) is the endpoint's fault: it is taken out at once
  (one log line saying why), its work is requeued elsewhere, and the refused attempt does not
  count against the prompt.
- **Taking an endpoint out, three actions.** ``open_breaker``: it failed
  ``breaker_failures`` retryable requests in a row; what runs there may finish, and a health
  check decides. ``take_out_dead``: it fails its health check (a connection error or a timeout
  triggers one) or serves another model; its in-flight copies are cancelled and their jobs
  requeued at once. ``take_out_faulty``: it refused or answered impossibly; likewise, free of
  charge. Each is probed every ``probe_interval`` until it answers (then re-admitted half-open:
  one more failure takes it out again).
- **Speed.** Whenever a clearly slower endpoint has a free slot, a ``TailPlan`` places each
  job where it is expected to finish first (a long draw of its length over the endpoint's
  per-sequence rate, after its next slot frees), holding a long job for a fast server rather
  than starting it on a slow one.
- **The tail.** When nothing is queued, a request running for
  at least ``hedge_min_age`` is copied onto a faster idle endpoint when ``hedge_pays``; the
  first copy to answer wins, the others are cancelled, and only the winner is committed.
- **Memory.** Prompts are read lazily (in a thread) only while fewer than ``window`` jobs are
  queued or running (twice the fleet's limits, plus the look-ahead when ordering).

Results go to a ``Sink`` (the engine buffers them in the Run). The HTTP conversation of an
attempt is the ``Caller``'s (``caller.py``); placement by speed and the hedge rule are
``placement.py``; endpoint probing and the concurrency controller live in ``endpoint.py``. This
module decides and holds no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from draftdata.errors import (
    ConnectionLostError,
    EndpointFaultError,
    FatalRequestError,
    ImpossibleAnswerError,
    MalformedAnswerError,
    RateLimitedError,
    RequestTimeoutError,
    ServerError,
)
from draftdata.generate.caller import Answer, Caller
from draftdata.generate.config import GenerateConfig
from draftdata.generate.endpoint import Endpoint
from draftdata.generate.length import LengthModel, LookAhead, prompt_tokens
from draftdata.generate.placement import TailPlan, hedge_pays, job_cap
from draftdata.generate.work import Copy, Job, completions, failures, plan
from draftdata.records import Completion, Failure, Prompt
from draftdata.tokens import turns_tokens

_AFFINITY_SIZE = 4096
_RETRY_PATIENCE_S = 2.0  # how long a retry waits for an endpoint other than the one it failed on


class Sink(Protocol):
    """Where finished records go (the engine: Run buffers plus the tally)."""

    def completion(self, c: Completion) -> None:
        """Take one completion."""

    def failure(self, f: Failure) -> None:
        """Take one failure."""


class Reader(Protocol):
    """Where jobs come from (``source.PromptReader``: a run's prompt files, read lazily)."""

    exhausted: bool
    invalid: int

    def take(self, k: int) -> Iterable[Prompt]:
        """Up to ``k`` more prompts (runs in a thread)."""
        ...


class AttemptCaller(Protocol):
    """What runs one attempt of a job on its endpoint (``caller.Caller``, the chat
    conversation, unless another is given: ``hidden-states --engine vllm`` sends one
    prefill-only request per sample through the same dispatcher)."""

    requests_ok: int
    clamped: int

    async def call(self, copy: Copy) -> Answer:
        """The attempt's answer, or the ``ServerError`` leaf it failed with."""
        ...


class Dispatcher:
    """Runs every job of ``reader`` over ``endpoints`` until all are settled or it is stopped.

    ``caller`` runs each attempt (default: generate's chat ``Caller``)."""

    def __init__(
        self,
        config: GenerateConfig,
        endpoints: list[Endpoint],
        reader: Reader,
        sink: Sink,
        *,
        model: str,
        is_done: Callable[[str, int], bool],
        check_alive: Callable[[Endpoint], Awaitable[bool]],
        revive: Callable[[Endpoint], Awaitable[None]],
        log: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        history: Callable[[], Iterable[tuple[str, str, int]]] | None = None,
        caller: AttemptCaller | None = None,
    ) -> None:
        self.cfg = config
        self.endpoints = endpoints
        self.reader = reader
        self.sink = sink
        self.model = model
        self.is_done = is_done
        self._check_alive = check_alive
        self._revive = revive
        self.log = log
        self.clock = clock
        self.rng = random.Random(seed)
        # talks HTTP for an attempt
        self.caller: AttemptCaller = caller or Caller(config, model=model, clock=clock)
        self._history = history
        self.lengths = LengthModel()
        # jobs read but never dispatched (longest expected first); ``ready`` holds the ones
        # that come back (retries due, requeued, split) and goes before them
        self.fresh = LookAhead(self.lengths, ordered=config.order == "length")
        self.ready: deque[Job] = deque()
        self.waiting: list[tuple[float, int, Job]] = []  # (ready at, seq, job): backoff heap
        self.running: dict[Job, None] = {}  # jobs with at least one live copy, oldest first
        self.on_endpoint: dict[Endpoint, set[Copy]] = {e: set() for e in endpoints}
        self.active: Counter[str] = Counter()  # prompt id -> unsettled jobs (duplicate ids)
        self.affinity: OrderedDict[str, Endpoint] = OrderedDict()
        self.wake = asyncio.Event()
        self.space = asyncio.Event()
        self.stopping = False
        self.paused = False  # set by the engine while the store holds too many records
        self.fed_all = False
        self._seq = itertools.count()
        self._checking: set[Endpoint] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # every live copy's task
        self._unmapped = 0
        # counters read by progress and the summary
        self._planned_settled = 0
        self.duplicates = 0
        self.retries = 0
        self.hedges = 0  # hedge copies sent
        self.hedges_won = 0  # ... whose answer was the one committed

    # -- the loop -----------------------------------------------------------------------------

    @property
    def window(self) -> int:
        """Jobs held in memory at most: twice the fleet's current limits, plus the look-ahead
        when jobs are ordered by expected length."""
        base = max(
            64, 2 * sum(e.concurrency.limit for e in self.endpoints if e.breaker.state != "down")
        )
        return base + (self.cfg.lookahead if self.fresh.ordered else 0)

    @property
    def pending(self) -> int:
        """Jobs queued, backing off or running."""
        return len(self.ready) + len(self.fresh) + len(self.waiting) + len(self.running)

    @property
    def hedges_wasted(self) -> int:
        """Hedge copies whose work was thrown away: the original answered first, the copy
        failed, or it was cancelled (not the ones still running)."""
        live = sum(1 for copies in self.on_endpoint.values() for c in copies if c.hedge)
        return self.hedges - self.hedges_won - live

    @property
    def queued(self) -> int:
        """Jobs waiting for an endpoint (not backing off, not running)."""
        return len(self.ready) + len(self.fresh)

    async def run(self) -> None:
        """Dispatch until every job is settled (or, once stopped, until nothing runs)."""
        if self._history is not None:
            self.spawn(self._seed(self._history))  # read beside the first requests, not before
        feeder = asyncio.create_task(self._feed())
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            while True:
                now = self.clock()
                if not self.stopping and not self.paused:
                    self._promote(now)
                    self._place(now)
                    if self.cfg.hedge and self.fed_all and not self.queued:
                        self._hedge(now)
                if feeder.done() and not feeder.cancelled() and feeder.exception():
                    raise feeder.exception()  # type: ignore[misc]
                if not self.running and (
                    self.stopping or (self.fed_all and not self.queued and not self.waiting)
                ):
                    return
                self.wake.clear()
                timeout = 0.25
                if self.waiting and not (self.stopping or self.paused):  # else nothing promotes
                    timeout = min(timeout, max(0.0, self.waiting[0][0] - now))
                # a timer instead of wait_for: no task per wake-up (this loop wakes per answer);
                # one that is still due before the deadline is kept (waking early is harmless),
                # so answers arriving in a burst do not each create and cancel one
                deadline = loop.time() + timeout
                if timer is None or timer.cancelled() or not loop.time() < timer.when() <= deadline:
                    if timer is not None:
                        timer.cancel()
                    timer = loop.call_at(deadline, self.wake.set)
                await self.wake.wait()
        finally:
            if timer is not None:
                timer.cancel()
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            background = list(self._background)
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    def stop(self) -> None:
        """Stop dispatching new work and retries; running copies may finish."""
        self.stopping = True
        self.wake.set()
        self.space.set()

    def abort(self) -> None:
        """Cancel every running copy (after ``stop``; their work is not committed)."""
        self.stop()
        for copies in self.on_endpoint.values():
            for copy in list(copies):
                if copy.task is not None:
                    copy.task.cancel()
                self._detach(copy)
        self.running.clear()

    async def _feed(self) -> None:
        while not self.reader.exhausted and not self.stopping:
            if self.pending >= self.window:
                self.space.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.space.wait(), 1.0)
                continue
            batch = await asyncio.to_thread(self._read, 128)
            now = self.clock()
            for pid, jobs in batch:
                if self.active[pid]:
                    self.duplicates += 1
                    continue
                for job in jobs:
                    job.ready_since = now
                    self.fresh.push(job)
                    self.active[pid] += 1
            self.wake.set()
        self.fed_all = not self.stopping
        self.wake.set()

    async def _seed(self, history: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        """Learn lengths from a resumed run's history: read in a thread, applied on the loop
        (the model is the loop's alone)."""
        try:
            rows = await asyncio.to_thread(lambda: list(history()))
        except Exception as exc:  # the history only speeds the schedule up: never fatal
            self.log(f"generate: could not read the run's earlier output lengths: {exc}")
            return
        for source, domain, tokens in rows:
            self.lengths.observe(source, domain, None, tokens)
        if rows:
            self.fresh.rekey()
            self.log(f"generate: output lengths seeded from {len(rows)} earlier completions")

    @property
    def already_done(self) -> int:
        """(prompt, sample) pairs settled before this command: skipped by the reader or here."""
        return self._planned_settled + int(getattr(self.reader, "settled_samples", 0))

    def _read(self, k: int) -> list[tuple[str, list[Job]]]:
        """(runs in a thread) the next prompts, planned, without the settled ones."""
        out = []
        for prompt in self.reader.take(k):
            jobs, settled = plan(prompt, self.cfg, self.is_done)
            self._planned_settled += settled
            if jobs:
                out.append((prompt.id, jobs))
        return out

    def _promote(self, now: float) -> None:
        while self.waiting and self.waiting[0][0] <= now:
            _, _, job = heapq.heappop(self.waiting)
            job.ready_since = now
            self.ready.appendleft(job)

    # -- placing ------------------------------------------------------------------------------

    def _place(self, now: float) -> None:
        rates = [e.meter.seq_rate for e in self.endpoints if e.accepting and e.meter.seq_rate]
        self.lengths.at(now, sum(rates) / len(rates) if rates else 0.0)
        held: list[Job] = []
        plan = TailPlan.make(self, now) if self.queued and self.cfg.tail_plan else None
        # with a plan, a job may be held for a faster server's next slot; look at no more jobs
        # than the fleet has slots (by then every fast slot has one promised)
        examine = sum(e.concurrency.limit for e in self.endpoints) + 64
        while self.ready or self.fresh:
            free = [
                e
                for e in self.endpoints
                if e.breaker.state == "up" and e.concurrency.limit > e.slots.inflight
            ]
            if not free or (plan is not None and len(held) >= examine):
                break
            job = self.ready.popleft() if self.ready else self.fresh.pop()
            ep = self._pick(job, free, now)
            if ep is not None and plan is not None:
                ep = plan.place(job, ep, self.lengths.expect_job(job))
            if ep is None:
                held.append(job)
                continue
            if len(job.samples) > 1 and not ep.server_n:
                self.active[job.prompt.id] += len(job.samples) - 1
                self.ready.extendleft(reversed(job.split()))
                continue
            self._launch(job, ep, hedge=False, now=now)
        self.ready.extendleft(reversed(held))

    def _pick(self, job: Job, free: list[Endpoint], now: float) -> Endpoint | None:
        cands = [e for e in free if e.url not in job.avoid]
        if not cands:
            others = any(e.accepting and e.url not in job.avoid for e in self.endpoints)
            if others and now - job.ready_since < _RETRY_PATIENCE_S:
                return None
            cands = free
        if job.prefix is not None:
            ep = self.affinity.get(job.prefix)
            if ep is not None and ep in cands:
                self.affinity.move_to_end(job.prefix)
                return ep
        best = max(cands, key=lambda e: (e.free, -e.slots.outstanding_tokens, -e.index))
        if job.prefix is not None:
            self.affinity[job.prefix] = best
            if len(self.affinity) > _AFFINITY_SIZE:
                self.affinity.popitem(last=False)
        return best

    def cap(self, job: Job) -> int:
        """The most output tokens one sample of ``job`` may take (``placement.job_cap``)."""
        return job_cap(job, self.endpoints)

    def _hedge(self, now: float) -> None:
        """Copy tail requests onto idle endpoints where the copy is expected to finish first
        (``hedge_pays``); only asked when nothing is queued, so the copies take idle slots."""
        min_age = self.cfg.hedge_min_age
        for job in list(self.running):
            if job.hedged or job.done or len(job.copies) != 1:
                continue
            first = job.copies[0]
            age = now - first.sent  # of the request running now, not of the conversation
            if age < min_age:
                continue
            free = [
                e for e in self.endpoints if e.accepting and e.free > 0 and e is not first.endpoint
            ]
            if not free:
                return
            ep = max(free, key=lambda e: (e.meter.seq_rate or 0.0, e.free, -e.index))
            expected = self.lengths.expect_job(job)
            if not hedge_pays(age, expected, self.cap(job), first.endpoint, ep, self.lengths):
                continue
            job.hedged = True
            self.hedges += 1
            self._launch(job, ep, hedge=True, now=now)

    def _launch(self, job: Job, ep: Endpoint, *, hedge: bool, now: float) -> None:
        seqs = len(job.samples)
        ep.acquire(seqs, job.cost)
        if not hedge:
            job.attempts += 1
            if job.attempts > 1:
                self.retries += 1
        copy = Copy(job, ep, hedge=hedge, seqs=seqs, started=now)
        self.lengths.started(job.prompt.source, job.prompt.domain, now)
        job.copies.append(copy)
        self.on_endpoint[ep].add(copy)
        self.running[job] = None
        copy.task = asyncio.create_task(self._attempt(copy))
        self.tasks.add(copy.task)
        copy.task.add_done_callback(self.tasks.discard)

    def _detach(self, copy: Copy) -> None:
        if copy.detached:
            return
        copy.detached = True
        self.lengths.stopped(copy.job.prompt.source, copy.job.prompt.domain, copy.started)
        copy.endpoint.release(copy.seqs, copy.job.cost)
        self.on_endpoint[copy.endpoint].discard(copy)
        job = copy.job
        if copy in job.copies:
            job.copies.remove(copy)
        if not job.copies:
            self.running.pop(job, None)
        self.wake.set()

    # -- one attempt and its outcome, by type ------------------------------------------------

    async def _attempt(self, copy: Copy) -> None:
        """Run one copy through the ``Caller`` and act on its outcome (once it is detached)."""
        outcome: Answer | ServerError
        try:
            outcome = await self.caller.call(copy)
        except ServerError as exc:
            outcome = exc
        except Exception as exc:  # a transport failure nobody mapped: retry it, say so once
            said = copy.endpoint.redact(f"{type(exc).__name__}: {exc}")
            if not self._unmapped:
                self.log(f"generate: unexpected {said} from {copy.endpoint.url}")
            self._unmapped += 1
            outcome = MalformedAnswerError(said)
        finally:
            self._detach(copy)
        match outcome:
            case Answer():
                self._succeeded(copy, outcome)
            case EndpointFaultError():
                self._endpoint_fault(copy, outcome)
            case FatalRequestError():
                self._request_failed(copy, outcome)
            case _:
                self._attempt_failed(copy, outcome)

    def _succeeded(self, copy: Copy, answer: Answer) -> None:
        """The first copy to answer wins: the others are cancelled, its records go out."""
        job, ep = copy.job, copy.endpoint
        if job.done:
            return
        job.done = True
        for other in list(job.copies):
            if other.task is not None:
                other.task.cancel()
            self._detach(other)
        if copy.hedge:
            self.hedges_won += 1
            ep.meter.hedges_won += 1
        per_sample = answer.per_sample
        p, prompt_len, cap = job.prompt, prompt_tokens(job), self.cap(job)
        for turns in per_sample:
            out = turns_tokens(turns)[0]  # usage, else token ids, else the text
            self.lengths.observe(p.source, p.domain, prompt_len, out, cap)
        samples = job.samples
        if len(per_sample) < len(samples):  # the server ignored n: ask for the rest one by one
            ep.server_n = False
            rest = job.with_samples(samples[len(per_sample) :])
            rest.ready_since = self.clock()
            self.active[job.prompt.id] += 1
            self.ready.appendleft(rest)
        latency = self.clock() - copy.started
        done = completions(
            job,
            per_sample,
            answer.body,
            endpoint=ep.url,
            latency=latency,
            stop_reason=answer.stop,
            model=ep.model,
            server_thinking=answer.server_thinking,
        )
        for c in done:
            self.sink.completion(c)
            ep.meter.completed += 1
        self._settle(job)

    def _attempt_failed(self, copy: Copy, err: ServerError) -> None:
        """A failure another attempt may not hit (``RetryableServerError``): the job is retried
        after a backoff, elsewhere if it can, up to ``max_attempts``; the endpoint's breaker
        counts it, and a connection error or a timeout has its health checked."""
        job, ep = copy.job, copy.endpoint
        opened = ep.record_failure(err.reason, retryable=True)
        if not opened and isinstance(err, ConnectionLostError | RequestTimeoutError):
            self.spawn(self._health_check(ep))
        if isinstance(err, RateLimitedError):
            ep.rate_limited()
        # (another copy still runs the job, or we are shutting down: resume redoes it)
        if not (job.done or job.copies or self.stopping):
            if job.attempts >= self.cfg.max_attempts:
                self._fail(job, "exhausted_retries", f"after {job.attempts} attempts: {err}", ep)
            else:
                self._retry_later(job, ep, err.retry_after)
        if opened:  # after the job is placed, so the line counts it among the retried ones
            self.open_breaker(ep, f"{ep.breaker.failures} failures in a row ({err})")

    def _request_failed(self, copy: Copy, err: FatalRequestError) -> None:
        """The request itself is bad (``FatalRequestError``): the prompt's Failure at once."""
        job, ep = copy.job, copy.endpoint
        ep.record_failure(err.reason, retryable=False)
        if not (job.done or job.copies or self.stopping):
            self._fail(job, err.reason, err.message, ep)

    def _endpoint_fault(self, copy: Copy, err: EndpointFaultError) -> None:
        """The endpoint refused or answered impossibly: take it out and move the job on, free
        of charge."""
        job, ep = copy.job, copy.endpoint
        ep.meter.errors[err.reason] += 1
        if not copy.hedge:
            job.attempts -= 1  # the endpoint's fault, not an attempt of the prompt
        requeued = 0
        if not (job.done or job.copies or self.stopping):
            self._requeue(job, ep)
            requeued = 1
        self.take_out_faulty(ep, err, moved=requeued)

    def _retry_later(self, job: Job, ep: Endpoint, retry_after: float | None) -> None:
        """Back ``job`` off (jittered, exponential, at least the server's Retry-After within
        ``backoff_max``), then steer it away from ``ep``."""
        delay = min(self.cfg.backoff_max, self.cfg.backoff_base * 2 ** (job.attempts - 1))
        delay *= 0.5 + self.rng.random()
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.cfg.backoff_max))
        job.avoid = {ep.url}
        heapq.heappush(self.waiting, (self.clock() + delay, next(self._seq), job))
        self.wake.set()

    def _requeue(self, job: Job, ep: Endpoint) -> None:
        """Put ``job`` back first in line, steered away from ``ep``."""
        job.avoid = {ep.url}
        job.ready_since = self.clock()
        self.ready.appendleft(job)

    def _fail(self, job: Job, reason: str, message: str, ep: Endpoint) -> None:
        for f in failures(job, reason, ep.redact(message), endpoint=ep.url):
            self.sink.failure(f)
        job.done = True
        self._settle(job)

    def _settle(self, job: Job) -> None:
        pid = job.prompt.id
        self.active[pid] -= 1
        if self.active[pid] <= 0:
            del self.active[pid]
        self.space.set()
        self.wake.set()

    # -- taking an endpoint out: one method per action ------------------------------------------

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run a background coroutine that ends with the dispatcher."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _health_check(self, ep: Endpoint) -> None:
        """Probe ``ep`` after a connection error or an opened breaker; if it does not answer,
        its in-flight copies are lost causes: cancel and requeue them now."""
        if ep in self._checking:
            return
        self._checking.add(ep)
        try:
            alive = await self._check_alive(ep)
        finally:
            self._checking.discard(ep)
        if not alive:
            self.take_out_dead(ep, "does not answer its health check")

    def open_breaker(self, ep: Endpoint, why: str) -> None:
        """``ep`` failed too many requests in a row: no new work for it, probed until it is
        back. What runs there may finish (a server that fails new requests may still finish
        old ones); a health check decides whether they are lost."""
        if ep.breaker.state == "down":
            return
        self._out(ep, why)
        self.spawn(self._health_check(ep))
        self._say_out(ep, why, moved=0, abandoned=0)

    def take_out_dead(self, ep: Endpoint, why: str) -> None:
        """``ep`` fails its health check (or serves another model): its in-flight copies are
        cancelled and their jobs requeued at once; probed until it is back."""
        was_up = ep.breaker.state != "down"
        moved, abandoned = self._cancel_copies(ep, uncharged=False)
        if was_up:
            self._out(ep, why)
        elif not (moved or abandoned):
            return
        self._say_out(ep, why, moved=moved, abandoned=abandoned)

    def take_out_faulty(self, ep: Endpoint, err: EndpointFaultError, *, moved: int = 0) -> None:
        """``ep`` refused a chat request or gave an impossible answer (``err``): out of
        service with a trial after a growing wait, its in-flight copies requeued at once and
        not charged to their prompts. Said once, not again when a trial is refused too.
        ``moved``: jobs the caller already requeued."""
        was_up = ep.breaker.state != "down"
        what = (
            "gives impossible answers"
            if isinstance(err, ImpossibleAnswerError)
            else "refuses chat requests"
        )
        where = f"HTTP {err.status}: " if err.status is not None else ""
        refusal = f"{where}{err.message}"[:300]
        news = ep.breaker.mark_refused(refusal, what)
        why = f"it {what} ({refusal})"
        cancelled, abandoned = self._cancel_copies(ep, uncharged=True)
        moved += cancelled
        if was_up:
            self._out(ep, why)
        elif not (moved or abandoned):
            return
        if news:
            self._say_out(ep, why, moved=moved, abandoned=abandoned)
        else:
            self.wake.set()

    def _out(self, ep: Endpoint, why: str) -> None:
        """Open the circuit of an endpoint that was up, and start probing it."""
        ep.breaker.mark_down(why)
        if not self.stopping:
            self.spawn(self._revive(ep))

    def _cancel_copies(self, ep: Endpoint, *, uncharged: bool) -> tuple[int, int]:
        """Cancel what runs on ``ep``; requeue each job no other copy runs (``uncharged``:
        its attempt does not count). Returns (requeued, abandoned because stopping)."""
        moved = abandoned = 0
        for copy in list(self.on_endpoint[ep]):
            if copy.task is not None:
                copy.task.cancel()
            self._detach(copy)
            job = copy.job
            if not job.done and not job.copies and not self.stopping:
                if uncharged and not copy.hedge:
                    job.attempts -= 1
                self._requeue(job, ep)
                moved += 1
            elif not job.done and not job.copies:
                abandoned += 1
        return moved, abandoned

    def _say_out(self, ep: Endpoint, why: str, *, moved: int, abandoned: int) -> None:
        self.log(f"endpoint {ep.url} taken out: {why}; {self._fates(ep, moved, abandoned)}")
        self.wake.set()

    def _fates(self, ep: Endpoint, moved: int, abandoned: int) -> str:
        """What became of the requests ``ep`` held when it was taken out, in a few words."""
        running = len(self.on_endpoint[ep])
        retried = sum(1 for _, _, job in self.waiting if ep.url in job.avoid)
        parts = []
        if moved:
            parts.append(f"{moved:,} requeued on the other endpoints")
        if retried:
            parts.append(f"{retried:,} failed there and are retried elsewhere after a backoff")
        if running:
            parts.append(
                f"{running:,} still running there (kept if they finish; retried elsewhere if "
                "they fail; requeued at once if it fails its health check)"
            )
        if abandoned:
            parts.append(
                f"{abandoned:,} abandoned (stopping: not committed, the same command generates "
                "them again)"
            )
        if not parts:
            return "no request of the run was in flight there"
        return "its requests: " + "; ".join(parts)
