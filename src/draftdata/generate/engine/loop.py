"""The engine: dispatcher, commits, probes, progress and shutdown on one event loop.

``Engine.run`` drives a ``Dispatcher`` over ready ``Endpoint``s and an open ``Run`` and, beside
it, a few small loops: the committer (``committer.py``: ``Run.flush`` in a worker thread when it
is due, through store outages), the load watcher (the server's running/waiting every
``load_interval`` s feeds each endpoint's concurrency controller), the reviver (a taken-out
endpoint is probed every 0.2 s for its first 30 s out, then every ``probe_interval`` s, and
re-admitted with its full probed capacity at once; a refusing one gets a trial after a growing
wait), the watch (below), the progress display or log line, and the
metrics snapshots.

The watch, every 0.25 s, says each change of state in one line:

- **Store outage.** While more than ``max_uncommitted`` records wait for the store, dispatch is
  paused; when they are committed, it resumes (the committer retries; nothing is dropped).
- **No endpoint can serve.** When no endpoint is serving for ``unavailable_timeout`` s (or at
  once, when every endpoint refuses chat requests and none has answered), the run stops with one
  line per endpoint saying why and raises FleetUnavailableError; the same command resumes.
- **``--token-ids on``** and an endpoint found (after start) to return no ids: ConfigError.

A bug in the commit path stops the run at once (RunAbortedError, one line, resumable). An
exception an attempt raised that nobody mapped (a bug, not a server fault) stops it too: what
finished is committed, and ``run`` raises that exception with its traceback (resumable). When
one request refusal ends most of the first requests (``opening.py``), the dispatcher stops the
run with one line quoting the server, and none of those refusals is recorded.

Shutdown (``interrupt``): the first call stops dispatch and lets running requests finish for up
to ``grace_seconds``; the second (or the end of the grace) cancels them. Either way whatever
finished is committed before ``run`` returns, and a rerun of the same command resumes. The
grace period bounds the stop: a store that refuses writes is retried until it ends (or a second
interrupt), then the run stops with what is uncommitted left for the resume to generate again.

``run_engine`` is the async entry point for scripts and benchmarks that already hold a Run and
endpoints; ``stage.generate`` is the plain function that builds them from a GenerateConfig.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp
from rich.console import Console
from rich.live import Live

from draftdata.errors import ConfigError, DraftdataError, FleetUnavailableError, StoreError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.client import token_ids_refusal
from draftdata.generate.engine.committer import Committer
from draftdata.generate.engine.dispatch import Dispatcher
from draftdata.generate.engine.endpoint import Endpoint, load_of
from draftdata.generate.engine.keeper import EndpointKeeper
from draftdata.generate.engine.length import known_lengths
from draftdata.generate.engine.progress import Progress
from draftdata.generate.prompts.source import PromptReader
from draftdata.generate.summary import EndpointShare, GenerateSummary, Tally
from draftdata.records import Completion, Failure, Prompt, Turn
from draftdata.store.base import Store
from draftdata.store.read import newest_completions
from draftdata.store.run import Run
from draftdata.support.gc_tuning import fewer_collections
from draftdata.support.progress import REFRESH_PER_SECOND

Log = Callable[[str], None]

# rows of the newest completions shard a resumed command reads for its canaries (the dispatcher
# keeps recheck.CANARY_PROMPTS of each shape): a few of each shape where the shard holds them
EARLIER_ANSWERS = 64


def probe_session(api_key: str | None) -> aiohttp.ClientSession:
    """The session for health/capacity/load probes (with the API key when there is one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return aiohttp.ClientSession(headers=headers)


def stderr_log(line: str) -> None:
    """The default log: a timestamped line on stderr."""
    print(time.strftime("%H:%M:%S ") + line, file=sys.stderr, flush=True)


class _Sink:
    """Dispatcher results -> Run buffers (+ the tally, for what the Run accepted).

    ``settle_model``: the run's model was not given; a new run records the model of the
    endpoint that wrote its first completion (``Run.settle``: its manifest is not written yet).
    """

    def __init__(self, run: Run, tally: Tally, *, settle_model: bool = False) -> None:
        self.run = run
        self.tally = tally
        self.settle_model = settle_model and not run.manifest_written

    def completion(self, c: Completion) -> None:
        if self.settle_model and c.model:
            self.settle_model = False
            self.run.settle(model=c.model)
        if self.run.add_completion(c):
            self.tally.completion(c)

    def failure(self, f: Failure) -> None:
        if self.run.add_failure(f):
            self.tally.failure(f)


class Engine:
    """One generate run over ``endpoints`` into ``run`` (see the module docstring)."""

    def __init__(
        self,
        config: GenerateConfig,
        run: Run,
        endpoints: list[Endpoint],
        reader: PromptReader,
        *,
        model: str,
        session: aiohttp.ClientSession,
        total: int | None = None,
        log: Log = stderr_log,
        live: bool = False,
        clock: Callable[[], float] = time.monotonic,
        settle_model: bool = False,
    ) -> None:
        self.cfg = config
        self.run_ = run
        self.endpoints = endpoints
        self.session = session
        self.model = model
        self.log = log
        self.live = live
        self.clock = clock
        self.tally = Tally()
        self.interrupted = False
        self._interrupts = 0
        self._leave = False  # the grace period is over (or a second interrupt): stop waiting
        self._probe_timeout = min(5.0, config.connect_timeout)
        self.keeper = EndpointKeeper(config, endpoints, session, log=log, clock=clock, model=model)
        self.dispatcher = Dispatcher(
            config,
            endpoints,
            reader,
            _Sink(run, self.tally, settle_model=settle_model),
            model=model,
            is_done=run.is_done,
            check_alive=self.keeper.check_alive,
            revive=self.keeper.revive,
            log=log,
            clock=clock,
            priors=partial(
                known_lengths, run.store, config.prompts, history=bool(run.resumed_done)
            ),
            answered_before=partial(answered_prompts, run.store) if run.resumed_done else None,
        )
        self.keeper.attach(self.dispatcher)
        self.progress = Progress(
            endpoints,
            self._counters,
            total=total,
            clock=clock,
            state=self._state,
            held=self.dispatcher.held_out,
        )
        self._unserved_since: float | None = None  # no endpoint serving since (the watch)
        self._total = total  # in-scope (prompt, sample) pairs, rejected lines included
        self._stop_loops = asyncio.Event()
        self._grace_task: asyncio.Task[None] | None = None
        self.fatal: DraftdataError | None = None  # what stopped the run (raised by ``run``)
        self.committer = Committer(
            run, config, log=log, clock=clock, abort=self._abort, rng=self.dispatcher.rng
        )

    def _counters(self) -> tuple[int, int, int, int]:
        t = self.tally
        return (
            t.done,
            self.dispatcher.caller.requests_ok,
            sum(e.meter.output_tokens for e in self.endpoints),
            (t.done - t.completed),
        )

    def _state(self) -> str | None:
        """Why nothing moves now, for the progress views instead of an ETA (None: it moves)."""
        d = self.dispatcher
        if d.stopping:
            running = sum(len(c) for c in d.on_endpoint.values())
            if self.fatal is not None:
                return "stopping"
            return f"stopping: {running:,} running request(s) to finish, then committing"
        checking = d.checking()
        if checking is not None:
            return checking
        if self._unserved_since is not None:
            return f"waiting: no endpoint serving for {self.clock() - self._unserved_since:.0f} s"
        if d.paused:
            return f"paused: {self.run_.buffered:,} records wait for the store"
        return None

    # -- shutdown -----------------------------------------------------------------------------

    def interrupt(self) -> None:
        """SIGINT/SIGTERM: first stop dispatch (grace period), then cancel what runs."""
        self._interrupts += 1
        self.interrupted = True
        d = self.dispatcher
        if self._interrupts == 1:
            running = sum(len(c) for c in d.on_endpoint.values())
            self.log(
                f"generate: stopping; waiting up to {self.cfg.grace_seconds:.0f} s for {running} "
                "running request(s), then committing (interrupt again to leave now)"
            )
            d.stop()
            self._grace_task = asyncio.ensure_future(self._grace())
        else:
            self.log("generate: leaving now; committing what finished")
            self._leave = True
            d.abort()

    async def _grace(self) -> None:
        await asyncio.sleep(self.cfg.grace_seconds)
        self.log("generate: grace period over; cancelling the running requests")
        self._leave = True
        self.dispatcher.abort()

    # -- the loops ----------------------------------------------------------------------------

    def _abort(self, error: DraftdataError, cause: BaseException | None = None) -> None:
        """Stop the run at once; ``run`` raises ``error`` after committing what it can."""
        if self.fatal is not None:
            return
        if cause is not None:
            error.__cause__ = cause
        self.fatal = error
        self.dispatcher.abort()

    # -- the watch: pause on a full buffer, stop when no endpoint can serve --------------------

    async def _watch_loop(self) -> None:
        while not self._stop_loops.is_set() and self.fatal is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_loops.wait(), 0.25)
            self._check_buffer()
            if self.cfg.token_ids == "on":
                # an endpoint that could not be asked before the run started
                bad = [e for e in self.endpoints if e.client.token_ids_supported is False]
                if bad:
                    self._abort(ConfigError(token_ids_refusal(bad[0].url)))
                    return
            for e in self.endpoints:
                if e.breaker.recovered:
                    e.breaker.recovered = False
                    self.log(f"endpoint {e.url} answers chat requests again")
            if self.dispatcher.stopping:
                continue
            now = self.clock()
            if any(e.breaker.serving for e in self.endpoints):
                self._unserved_since = None
                continue
            if all(e.breaker.refusal is not None for e in self.endpoints) and not any(
                e.meter.served for e in self.endpoints
            ):
                if all(e.breaker.refused_how.startswith("refuses") for e in self.endpoints):
                    each = ", ".join(f"{e.url} ({e.breaker.refusal})" for e in self.endpoints)
                    said = (
                        f"every endpoint refuses chat requests: {each}; check the API key "
                        "(--api-key-env), --model and the URLs"
                    )
                else:
                    each = ", ".join(
                        f"{e.url} {e.breaker.refused_how} ({e.breaker.refusal})"
                        for e in self.endpoints
                    )
                    said = f"no endpoint gives a usable answer: {each}; fix the servers"
                self._abort(FleetUnavailableError(f"generate: {said}, then run the same command"))
                return
            if self._unserved_since is None:
                self._unserved_since = now
            elif now - self._unserved_since >= self.cfg.unavailable_timeout:
                for e in self.endpoints:
                    why = e.breaker.fault or (
                        "on trial, no answer yet" if e.breaker.state == "up" else e.breaker.state
                    )
                    self.log(f"endpoint {e.url}: out of service: {why}")
                self._abort(
                    FleetUnavailableError(
                        f"generate: no endpoint could serve for {now - self._unserved_since:.0f} s "
                        f"(--unavailable-timeout {self.cfg.unavailable_timeout:g}); stopped. "
                        "Committed work is kept: fix the endpoints and run the same command "
                        "to resume"
                    )
                )
                return

    def _check_buffer(self) -> None:
        """Pause dispatch while more than ``max_uncommitted`` records wait for the store."""
        paused = self.committer.over_bound()
        if paused is not None:
            self.dispatcher.paused = paused
            self.dispatcher.wake.set()

    async def _load_loop(self) -> None:
        shown = {e: e.concurrency.limit for e in self.endpoints}
        while not self._stop_loops.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_loops.wait(), self.cfg.load_interval)
            ups = [e for e in self.endpoints if e.breaker.state == "up"]
            for e in self.keeper.untold(ups):  # a thinking mode a probe could not learn
                self.dispatcher.spawn(self.keeper.learn_thinking(e))
            loads = await asyncio.gather(
                *(load_of(self.session, e, self._probe_timeout) for e in ups)
            )
            for e, load in zip(ups, loads, strict=True):
                if load is not None:
                    e.adapt(load)
                # the limit also moves when answers teach the fitted capacity (endpoint.py)
                if abs(e.concurrency.limit - shown[e]) >= max(2, shown[e] // 10):
                    why = f"capacity {e.concurrency.fitted() or '?'}"
                    if load is not None:
                        why += f", server running {load.running}, waiting {load.waiting}"
                    self.log(
                        f"endpoint {e.url}: concurrency {shown[e]} -> {e.concurrency.limit} ({why})"
                    )
                    shown[e] = e.concurrency.limit
            self.dispatcher.wake.set()

    async def _progress_loop(self) -> None:
        display = None
        if self.live:
            display = Live(
                self.progress.render(),
                console=Console(),
                refresh_per_second=REFRESH_PER_SECOND,
                transient=False,
            )
            display.start()
        last_line = last_metrics = self.clock()
        try:
            while not self._stop_loops.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_loops.wait(), 0.5)
                self.progress.already_done = self.dispatcher.already_done
                self.progress.total = self._answerable()
                self.progress.tick()
                now = self.clock()
                if display is not None:
                    display.update(self.progress.render())
                elif self.cfg.progress != "off" and now - last_line >= self.cfg.log_interval:
                    self.log(self.progress.line())
                    last_line = now
                if now - last_metrics >= self.cfg.metrics_interval:
                    last_metrics = now
                    snap = self.progress.snapshot()
                    snap["lengths"] = self.dispatcher.figures.to_dict()
                    await self._write_metrics(snap)
        finally:
            if display is not None:
                display.update(self.progress.render())
                display.stop()

    async def _write_metrics(self, data: dict[str, Any]) -> None:
        if self.committer.store_down:
            return  # said once already; the snapshot is not worth a retry
        try:
            await asyncio.to_thread(self.run_.write_metrics, data)
        except StoreError as exc:
            self.log(f"generate: could not write metrics: {exc}")

    # -- run ----------------------------------------------------------------------------------

    async def run(self) -> GenerateSummary:
        """Run to the end (or to an interrupt); commit; return the summary."""
        t0 = self.clock()
        for e in self.endpoints:
            if e.breaker.state != "up":
                self.dispatcher.spawn(self.keeper.revive(e))
        loops = [
            asyncio.create_task(self.committer.loop(self._stop_loops)),
            asyncio.create_task(self._load_loop()),
            asyncio.create_task(self._progress_loop()),
            asyncio.create_task(self._watch_loop()),
        ]
        for task in loops:  # one that dies of a bug stops the run, not the loop alone
            task.add_done_callback(self.dispatcher.task_ended)
        try:
            await self.dispatcher.run()
            if self.fatal is None:
                await self.committer.drain(lambda: self._leave, stopping=self.interrupted)
        finally:
            self._stop_loops.set()
            if self._grace_task is not None:
                self._grace_task.cancel()
            self.dispatcher.abort()
            await asyncio.gather(*self.dispatcher.tasks, return_exceptions=True)
            await asyncio.gather(*loops, return_exceptions=True)
            d = self.dispatcher
            stopping = (
                self.fatal is not None
                or self.interrupted
                or d.bug is not None
                or d.refused is not None
            )
            await self.committer.close(stopping=stopping)
        if self.fatal is not None:
            raise self.fatal
        if self.dispatcher.bug is not None:  # one that came after dispatch ended (a loop's)
            raise self.dispatcher.bug
        summary = self._summary(self.clock() - t0)
        await self._write_metrics(
            {
                "kind": "summary",
                "time": time.time(),
                "elapsed_s": summary.wall_s,
                **summary.to_dict(),
                "series": self.progress.series,
            }
        )
        return summary

    def _answerable(self) -> int | None:
        """The in-scope pairs less those of rejected lines (bad or repeated ids): what
        progress and ``remaining`` count towards."""
        if self._total is None:
            return None
        rejected = int(getattr(self.dispatcher.reader, "invalid", 0))
        return max(0, self._total - rejected * self.cfg.n)

    def _summary(self, wall: float) -> GenerateSummary:
        d = self.dispatcher
        shares = []
        for e in self.endpoints:
            committed_tokens = self.tally.endpoint_tokens[e.url]  # winning copies only
            shares.append(
                EndpointShare(
                    url=e.url,
                    state=e.breaker.state,
                    engine=e.capacity.engine if e.capacity else None,
                    capacity=e.concurrency.fitted(),
                    concurrency=e.concurrency.limit,
                    requests=e.meter.requests,
                    completed=e.meter.completed,
                    output_tokens=committed_tokens,
                    generated_tokens=e.meter.output_tokens,
                    share=round(self.tally.share(e.url), 4),
                    errors=dict(e.meter.errors),
                    hedges_won=e.meter.hedges_won,
                    downs=e.breaker.downs,
                    fault=e.breaker.fault,
                )
            )
        total = self._total
        answerable = self._answerable()
        settled = d.already_done + self.tally.done - self.committer.uncommitted
        return self.tally.freeze(
            out=self.cfg.out,
            run_id=self.run_.manifest.get("run_id"),
            model=self.model,
            partition=self.cfg.partition,
            total=total,
            already_done=d.already_done,
            max_tokens=self.cfg.max_tokens,
            clamped=d.caller.clamped,
            requests=d.caller.requests_ok,
            retries=d.retries,
            hedges=d.hedges,
            hedges_won=d.hedges_won,
            hedges_wasted=d.hedges_wasted,
            invalid_prompts=d.reader.invalid,
            wall_s=round(wall, 3),
            interrupted=self.interrupted,
            remaining=max(0, answerable - settled) if answerable is not None else None,
            peak_uncommitted=self.committer.peak_uncommitted,
            endpoints=shares,
            lengths=d.figures.to_dict(),
        )


