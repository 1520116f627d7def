"""The dispatcher: one shared queue of jobs over all endpoints, never stalled by one of them.

It decides and holds no I/O; each decision is a part of its own:

- **the queue** (``queue.JobQueue``): retries and requeued jobs first, then the jobs read from
  the prompts, longest expected answer first within the look-ahead (``order: length``; the
  estimate is ``length.LengthModel``'s, from what was known before the run and what it
  learns), and the jobs backing off;
- **placement** (``placement.Placement``): pull, not push -- whenever an endpoint has a free
  slot the next job goes to the endpoint with the most free slots, then the fewest outstanding
  tokens (a prompt sharing a system prompt / tools with recent ones goes where its prefix is
  cached when that endpoint has room). No shards, no round-robin: a slow server simply frees
  slots less often. Near the end a clearly slower endpoint takes only jobs it can finish by the
  time the fleet is expected to (``placement.TailPlan``); when nothing is queued a tail request
  is copied onto a faster idle endpoint when the copy is expected to win (``hedge_pays``);
- **the retry policy** (``retry.RetryPolicy``): a failed attempt's fate by the error's type:
  ``RetryableServerError`` -> retry after a jittered backoff elsewhere, up to ``max_attempts``;
  ``FatalRequestError`` -> the prompt's Failure at once; ``EndpointFaultError`` -> the endpoint
  out, the job requeued uncharged;
- **the verdicts on refusals** (``opening.py``): a request refusal (a 400 that is no context
  length) is the prompt's only when no other endpoint that serves could answer it
  (``EndpointRefusals``): else the job is asked elsewhere, uncharged; an endpoint whose
  recent outcomes are mostly one refusal gets no new work while another serves, and is taken
  out (``take_out_refusing``) once a prompt it refused is answered elsewhere. The prompts'
  refusal records are held until the command's first jobs sent have ended
  (``OpeningCheck``); when one refusal ended most of them and none was answered (nor any
  job sent beside them) the run stops in one line quoting the server (``refused``) and
  nothing of them is recorded;
- **the canary** (``recheck.py``): after that, a prompt's refusal by every endpoint asked is
  held while those endpoints are asked again a request this command answered: answered, the
  records go out; refused, the fleet changed mid-run: the run stops in one line, nothing of
  the held records written.

What is left here is acting on them: the loop, launching and detaching copies, settling jobs,
and taking an endpoint out, four ways. ``open_breaker``: it failed ``breaker_failures``
retryable requests in a row; what runs there may finish, and a health check decides.
``take_out_dead``: it fails its health check (a connection error or a timeout triggers one) or
serves another model; its in-flight copies are cancelled and their jobs requeued at once.
``take_out_faulty``: it refused or answered impossibly; likewise, free of charge;
``take_out_refusing``: it refuses, with one 400, the requests the other endpoints answer; the
same. Each is probed until it answers (then re-admitted half-open: one more failure takes it
out again).

An exception that is no ``ServerError`` is not a server's answer but a bug (the client maps
every failure it knows, as httpx's ``map_httpcore_exceptions`` does, and lets the rest
through): the run stops at once with it, its traceback intact, after what finished is
committed (``run`` raises it); the same command resumes.

**Memory.** Prompts are read lazily (in a thread) only while fewer than ``window`` jobs are
queued or running (twice the fleet's limits, plus the look-ahead when ordering), and while the
prompts read ahead (queued or backing off, not running) hold fewer than ``lookahead_mib`` MiB
of prompt lines (``read_ahead_bytes``): 4,096 prompts of 50 KB each would be 200 MB.

Results go to a ``Sink`` (the engine buffers them in the Run). The HTTP conversation of an
attempt is the ``Caller``'s (``caller.py``); endpoint probing and the concurrency controller
live in ``endpoint.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from draftdata.errors import (
    ConnectionLostError,
    DraftdataError,
    EndpointFaultError,
    FleetUnavailableError,
    ImpossibleAnswerError,
    RateLimitedError,
    RequestTimeoutError,
    ServerError,
)
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.caller import Answer, Caller
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.length import LengthModel, LengthPriors, prompt_tokens
from draftdata.generate.engine.opening import (
    OTHER,
    EndpointRefusals,
    OpeningCheck,
    Refused,
    Stop,
    Verdict,
    is_refusal,
)
from draftdata.generate.engine.placement import Placement
from draftdata.generate.engine.queue import JobQueue
from draftdata.generate.engine.recheck import CANARY_PROMPTS, Changed, Recheck, ask_again
from draftdata.generate.engine.retry import Fail, MoveOn, Retry, RetryPolicy
from draftdata.generate.engine.work import Copy, Job, completions, failures, plan
from draftdata.records import Completion, Failure, Message, Prompt, Turn
from draftdata.shared.conversation import TurnLike
from draftdata.shared.tokens import turns_tokens

# an answered job and its first sample's turns: a canary, its last request (the messages are
# built when one is asked, ``_asked``, not on every answer)
Known = tuple[Job, Sequence[TurnLike]]

_FIRST_WINDOW_S = 0.5  # with lengths known at the start, wait this long at most for the window
_STALL_CHECK_S = 1.0  # how often endpoints are looked at for a stall (``_take_out_stalled``)
_STALL_SHARE = 10.0  # the answers a stalled endpoint's share of the others' would have been
_STALL_LATENCIES = 3.0  # ... and this many of the fleet's mean latencies without one


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

    def take_sized(self, k: int, max_bytes: int | None = None) -> list[tuple[Prompt, int]]:
        """Up to ``k`` more prompts and each one's size in bytes, fewer once they hold
        ``max_bytes`` (at least one); runs in a thread."""
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


class LengthFigures:
    """Per domain: answers committed, the output tokens expected of them when they were sent
    (with the estimates' standard errors), and the tokens they took (the run's figures show
    expected against measured)."""

    def __init__(self) -> None:
        # domain -> [answers, expected, standard error of expected, measured] (sums)
        self.by_domain: dict[str, list[float]] = {}

    def add(self, domain: str, expected: float, stderr: float, measured: int) -> None:
        """One committed answer."""
        row = self.by_domain.setdefault(domain, [0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += expected
        row[2] += stderr
        row[3] += measured

    def to_dict(self) -> dict[str, dict[str, float]]:
        """JSON-ready: domain -> ``answers``, ``expected`` (+ ``expected_se``) and ``measured``
        output tokens, sums over the answers."""
        return {
            d: {
                "answers": int(n),
                "expected": round(e, 1),
                "expected_se": round(se, 1),
                "measured": int(m),
            }
            for d, (n, e, se, m) in sorted(self.by_domain.items())
        }


class Dispatcher:
    """Runs every job of ``reader`` over ``endpoints`` until all are settled or it is stopped.

    ``caller`` runs each attempt (default: generate's chat ``Caller``); ``answered_before``
    reads a few prompts the run answered before this command (the canaries of a resumed
    command's opening, ``_ask_before_stopping``, and of a round of a shape this command
    answered none of, ``_canary``)."""

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
        priors: Callable[[], LengthPriors] | None = None,
        caller: AttemptCaller | None = None,
        answered_before: Callable[[], list[tuple[Prompt, list[Turn]]]] | None = None,
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
        self._priors = priors
        self.lengths = LengthModel()
        # its parts: the queue, placement, the retry policy (module docstring)
        self.queue = JobQueue(self.lengths, ordered=config.order == "length")
        self.placement = Placement(endpoints, self.lengths, hedge_min_age=config.hedge_min_age)
        self.policy = RetryPolicy(config, self.rng)
        self.opening = OpeningCheck()
        self.refusals = EndpointRefusals()
        self.recheck = Recheck()  # after the opening: a fleet that changed mid-run
        self._before = answered_before  # a few prompts the run answered before this command
        self._asking_before = False  # reading them, the opening's stop in suspense
        self._reading_before: asyncio.Future[None] | None = None  # read once (``_earlier``)
        # the canaries out, by round: each one's task -> (URL asked, sent at)
        self._canaries_out: dict[int, dict[asyncio.Future[None], tuple[str, float]]] = {}
        self._stall_check_at = 0.0  # the clock of the next look for stalled endpoints
        # answered requests, newest first: the canaries, of every shape and of each
        # (``_kind``); a conversation's is its last request (the history it was answered with)
        self._answered: deque[Known] = deque(maxlen=CANARY_PROMPTS)
        self._answered_kind: dict[str, deque[Known]] = {}
        # url -> jobs it refused since its last answer, asked elsewhere (its take-out line)
        self._asked_elsewhere: Counter[str] = Counter()
        self._by_url = {e.url: e for e in endpoints}
        self.running: dict[Job, None] = {}  # jobs with at least one live copy, oldest first
        self.on_endpoint: dict[Endpoint, set[Copy]] = {e: set() for e in endpoints}
        self.active: Counter[str] = Counter()  # prompt id -> unsettled jobs (duplicate ids)
        self._sizes: dict[str, int] = {}  # prompt id -> its line's bytes, while active
        self.held_bytes = 0  # bytes of the active prompts (read, not settled)
        self._running_pids: Counter[str] = Counter()  # prompt id -> its running jobs
        self.running_bytes = 0  # bytes of the prompts with a running job
        self.max_read_ahead = 0  # the most bytes read ahead at once (after each read)
        self.wake = asyncio.Event()
        self.space = asyncio.Event()
        self.stopping = False
        self.paused = False  # set by the engine while the store holds too many records
        self.fed_all = False
        self.bug: BaseException | None = None  # an unmapped exception: it stops the run
        self.refused: DraftdataError | None = None  # the opening check stopped the run
        self._seeded = priors is None  # what was known before the run is in the model
        self._checking: set[Endpoint] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # every live copy's task
        # counters read by progress and the summary
        self._planned_settled = 0
        self.duplicates = 0
        self.retries = 0
        self.hedges = 0  # hedge copies sent
        self.hedges_won = 0  # ... whose answer was the one committed
        self.figures = LengthFigures()

    # -- the loop -----------------------------------------------------------------------------

    @property
    def window(self) -> int:
        """Jobs held in memory at most: twice the fleet's current limits, plus the look-ahead
        when jobs are ordered by expected length."""
        base = max(
            64, 2 * sum(e.concurrency.limit for e in self.endpoints if e.breaker.state != "down")
        )
        return base + (self.cfg.lookahead if self.queue.ordered else 0)

    @property
    def pending(self) -> int:
        """Jobs queued, backing off or running."""
        return len(self.queue) + len(self.queue.waiting) + len(self.running)

    @property
    def read_ahead_bytes(self) -> int:
        """Bytes of the prompts read and not running: queued or backing off (the look-ahead
        the ``lookahead_mib`` bound holds)."""
        return self.held_bytes - self.running_bytes

    @property
    def hedges_wasted(self) -> int:
        """Hedge copies whose work was thrown away: the original answered first, the copy
        failed, or it was cancelled (not the ones still running)."""
        live = sum(1 for copies in self.on_endpoint.values() for c in copies if c.hedge)
        return self.hedges - self.hedges_won - live

    @property
    def queued(self) -> int:
        """Jobs waiting for an endpoint (not backing off, not running)."""
        return len(self.queue)

    @property
    def waiting(self) -> int:
        """Jobs backing off before their next attempt."""
        return len(self.queue.waiting)

    async def run(self) -> None:
        """Dispatch until every job is settled (or, once stopped, until nothing runs). An
        unmapped exception of an attempt (a bug) stops it and is raised here."""
        if self._priors is not None:
            self.spawn(self._seed(self._priors))  # read beside the first prompts
        feeder = asyncio.create_task(self._feed())
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        started = self.clock()
        try:
            while True:
                now = self.clock()
                if not self.stopping and not self.paused and self._first_window(now - started):
                    self.queue.promote(now)
                    self._place(now)
                    if self.cfg.hedge and self.fed_all and not self.queue:
                        self._hedge(now)
                    if now >= self._stall_check_at:
                        self._stall_check_at = now + _STALL_CHECK_S
                        self._take_out_stalled(now)
                if feeder.done() and not feeder.cancelled() and feeder.exception():
                    raise feeder.exception()  # type: ignore[misc]
                if self.opening.open and not self.running and self._all_settled():
                    self._judge(ended=True)
                if not self.running and (
                    self.stopping
                    or (self._all_settled() and not self.recheck.busy and not self._asking_before)
                ):
                    break
                self.wake.clear()
                timeout = 0.25 if self._seeded else 0.02
                due = self.queue.next_due()
                if due is not None and not (self.stopping or self.paused):  # else none promotes
                    timeout = min(timeout, max(0.0, due - now))
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
        if self.bug is not None:
            raise self.bug
        if self.refused is not None:
            raise self.refused

    def _all_settled(self) -> bool:
        """Every prompt read, nothing queued or backing off (running aside)."""
        return self.fed_all and not self.queue and not self.queue.waiting

    def checking(self) -> str | None:
        """What the command waits for when all that is left is the refusal check (canaries
        out, or the run's earlier answers being read for them): the progress views show it
        instead of an ETA (None: something else runs, or nothing is checked)."""
        if self.running or not self._all_settled():
            return None
        if self._asking_before:
            return "checking: reading answers of earlier commands to ask the servers again"
        # one look (a view may ask from another thread)
        out = [o for r in list(self._canaries_out.values()) for o in list(r.values())]
        if not out:
            return None
        urls = dict.fromkeys(u for u, _ in out)
        since = self.clock() - min(t for _, t in out)
        return (
            f"checking: {self.recheck.held:,} refused prompt(s) held while "
            f"{', '.join(self._by_url[u].name for u in urls)} "
            f"{'is' if len(urls) == 1 else 'are'} asked again a request answered before "
            f"(did the servers change?), {since:.0f} s"
        )

    def _first_window(self, since_start: float) -> bool:
        """Whether dispatch may start: at once, unless lengths known before the run (a
        pilot, a resumed run, prepare's figures) tell prompts apart (two domains or sources of
        different means: one domain's figure orders nothing); then once they are in the model
        and the look-ahead is read (or every prompt is), so the first requests are the longest
        (within ``_FIRST_WINDOW_S``)."""
        if not self.queue.ordered or since_start >= _FIRST_WINDOW_S:
            return True
        if self._seeded and not self.lengths.ranks():
            return True  # nothing known, or nothing known that orders one prompt before another
        if not self._seeded:
            return False
        full = self.read_ahead_bytes >= self.cfg.lookahead_mib << 20
        return self.fed_all or full or self.queue.fresh >= self.cfg.lookahead

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
        self._running_pids.clear()
        self.running_bytes = 0

    async def _feed(self) -> None:
        limit = self.cfg.lookahead_mib << 20
        while not self.reader.exhausted and not self.stopping:
            ahead = self.read_ahead_bytes
            if self.pending >= self.window or ahead >= limit:
                self.space.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.space.wait(), 1.0)
                continue
            batch = await asyncio.to_thread(self._read, 128, limit - ahead)
            now = self.clock()
            for pid, jobs, nbytes in batch:
                if self.active[pid]:
                    self.duplicates += 1
                    continue
                self._sizes[pid] = nbytes
                self.held_bytes += nbytes
                for job in jobs:
                    job.ready_since = now
                    self.queue.push(job)
                    self.active[pid] += 1
            self.max_read_ahead = max(self.max_read_ahead, self.read_ahead_bytes)
            self.wake.set()
        self.fed_all = not self.stopping
        self.wake.set()

    async def _seed(self, priors: Callable[[], LengthPriors]) -> None:
        """Take what is known of the lengths before the run (read in a thread, applied on the
        loop: the model is the loop's alone)."""
        try:
            known = await asyncio.to_thread(priors)
        except Exception as exc:  # the figures only speed the schedule up: never fatal
            self.log(f"generate: could not read the expected output lengths: {exc}")
            known = LengthPriors()
        finally:
            self._seeded = True
            self.wake.set()
        self.lengths.seed(known)
        if known:
            self.queue.rekey()
            self.log(f"generate: output lengths known from {', '.join(known.sources)}")

    @property
    def already_done(self) -> int:
        """(prompt, sample) pairs settled before this command: skipped by the reader or here."""
        return self._planned_settled + int(getattr(self.reader, "settled_samples", 0))

    def _read(self, k: int, max_bytes: int) -> list[tuple[str, list[Job], int]]:
        """(runs in a thread) the next prompts (at most ``max_bytes`` of them, but one),
        planned, without the settled ones, each with its size in bytes."""
        out = []
        for prompt, nbytes in self.reader.take_sized(k, max_bytes):
            jobs, settled = plan(prompt, self.cfg, self.is_done)
            self._planned_settled += settled
            if jobs:
                out.append((prompt.id, jobs, nbytes))
        return out

    # -- placing ------------------------------------------------------------------------------

    def _place(self, now: float) -> None:
        """Fill the free slots: fast endpoints take the queue's head, a slower one near the
        end the longest job it can finish in time (``TailPlan``)."""
        rates = [e.meter.seq_rate for e in self.endpoints if e.accepting and e.meter.seq_rate]
        # a request running where nothing was ever answered (a wedged server: /health passes)
        # tells nothing of its length: it is taken to have produced nothing, not what the
        # fleet's rate would have produced by now (its age grew its domain's estimate, and the
        # copy its hedge waits for: up to twice the cap's time)
        lanes = {e.index: e.meter.seq_rate or 0.0 for e in self.endpoints if e.accepting}
        self.lengths.at(now, sum(rates) / len(rates) if rates else 0.0, lanes)
        tail = None
        if self.queue and self.cfg.tail_plan:
            tail = self.placement.tail_plan(
                self.queue, self.on_endpoint, read_all=self.fed_all, now=now, hedge=self.cfg.hedge
            )
        held: list[Job] = []
        serving = self._in_service()
        while self.queue:
            free = [
                e
                for e in self.endpoints
                if e.breaker.state == "up"
                and e.concurrency.limit > e.slots.inflight
                and not self.refusals.held_out(e.url, serving)
            ]
            if not free:
                break
            open_ = [e for e in free if tail is None or tail.budget(e) is None]
            ep: Endpoint | None
            if open_ or tail is None:
                job = self.queue.pop()
                ep = self.placement.pick(job, open_, now)
            else:
                found = self.placement.fit(tail, self.queue, free, now)
                if found is None:
                    break  # nothing queued that a slower endpoint can finish in time
                job, ep = found
            if ep is None:
                held.append(job)
                continue
            if len(job.samples) > 1 and not ep.server_n:
                self.active[job.prompt.id] += len(job.samples) - 1
                parts = job.split()
                self.opening.split(job, list(parts))  # sent before: its parts end for it
                self.queue.put_back(parts)
                continue
            self._launch(job, ep, hedge=False, now=now)
        self.queue.put_back(held)

    def _hedge(self, now: float) -> None:
        """Send the copies ``Placement.hedges`` finds worth it (only asked when nothing is
        queued, so the copies take idle slots)."""
        serving = self._in_service()

        def usable(e: Endpoint) -> bool:
            return not self.refusals.held_out(e.url, serving)

        for job, ep in self.placement.hedges(list(self.running), now, usable):
            job.hedged = True
            self.hedges += 1
            self._launch(job, ep, hedge=True, now=now)

    def _launch(self, job: Job, ep: Endpoint, *, hedge: bool, now: float) -> None:
        seqs = len(job.samples)
        ep.acquire(seqs, job.cost)
        if not hedge:
            self.opening.sent(job)
            job.attempts += 1
            if job.attempts > 1:
                self.retries += 1
            if job.expected < 0:  # as it was when first sent
                job.expected = self.lengths.expect_job(job)
                p = job.prompt
                job.expected_se = job.expected * self.lengths.stderr(p.source, p.domain)
        copy = Copy(job, ep, hedge=hedge, seqs=seqs, started=now)
        copy.number = self.refusals.sent(ep.url)
        if not hedge:  # a copy is no other request of the prompt's source/domain
            p = job.prompt
            cap = self.placement.cap(job)
            self.lengths.started(p.source, p.domain, now, ep.index, cap, seqs)
        job.copies.append(copy)
        self.on_endpoint[ep].add(copy)
        if job not in self.running:
            self.running[job] = None
            pid = job.prompt.id
            self._running_pids[pid] += 1
            if self._running_pids[pid] == 1:
                self.running_bytes += self._sizes.get(pid, 0)
                self.space.set()  # no longer read ahead: room for more
        copy.task = asyncio.create_task(self._attempt(copy))
        self.tasks.add(copy.task)
        copy.task.add_done_callback(self.tasks.discard)

    def _tell(self, copy: Copy, outcome: object) -> None:
        """The refusal verdicts learn how ``copy``'s request came back (once)."""
        if not copy.told:
            copy.told = True
            self.refusals.came(copy.endpoint.url, copy.number, outcome)

    def _detach(self, copy: Copy) -> None:
        if copy.detached:
            return
        copy.detached = True
        self._tell(copy, OTHER)  # cancelled, unless its outcome was told
        if not copy.hedge:
            p = copy.job.prompt
            lane = copy.endpoint.index
            self.lengths.stopped(p.source, p.domain, copy.started, lane, copy.seqs)
        copy.endpoint.release(copy.seqs, copy.job.cost)
        self.on_endpoint[copy.endpoint].discard(copy)
        job = copy.job
        if copy in job.copies:
            job.copies.remove(copy)
        if not job.copies and job in self.running:
            del self.running[job]
            pid = job.prompt.id
            self._running_pids[pid] -= 1
            if self._running_pids[pid] <= 0:
                del self._running_pids[pid]
                self.running_bytes -= self._sizes.get(pid, 0)
        self.wake.set()

    # -- one attempt and its outcome ----------------------------------------------------------

    async def _attempt(self, copy: Copy) -> None:
        """Run one copy through the ``Caller`` and act on its outcome (once it is detached).
        Anything but an Answer or a ServerError is a bug: it stops the run (``_stop_on``)."""
        outcome: Answer | ServerError
        try:
            outcome = await self.caller.call(copy)
        except ServerError as exc:
            outcome = exc
        except Exception as exc:
            self._detach(copy)
            self._stop_on(exc, copy.endpoint)
            return
        try:  # a bug in acting on the outcome stops the run as one in the request would
            if isinstance(outcome, Answer):
                self._tell(copy, None)
            else:
                self._tell(copy, outcome.said if is_refusal(outcome) else OTHER)
            self._detach(copy)
            if isinstance(outcome, Answer):
                self._succeeded(copy, outcome)
            else:
                self._failed(copy, outcome)
        except Exception as exc:
            self._stop_on(exc, copy.endpoint, "acting on an answer of")

    def _stop_on(self, exc: BaseException, ep: Endpoint | None, doing: str = "talking to") -> None:
        """An exception nobody mapped (a bug): stop dispatching, cancel what runs, and let
        ``run`` raise it; what finished is committed by the engine, the same command resumes.
        ``doing``/``ep`` say where it came from (None: the dispatcher's own work)."""
        if self.bug is not None:
            return
        self.bug = exc
        where = f" while {doing} {ep.url}" if ep is not None else ""
        self.log(
            f"generate: stopped by an unexpected {type(exc).__name__}{where} "
            "(a bug, not a server fault; its traceback follows); what was committed is kept, "
            "run the same command to resume"
        )
        self.abort()

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
        p, prompt_len, cap = job.prompt, prompt_tokens(job), self.placement.cap(job)
        for turns in per_sample:
            out = turns_tokens(turns)[0]  # usage, else token ids, else the text
            self.lengths.observe(p.source, p.domain, prompt_len, out, cap)
            self.figures.add(p.domain, max(0.0, job.expected), job.expected_se, out)
        samples = job.samples
        if len(per_sample) < len(samples):  # the server ignored n: ask for the rest one by one
            ep.server_n = False
            rest = job.with_samples(samples[len(per_sample) :])
            rest.ready_since = self.clock()
            self.active[job.prompt.id] += 1
            self.queue.requeue(rest)
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
        self._known(job, per_sample[0] if per_sample else [])
        self._settle(job)
        if self.opening.open:
            self.opening.settled(job, answered=True)
            self._judge(ended=False)
        if self._asked_elsewhere:  # it answers: what it refused before is no longer news
            self._asked_elsewhere.pop(ep.url, None)
        for url, said in self.refusals.answered(ep.url, _saids(job.refused)):
            self.take_out_refusing(self._by_url[url], said)

    def _failed(self, copy: Copy, err: ServerError) -> None:
        """A failed attempt: the endpoint learns of it, and the retry policy says the job's
        fate (``retry.py``). The fate applies only when no other copy runs the job and the
        run is not stopping (the resume redoes it)."""
        job, ep = copy.job, copy.endpoint
        fate = self.policy.fate(job, err)
        opened = False
        if isinstance(fate, MoveOn):
            ep.meter.errors[err.reason] += 1
            if not copy.hedge:
                job.attempts -= 1  # the endpoint's fault, not an attempt of the prompt
        else:
            retryable = isinstance(fate, Retry) or fate.reason == "exhausted_retries"
            opened = ep.record_failure(err.reason, retryable=retryable)
            if retryable:
                if not opened and isinstance(err, ConnectionLostError | RequestTimeoutError):
                    self.spawn(self._health_check(ep))
                if isinstance(err, RateLimitedError):
                    ep.rate_limited()
        moved = 0
        verdict = None
        if is_refusal(err):  # whose fault: the endpoint's or the prompt's (opening.py)
            if not job.done:  # a hedge's refusal too: an answer elsewhere then tells of it
                job.refused.pop(ep.url, None)  # its latest refusal, last
                job.refused[ep.url] = err
            refusers = {**_saids(job.refused), ep.url: err.said}
            back = [
                e.url for e in self.endpoints if e.breaker.state != "up" and not e.breaker.refusal
            ]
            verdict = self.refusals.refused(ep.url, err.said, refusers, self._in_service(), back)
            if verdict.job == "later" and job.attempts >= self.cfg.max_attempts:
                verdict = Verdict("prompts", verdict.out)  # its tries are over
        if not (job.done or job.copies or self.stopping):
            match fate:
                case Retry(delay=delay):
                    job.avoid = {ep.url}
                    self.queue.later(job, self.clock() + delay)
                    self.wake.set()
                case Fail() if verdict is not None and verdict.job == "elsewhere":
                    self._ask_elsewhere(job, ep, hedge=copy.hedge)
                case Fail() if verdict is not None and verdict.job == "later":
                    job.avoid = set(job.refused)
                    self.queue.later(job, self.clock() + self.policy.backoff(job.attempts, None))
                    self.wake.set()
                case Fail() if verdict is not None:  # quoting the refuser in best standing
                    by = self._by_url[self.refusals.witness(_saids(job.refused))]
                    quoted = job.refused[by.url]
                    self._fail(job, quoted.reason, quoted.message, by, err=quoted)
                case Fail(reason=reason, message=message):
                    self._fail(job, reason, message, ep, err=err)
                case MoveOn():
                    self._requeue(job, ep)
                    moved = 1
        if isinstance(err, EndpointFaultError):
            self.take_out_faulty(ep, err, moved=moved)
        elif opened:  # after the job is placed, so the line counts it among the retried ones
            self.open_breaker(ep, f"{ep.breaker.failures} failures in a row ({err})")
        for url, said in verdict.out if verdict is not None else ():
            self.take_out_refusing(self._by_url[url], said)

    def held_out(self, ep: Endpoint) -> bool:
        """Whether ``ep`` is up but gets no new work now (``EndpointRefusals.held_out``)."""
        return self.refusals.held_out(ep.url, self._in_service())

    def _in_service(self) -> list[str]:
        """The URLs of the endpoints that take work now."""
        return [e.url for e in self.endpoints if e.breaker.state == "up"]

    def _ask_elsewhere(self, job: Job, ep: Endpoint, *, hedge: bool) -> None:
        """``ep`` refused ``job`` while another endpoint may answer it: requeue it first in
        line, away from every endpoint that refused it, the attempt not charged to the prompt
        (``opening.EndpointRefusals``)."""
        if not hedge:
            job.attempts -= 1
        self._requeue(job, ep)
        job.avoid = set(job.refused)
        self._asked_elsewhere[ep.url] += 1

    def _requeue(self, job: Job, ep: Endpoint) -> None:
        """Put ``job`` back first in line, steered away from ``ep``."""
        job.avoid = {ep.url}
        job.ready_since = self.clock()
        self.queue.requeue(job)

    def _fail(
        self, job: Job, reason: str, message: str, ep: Endpoint, *, err: ServerError | None = None
    ) -> None:
        records = failures(job, reason, ep.redact(message), endpoint=ep.url)
        job.done = True
        if err is not None and is_refusal(err):
            where = tuple(job.refused) or (ep.url,)
            refused = Refused(err.said, where, records, _kind(job))
            if self.opening.open:
                self.opening.refused(job, refused)  # held until the verdict
            else:
                self._refusal(refused)
        else:
            for f in records:
                self.sink.failure(f)
            self.opening.settled(job, answered=False)
        self._settle(job)
        if self.opening.open:
            self._judge(ended=False)

    def _judge(self, *, ended: bool) -> None:
        """Act on the opening check's verdict: stop the run on one refusal of most of the
        first requests (nothing of them recorded), else write the records it held. A command
        resuming a run first asks the fleet again what the run answered before (its few
        prompts left may be prompts every server refuses: stopping on them, every next
        command would stop the same way and the run could never end)."""
        verdict = self.opening.verdict(ended=ended, resumed=self.already_done > 0)
        if isinstance(verdict, Stop):
            held, self.opening.held = self.opening.held, []
            if (
                self._before is not None
                and self.already_done > 0
                and held
                and isinstance(self.caller, Caller)
            ):
                self._asking_before = True
                self.spawn(self._ask_before_stopping(verdict, held))
            else:
                self._stop_for(verdict)
        elif verdict:
            for refused in verdict:
                self._refusal(refused)

    def _stop_for(self, why: Stop | Changed) -> None:
        """Stop the run on a refusal of the whole fleet: one line, nothing held recorded."""
        if self.refused is None and self.bug is None:
            self.refused = FleetUnavailableError(why.message())
            self.abort()

    async def _ask_before_stopping(self, stop: Stop, held: list[Refused]) -> None:
        """The opening's ``stop`` in a resumed command: read a few prompts the run answered
        before (in a thread), then let the canaries decide (``_refusal``); with none, stop."""
        try:
            await self._earlier()
            if self.stopping:
                return
            if not self._answered:
                self._stop_for(stop)
                return
            for refused in held:
                self._refusal(refused)
        finally:
            self._asking_before = False
            self.wake.set()

    async def _earlier(self) -> None:
        """Read a few prompts the run answered before this command (in a thread, once) and
        know each as a canary, older than this command's (``_known``). Every caller waits for
        the one reading; a caller cancelled (a settled round's other canary) leaves it be."""
        if self._before is None:
            return
        if self._reading_before is None:
            self._reading_before = self.spawn(self._read_earlier(self._before))
        await asyncio.shield(self._reading_before)

    async def _read_earlier(self, before: Callable[[], list[tuple[Prompt, list[Turn]]]]) -> None:
        try:
            prompts = await asyncio.to_thread(before)
        except Exception as exc:  # a figure to ask with, never the run's error
            self.log(f"generate: could not read the run's earlier answers: {exc}")
            prompts = []
        for prompt, turns in prompts:
            jobs, _ = plan(prompt, self.cfg, lambda _pid, _s: False)
            if jobs:
                self._known(jobs[0], turns, older=True)

    def _refusal(self, refused: Refused) -> None:
        """A prompt's refusal by every endpoint asked: its records are held while those in
        service are asked again a request this command answered (``recheck.py``: did the
        fleet change?), or written at once when nothing was answered yet or none serves."""
        serving = set(self._in_service())
        where = [u for u in refused.endpoints if u in serving]
        if not (where and self._answered and isinstance(self.caller, Caller)):
            for f in refused.records:
                self.sink.failure(f)
            return
        self.recheck.hold(refused.said, where, refused.records, refused.kind)
        self._send_canaries()

    def _known(self, job: Job, turns: Sequence[TurnLike], *, older: bool = False) -> None:
        """``job`` was answered with ``turns`` (its first sample's): a canary to come, its
        last request (``older``: before the ones known). A conversation's later requests
        carry what its first does not (the target's turns, tool calls and their results): a
        fleet that turned to refuse those answers first requests still. So a conversation
        that stopped after its first turn (cut by the token limit, its next request too long)
        counts as an older one: it takes the place of no conversation asked with history.
        A job of another caller than the chat ``Caller`` (hidden states' prefills: no chat
        request, no plan) is no canary: none is asked of it."""
        if not (len(job.plan) and isinstance(self.caller, Caller)):
            return
        ask = (job, turns)
        older = older or (job.multi_turn and _last(job, turns) == 0)
        kind = self._answered_kind.setdefault(_kind(job), deque(maxlen=CANARY_PROMPTS))
        for known in (self._answered, kind):
            if not older:
                known.appendleft(ask)
            elif len(known) < CANARY_PROMPTS:
                known.append(ask)

    def _canaries(self, kind: str) -> list[Known]:
        """The answered jobs a round of prompts of shape ``kind`` asks again: of that shape
        where the run answered one (this command, else for a resumed one an earlier command:
        a template that turned to refuse tools still answers plain prompts), else of any."""
        return list(self._answered_kind.get(kind) or self._answered)

    def _asked(self, job: Job, turns: Sequence[TurnLike]) -> list[Message]:
        """The messages of ``job``'s last request answered with ``turns``: a canary's."""
        keep = self.cfg.keep_reasoning_history
        return job.plan.context(_last(job, turns), turns, keep_reasoning=keep)

    def _send_canaries(self) -> None:
        """Send the canaries of the rounds due (``Recheck.due``)."""
        if self.stopping:
            return
        for number, url in self.recheck.due():
            task = self.spawn(self._canary(number, self._by_url[url]))
            self._canaries_out.setdefault(number, {})[task] = (url, self.clock())

    async def _canary(self, number: int, ep: Endpoint) -> None:
        """Ask ``ep`` again what this command had answered, and act on the round's verdict
        (``recheck.py``): write its held records, or stop the run (nothing of them recorded)."""
        assert isinstance(self.caller, Caller)
        caller = self.caller
        try:
            if self.recheck.kind_of(number) not in self._answered_kind:
                # none of its shape answered by this command: a resumed one asks what the
                # run answered before (its plain prompts answered, a template that turned to
                # refuse conversations' history would be taken for bad conversations)
                await self._earlier()
            outcome = await ask_again(
                lambda known: caller.ask_again(known[0], ep, self._asked(*known)),
                self._canaries(self.recheck.kind_of(number)),
                refusal=is_refusal,
                backoff=lambda tries: self.policy.backoff(tries, None),
            )
        except Exception as exc:  # no server's answer: a bug (``_attempt``)
            self._stop_on(exc, ep)
            return
        finally:
            if (me := asyncio.current_task()) is not None:
                self._canaries_out.get(number, {}).pop(me, None)
        verdict = self.recheck.came(number, ep.url, outcome)
        if verdict is not None:  # the round is settled: its other canaries tell nothing more
            for task in self._canaries_out.pop(number, {}):
                task.cancel()  # (a hung server's would hold the run up to 3 x 120 s)
        if isinstance(verdict, Changed):
            self._stop_for(verdict)
        elif verdict is not None:
            for f in verdict:
                self.sink.failure(f)
            self._send_canaries()  # the round that waited for this one
        self.wake.set()

    def _settle(self, job: Job) -> None:
        pid = job.prompt.id
        self.active[pid] -= 1
        if self.active[pid] <= 0:
            del self.active[pid]
            self.held_bytes -= self._sizes.pop(pid, 0)
        self.space.set()
        self.wake.set()

    # -- taking an endpoint out: one method per action ------------------------------------------

    def spawn(self, coro: Awaitable[None]) -> asyncio.Future[None]:
        """Run a background coroutine that ends with the dispatcher; an exception it raises
        (a bug: each maps the servers' faults itself) stops the run (``_stop_on``), never
        left for the garbage collector to print."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._spawned_ended)
        return task

    def _spawned_ended(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        self.task_ended(task)

    def task_ended(self, task: asyncio.Future[Any]) -> None:
        """A task of the run ended: one that raised (a bug) stops the run (``_stop_on``)."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._stop_on(exc, None)
            self.wake.set()

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
        what = (
            "gives impossible answers"
            if isinstance(err, ImpossibleAnswerError)
            else "refuses chat requests"
        )
        self._take_out_faulty(ep, err.said, what, moved=moved)

    def _take_out_stalled(self, now: float) -> None:
        """Take out an endpoint that stopped answering while the others answer: it holds
        requests, answered none for ``stall_after`` seconds and three of the fleet's mean
        latencies (since its last answer, or since its oldest request was sent, whichever is
        later), while the other serving endpoints answered so many that its share of them, by
        the requests each holds, would have been ``_STALL_SHARE`` or more. A server that
        wedged (a scheduler deadlock: its ``/health`` passes) held its requests until the
        read timeout (an hour by default), then was re-admitted by its health check and
        wedged the next ones. Its requests are requeued uncharged; it gets a trial request
        after a growing wait (``_take_out_faulty``). The tail of a run (few requests, long
        answers) never meets the share."""
        serving = [e for e in self.endpoints if e.breaker.serving]
        if not serving:
            return
        latencies = [e.meter.latency for e in serving if e.meter.latency]
        patience = max(
            self.cfg.stall_after,
            _STALL_LATENCIES * sum(latencies) / len(latencies) if latencies else 0.0,
        )
        for ep in self.endpoints:  # one re-admitted on probation too: it may wedge again
            copies = self.on_endpoint[ep]
            if ep.breaker.state != "up" or not copies:
                continue
            last = ep.meter.last_answer
            first = min(c.sent for c in copies)
            since = first if last is None else max(last, first)
            quiet = now - since
            if quiet < patience:
                continue
            others = [e for e in serving if e is not ep]
            answered = sum(e.meter.answers_since(since) for e in others)
            running = sum(len(self.on_endpoint[e]) for e in others)
            if answered * len(copies) / max(1, running) < _STALL_SHARE:
                continue
            said = (
                f"no answer in {quiet:.0f} s while holding {len(copies):,} request(s); the "
                f"other endpoints answered {answered:,} meanwhile"
            )
            self._take_out_faulty(ep, said, "stopped answering")

    def take_out_refusing(self, ep: Endpoint, said: str) -> None:
        """``ep`` refuses, with the same answer ``said``, the requests the other endpoints
        answer (``opening.EndpointRefusals``): taken out like one that refuses chat requests
        (``take_out_faulty``), the line quoting its refusal."""
        moved = self._asked_elsewhere.pop(ep.url, 0)  # what it refused went there already
        what = "refuses the requests the other endpoints answer"
        self._take_out_faulty(ep, said, what, moved=moved)

    def _take_out_faulty(self, ep: Endpoint, said: str, what: str, *, moved: int = 0) -> None:
        """Out of service for what it ``said`` (``what`` it does), with a trial after a growing
        wait; its in-flight copies requeued uncharged; said once (``take_out_faulty``)."""
        was_up = ep.breaker.state != "down"
        refusal = said[:300]
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
        running = len(self.on_endpoint[ep])
        retried = sum(1 for job in self.queue.backing_off() if ep.url in job.avoid)
        others = sum(1 for e in self.endpoints if e is not ep and e.breaker.accepting)
        said = fates(
            moved=moved, retried=retried, running=running, abandoned=abandoned, others=others
        )
        self.log(f"endpoint {ep.url} taken out: {why}; {said}")
        self.wake.set()


def _last(job: Job, turns: Sequence[TurnLike]) -> int:
    """The index of ``job``'s last request that ``turns`` answered (0: its first)."""
    return max(0, min(len(turns), len(job.plan)) - 1)


def _kind(job: Job) -> str:
    """A job's shape for the canaries (``recheck.py``): with tools or not, one turn or more."""
    return ("tools" if job.prompt.tools else "plain") + ("-multi" if job.multi_turn else "")


def _saids(refused: dict[str, ServerError]) -> dict[str, str]:
    """A job's refusals as the verdicts take them: endpoint URL -> the server's answer."""
    return {url: err.said for url, err in refused.items()}


def fates(*, moved: int, retried: int, running: int, abandoned: int, others: int) -> str:
    """What became of the requests an endpoint held when it was taken out, in a few words:
    ``moved`` requeued at once, ``retried`` failed there and backing off, ``running`` still
    running there, ``abandoned`` because the run is stopping; ``others``: the endpoints that
    take work now besides it (none: the requests wait for one to, and the line says so)."""
    parts = []
    elsewhere = "elsewhere" if others else "when an endpoint serves again"
    if moved:
        where = "on the other endpoints" if others else "(no other endpoint takes work now)"
        parts.append(f"{moved:,} requeued {where}")
    if retried:
        parts.append(f"{retried:,} failed there and are retried {elsewhere} after a backoff")
    if running:
        parts.append(
            f"{running:,} still running there (kept if they finish; retried {elsewhere} if "
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
