"""The dispatcher: one shared queue of jobs over all endpoints, never stalled by one of them.

Policy, in the order the loop applies it:

- **Pull, not push.** Whenever an endpoint has a free slot the next job goes to the endpoint
  with the most free slots, then the fewest outstanding tokens (a job that shares a system
  prompt / tools with recent ones goes where its prefix is cached when that endpoint has room).
  There are no shards and no round-robin, so a slow server simply frees slots less often.
- **Longest expected first.** New jobs wait in a ``LookAhead`` (``length.py``): with
  ``order: length`` the one expected to answer longest goes first (the estimate is learned
  from the run's completions); retries and requeued jobs go before them.
- **Retries** of 429/5xx/timeouts/resets/malformed bodies wait a jittered exponential backoff
  (or the server's Retry-After) and then prefer another endpoint; after ``max_attempts`` the
  job becomes a Failure ``exhausted_retries``. Context-length and invalid-request errors become
  a Failure of that class at once.
- **Endpoint refusals.** A 401/403/404/405/501 answer, or an impossible one (over its size
  bound, impossible usage: ``bounds.py``), is the endpoint's fault (``EndpointRefusedError``):
  it is taken out at once (one log line saying why), its work is requeued elsewhere, and the
  refused attempt does not count against the prompt.
- **Endpoint loss.** A connection error triggers a health check; an endpoint that fails it, or
  fails ``breaker_failures`` requests in a row, is taken out, its in-flight copies are cancelled
  and their jobs requeued at once, and it is probed every ``probe_interval`` until it answers
  (then re-admitted half-open: one more failure takes it out again).
- **Speed.** Whenever a clearly slower endpoint has a free slot, a ``TailPlan`` places each
  job where it is expected to finish first (a long draw of its length over the endpoint's
  per-sequence rate, after its next slot frees), holding a long job for a fast server rather
  than starting it on a slow one.
- **The tail.** When nothing is queued, a request running for
  at least ``hedge_min_age`` is copied onto a faster idle endpoint when ``hedge_pays``; the
  first copy to answer wins, the others are cancelled, and only the winner is committed.
- **Memory.** Prompts are read lazily (in a thread) only while fewer than ``window`` jobs are
  queued or running (twice the fleet's limits, plus the look-ahead when ordering).

Results go to a ``Sink`` (the engine buffers them in the Run). Endpoint probing and the
concurrency controller live in ``endpoint.py``; this module holds no I/O but the chat calls.
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
from typing import Any, Protocol

from draftdata.conversation import STOP_CONTEXT, turn_message
from draftdata.errors import EndpointRefusedError
from draftdata.generate.client import ErrorClass, RequestError, build_body
from draftdata.generate.config import GenerateConfig
from draftdata.generate.endpoint import Endpoint
from draftdata.generate.length import LengthModel, LookAhead, prompt_tokens, token_cap
from draftdata.generate.limits import MIN_LIMIT, OutputLimit
from draftdata.generate.source import PromptReader
from draftdata.generate.work import Copy, Job, completions, failures, plan
from draftdata.records import Completion, Failure, Turn

_AFFINITY_SIZE = 4096
_RETRY_PATIENCE_S = 2.0  # how long a retry waits for an endpoint other than the one it failed on


class Sink(Protocol):
    """Where finished records go (the engine: Run buffers plus the tally)."""

    def completion(self, c: Completion) -> None:
        """Take one completion."""

    def failure(self, f: Failure) -> None:
        """Take one failure."""


class Dispatcher:
    """Runs every job of ``reader`` over ``endpoints`` until all are settled or it is stopped."""

    def __init__(
        self,
        config: GenerateConfig,
        endpoints: list[Endpoint],
        reader: PromptReader,
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
        self.requests_ok = 0
        self.retries = 0
        self.hedges = 0  # hedge copies sent
        self.hedges_won = 0  # ... whose answer was the one committed
        self.clamped = 0  # answered requests sent with less than max_tokens, to fit the context

    # -- the loop -----------------------------------------------------------------------------

    @property
    def window(self) -> int:
        """Jobs held in memory at most: twice the fleet's current limits, plus the look-ahead
        when jobs are ordered by expected length."""
        base = max(64, 2 * sum(e.limit for e in self.endpoints if e.state != "down"))
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
        rates = [e.seq_rate for e in self.endpoints if e.accepting and e.seq_rate]
        self.lengths.at(now, sum(rates) / len(rates) if rates else 0.0)
        held: list[Job] = []
        plan = TailPlan.make(self, now) if self.queued and self.cfg.tail_plan else None
        # with a plan, a job may be held for a faster server's next slot; look at no more jobs
        # than the fleet has slots (by then every fast slot has one promised)
        examine = sum(e.limit for e in self.endpoints) + 64
        while self.ready or self.fresh:
            free = [e for e in self.endpoints if e.state == "up" and e.limit > e.inflight]
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
        best = max(cands, key=lambda e: (e.free, -e.outstanding_tokens, -e.index))
        if job.prefix is not None:
            self.affinity[job.prefix] = best
            if len(self.affinity) > _AFFINITY_SIZE:
                self.affinity.popitem(last=False)
        return best

    def cap(self, job: Job) -> int:
        """The most output tokens one sample of ``job`` may take: its ``--max-tokens``, or with
        the context-filling default (``limits.py``) the largest context in the fleet."""
        cap = token_cap(job)
        if job.max_tokens is None:
            cap = max(cap, max((e.context_length or 0 for e in self.endpoints), default=0))
        return cap

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
            ep = max(free, key=lambda e: (e.seq_rate or 0.0, e.free, -e.index))
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

    # -- one attempt --------------------------------------------------------------------------

    async def _attempt(self, copy: Copy) -> None:
        error: RequestError | None = None
        result: list[list[Turn]] = []
        body: dict[str, Any] = {}
        stop: str | None = None
        try:
            result, body, stop = await self._converse(copy)
        except RequestError as exc:
            error = exc
        except Exception as exc:  # a transport failure nobody mapped: retry it, say so once
            said = copy.endpoint.redact(f"{type(exc).__name__}: {exc}")
            if not self._unmapped:
                self.log(f"generate: unexpected {said} from {copy.endpoint.url}")
            self._unmapped += 1
            error = RequestError(ErrorClass.malformed, said)
        finally:
            self._detach(copy)
        if error is not None:
            self._failed(copy, error)
        else:
            self._succeeded(copy, result, body, stop)

    async def _converse(self, copy: Copy) -> tuple[list[list[Turn]], dict[str, Any], str | None]:
        """The copy's requests, one per remaining turn (``conversation.TurnPlan``): the turns
        of each sample, the last request body, and why the conversation stopped before its
        last request (None when it did not). A later request that does not fit the context
        (no room left by the estimate, or the server's context-length answer) stops the
        conversation with ``context``, keeping the turns that fit."""
        job, ep = copy.job, copy.endpoint
        if not len(job.plan):
            raise RequestError(ErrorClass.invalid_request, "the prompt has no turn to answer")
        turns = list(job.turns)
        keep = self.cfg.keep_reasoning_history
        answered: dict[str, Any] | None = None  # the body of the last answered request
        body: dict[str, Any] = {}
        strict = self.cfg.strict_limit
        limit = OutputLimit(job.max_tokens, ep, job.prompt.tools, strict=strict)  # limits.py
        for t in range(len(turns), len(job.plan)):
            messages = job.plan.context(t, turns, keep_reasoning=keep)
            body = build_body(
                messages,
                tools=job.prompt.tools,
                model=self.cfg.model or ep.model or self.model,
                max_tokens=limit.limit(messages),
                sampling=job.request_sampling,
                reasoning=job.reasoning,
                n=len(job.samples),
                token_ids=self.cfg.token_ids != "off",
                extra_body=self.cfg.extra_body,
            )
            room = limit.room(messages) if turns and not strict else None
            if room is not None and room < MIN_LIMIT:  # the history alone fills the context
                return [turns], answered or body, STOP_CONTEXT
            sent = copy.sent = self.clock()
            try:
                got, body = await limit.send(body)
            except RequestError as exc:
                if turns and exc.error_class is ErrorClass.context_length:
                    return [turns], answered or body, STOP_CONTEXT
                raise
            answered = body
            self.requests_ok += 1
            self.clamped += limit.clamped
            ep.record_success(
                got[0].usage.completion_tokens
                if len(got) == 1
                else sum(x.usage.completion_tokens for x in got),
                got[0].usage.prompt_tokens,
                latency=self.clock() - sent,
                seqs=len(got),
            )
            limit.answered(messages, got[0])
            if not job.multi_turn:
                return [[x] for x in got], body, None
            turns.append(got[0])
            stop = job.plan.stop_reason(t, got[0])
            if stop is not None:  # the turn broke the conversation: keep what we have
                return [turns], body, stop
            limit.carried([*messages, turn_message(got[0], keep_reasoning=keep)])
            if job.copies == [copy]:  # the only copy: checkpoint for a retry
                job.turns = list(turns)
        return [turns], body, None

    def _succeeded(
        self,
        copy: Copy,
        per_sample: list[list[Turn]],
        body: dict[str, Any],
        stop: str | None = None,
    ) -> None:
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
            ep.hedges_won += 1
        p, prompt_len, cap = job.prompt, prompt_tokens(job), self.cap(job)
        for turns in per_sample:
            out = sum(t.usage.completion_tokens for t in turns)
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
            body,
            endpoint=ep.url,
            latency=latency,
            stop_reason=stop,
            model=ep.model,
        )
        for c in done:
            self.sink.completion(c)
            ep.completed += 1
        self._settle(job)

    def _failed(self, copy: Copy, err: RequestError) -> None:
        job, ep = copy.job, copy.endpoint
        if isinstance(err, EndpointRefusedError):
            self._refused(copy, err)
            return
        retryable = not err.fatal
        opened = ep.record_failure(err.error_class.value, retryable=retryable)
        if not opened and err.error_class in (ErrorClass.connection, ErrorClass.timeout):
            self.spawn(self._health_check(ep))
        if err.error_class == ErrorClass.rate_limited:
            ep.rate_limited()
        job.last_error = err
        # (another copy still runs the job, or we are shutting down: resume redoes it)
        if not (job.done or job.copies or self.stopping):
            if err.fatal:
                self._fail(job, err.error_class.value, err.message, ep)
            elif job.attempts >= self.cfg.max_attempts:
                self._fail(job, "exhausted_retries", f"after {job.attempts} attempts: {err}", ep)
            else:
                delay = min(self.cfg.backoff_max, self.cfg.backoff_base * 2 ** (job.attempts - 1))
                delay *= 0.5 + self.rng.random()
                if err.retry_after is not None:
                    delay = max(delay, min(err.retry_after, self.cfg.backoff_max))
                job.avoid = {ep.url}
                heapq.heappush(self.waiting, (self.clock() + delay, next(self._seq), job))
                self.wake.set()
        if opened:  # after the job is placed, so the line counts it among the retried ones
            self.take_down(ep, f"{ep.consecutive_failures} failures in a row ({err})")

    def _refused(self, copy: Copy, err: RequestError) -> None:
        """The endpoint refused: take it out and move the job on, free of charge."""
        job, ep = copy.job, copy.endpoint
        ep.errors[err.error_class.value] += 1
        if not copy.hedge:
            job.attempts -= 1  # the endpoint's fault, not an attempt of the prompt
        requeued = 0
        if not (job.done or job.copies or self.stopping):
            job.avoid = {ep.url}
            job.ready_since = self.clock()
            self.ready.appendleft(job)
            requeued = 1
        where = f"HTTP {err.status}: " if err.status is not None else ""
        what = "gives impossible answers" if err.error_class is ErrorClass.impossible else None
        self.take_down(
            ep, f"{where}{err.message}"[:300], dead=True, refusal=what or True, moved=requeued
        )

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

    # -- endpoint health ----------------------------------------------------------------------

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
            self.take_down(ep, "does not answer its health check", dead=True)

    def take_down(
        self,
        ep: Endpoint,
        why: str,
        *,
        dead: bool = False,
        refusal: bool | str = False,
        moved: int = 0,
    ) -> None:
        """Open the circuit: no new work for ``ep``, probed until it is back. ``dead`` (its
        health check failed): its in-flight copies are cancelled and requeued at once; else
        they may finish (a server that fails new requests may still finish old ones) and a
        health check decides. ``refusal``: ``why`` is the refusal ("HTTP 401: ..."); said
        once, not again when a trial re-admission is refused too (their requeued copies do
        not count as attempts); a string instead of True says what it does ("gives impossible
        answers"; default "refuses chat requests"). ``moved``: jobs the caller already
        requeued."""
        was_up = ep.state != "down"
        what = refusal if isinstance(refusal, str) else "refuses chat requests"
        news = ep.mark_refused(why, what) if refusal else True
        if refusal:
            why = f"it {what} ({why})"
        abandoned = 0
        if dead:
            for copy in list(self.on_endpoint[ep]):
                if copy.task is not None:
                    copy.task.cancel()
                self._detach(copy)
                job = copy.job
                if not job.done and not job.copies and not self.stopping:
                    if refusal and not copy.hedge:
                        job.attempts -= 1
                    job.avoid = {ep.url}
                    job.ready_since = self.clock()
                    self.ready.appendleft(job)
                    moved += 1
                elif not job.done and not job.copies:
                    abandoned += 1
        if was_up:
            ep.mark_down(why)
            if not self.stopping:
                self.spawn(self._revive(ep))
            if not dead:
                self.spawn(self._health_check(ep))
        elif not (moved or abandoned):
            return
        if news:
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


# -- placement by expected finish time -------------------------------------------------------

_SPEED_GAP = 1.5  # per-sequence rates closer than this: greedy placement is as good
_BUSY_S = 1e-3  # the least time a busy slot is expected to stay busy
_HEDGE_Q = 0.9  # hedges are judged on this quantile of the length (a long draw)
BLIND_HEDGE_S = 60.0  # with no endpoint measured yet, a tail request this old is copied


def hedge_pays(
    age: float, expected: float, cap: int, origin: Endpoint, target: Endpoint, lengths: LengthModel
) -> bool:
    """Whether a copy on ``target`` of a request running on ``origin`` for ``age`` s is
    expected to answer before the original, for a long draw of its length.

    The original has produced about ``age * rate`` tokens. Hedges are only sent when nothing
    is queued, so what ends the job is the requests that turn out long: the copy must win
    when the length is a long draw given what is produced (the 90th percentile of the learnt
    spread above it, ``LengthModel.long_total``, at most the token cap), the draw the
    ``TailPlan`` places by too. A request past its cap by half again is stuck (a hung request,
    a server that slowed down): any copy beats it. The copy starts from nothing, so it pays
    only on a server that decodes enough faster: the whole length at the target's rate
    against what is left at the origin's. On an origin that has never answered (no rate, no
    latency: a server that passes its health check but never answers, or trickles), the copy
    pays once the request has run twice what the target needs for a long draw (three times its
    latency; ``BLIND_HEDGE_S`` when no endpoint has answered yet).
    """
    r_o, r_t = origin.seq_rate, target.seq_rate
    if r_o is None or r_o <= 0:
        if origin.latency is not None:
            return age > 3 * origin.latency
        # never answered (a wedged server passes /health too): judged by the target, a copy
        # pays once the original has run twice what the target needs for a long draw
        if r_t is not None and r_t > 0:
            return age > 2 * max(1.0, lengths.long_total(expected, 0.0, cap, _HEDGE_Q)) / r_t
        if target.latency is not None:
            return age > 3 * target.latency
        return age > BLIND_HEDGE_S  # nothing measured anywhere: the copy takes an idle slot
    produced = age * r_o
    if produced > 1.5 * cap:
        return True
    if r_t is None or r_t <= r_o:
        return False
    total = max(
        lengths.expected_total(expected, produced, cap),
        lengths.long_total(expected, produced, cap, _HEDGE_Q),
    )
    left = total - produced
    if left <= 0:
        return False
    return total / r_t < left / r_o


class TailPlan:
    """Placement by expected finish time, made whenever a slower server has a free slot: each
    job (longest expected first) goes where it is expected to finish first -- a free slot now,
    or a faster server's slot that frees soon. Long answers go to fast servers, the slow ones
    take the short answers, and no long answer starts on a slow server at the end of the job.

    Every endpoint's slots are a heap of the times (from now) they are expected to free: 0 for
    a free slot, for a busy one what its copy is expected to have left at the endpoint's
    per-sequence rate (``LengthModel.expected_total``, given what it has produced). A job takes
    the slot that minimises free time + its length / that endpoint's rate (a long draw: its
    estimate times the 90th percentile of the learnt spread, since a long answer on a slow
    server is what ends a job late); if that
    slot is free now the job goes there, else it is held for it (and the slot counts as taken
    by it, so the next job plans around it). With similar rates everywhere this is plain greedy
    placement, so the plan is only made when the per-sequence rates differ by ``_SPEED_GAP``.
    """

    def __init__(
        self, slots: dict[Endpoint, list[float]], rates: dict[Endpoint, float], high: float
    ) -> None:
        self.slots = slots
        self.rates = rates
        self.high = high

    @classmethod
    def make(cls, d: Dispatcher, now: float) -> TailPlan | None:
        """The plan for ``d``'s fleet now, or None where greedy placement is as good: when all
        rates are not known yet, or no endpoint slower than the fastest has a free slot (a
        free slot on a fast server is always the place to go)."""
        up = [e for e in d.endpoints if e.accepting]
        rates = {e: e.seq_rate for e in up}
        if len(up) < 2 or any(r is None or r <= 0 for r in rates.values()):
            return None
        known: dict[Endpoint, float] = {e: r for e, r in rates.items() if r is not None}
        fastest, slowest = max(known.values()), min(known.values())
        if not any(e.free > 0 and _SPEED_GAP * r < fastest for e, r in known.items()):
            return None
        # far from the end of the job a long answer on a slow server is harmless (it ends
        # before the rest does): plan only once the queue drains sooner than the longest
        # queued answer would take on the slowest server
        high = d.lengths.high_ratio()
        drain = d.queued * d.lengths.mean / sum(r * e.limit for e, r in known.items())
        longest = max(d.fresh.longest(), d.lengths.mean) * high
        if drain > longest / slowest:
            return None
        slots: dict[Endpoint, list[float]] = {}
        for e in up:
            heap = [0.0] * max(0, e.free)
            rate = known[e]
            for copy in d.on_endpoint[e]:
                job = copy.job
                produced = (now - copy.started) * rate
                total = d.lengths.expected_total(d.lengths.expect_job(job), produced, d.cap(job))
                # a busy slot is never free now, even for a copy past its expected length
                left = max(_BUSY_S, (total - produced) / rate)
                heap.extend([left] * copy.seqs)
            heapq.heapify(heap)
            slots[e] = heap
        return cls(slots, known, high)

    def place(self, job: Job, pick: Endpoint, expected: float) -> Endpoint | None:
        """Where ``job`` goes now: ``pick`` (greedy's choice) or another free endpoint, or None
        to hold it for a faster server's next free slot."""
        best: tuple[float, int, Endpoint] | None = None
        # plan for a long draw (the 90th percentile of the learnt spread): lengths are
        # long-tailed, and a long answer on a slow server is what ends a job late
        length = expected * self.high
        for e, heap in self.slots.items():
            if not heap or (e.url in job.avoid and e is not pick):
                continue
            finish = heap[0] + length / self.rates[e]
            if best is None or (finish, e is not pick) < best[:2]:
                best = (finish, int(e is not pick), e)
        if best is None:
            return pick
        finish, _, ep = best
        start = heapq.heapreplace(self.slots[ep], finish)
        if start > 0:
            return None
        return ep