async def run_engine(
    config: GenerateConfig,
    run: Run,
    endpoints: list[Endpoint],
    reader: PromptReader,
    *,
    model: str,
    total: int | None = None,
    log: Log = stderr_log,
    live: bool = False,
    api_key: str | None = None,
    session: aiohttp.ClientSession | None = None,
    on_engine: Callable[[Engine], None] | None = None,
    settle_model: bool = False,
) -> GenerateSummary:
    """Run the engine, with ``session`` for its probes (else one of its own, with ``api_key``);
    ``on_engine`` sees the Engine first (to wire signals or to interrupt it from a test);
    ``settle_model``: a new run records the model of the endpoint that answered first."""
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(fewer_collections())  # gc_tuning.py: a third of the CPU otherwise
        if session is None:
            session = await stack.enter_async_context(probe_session(api_key))
        engine = Engine(
            config,
            run,
            endpoints,
            reader,
            model=model,
            session=session,
            total=total,
            log=log,
            live=live,
            settle_model=settle_model,
        )
        if on_engine is not None:
            on_engine(engine)
        return await engine.run()


def answered_prompts(store: Store, k: int = EARLIER_ANSWERS) -> list[tuple[Prompt, list[Turn]]]:
    """A few prompts the run at ``store`` answered before this command (``k`` of its newest
    shard: a few of each shape, plain, with tools, conversations, where it holds them), as
    they were asked, with the target's turns (``Dispatcher``'s ``answered_before``: a resumed
    command's canaries, a conversation's last request)."""
    return [
        (
            Prompt(id=c.id, messages=c.messages, source=c.source, domain=c.domain, tools=c.tools),
            c.turns,
        )
        for c in newest_completions(store, k)
    ]
