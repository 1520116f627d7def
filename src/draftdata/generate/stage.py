"""``generate(config) -> GenerateSummary``: the generate stage as one plain function.

It runs on a fresh event loop in four phases, each a function a reader can stop at:

1. ``preflight`` (``preflight.py``): everything checked before the first request: the config,
   the prompt files (and that their first lines are prompts at all: a file in another schema
   stops with one line naming the ``prepare`` schema that converts it), the API key variable,
   that at least one endpoint answers (else a one-line FleetError), that the output limits
   can fit a request in the endpoints' context (``--strict-limit`` refuses one that cannot;
   otherwise each request's limit is lowered to fit, and the start says so in one line);
2. ``open_run``: the run store (``Run.open``: protected prefixes, the manifest's settings
   hash, the run lease);
3. the engine (``engine.run_engine``) over the endpoints (``make_endpoints``) and the prompt
   reader, with SIGINT/SIGTERM wired to its graceful stop when called from the main thread
   (``EngineHooks``), then, whatever happened, ``close_run``: the endpoints closed, the
   invalid prompt lines written, the lease released;
4. ``finish``: a run taken over raises LeaseLostError; the whole run's figures join the
   summary.

Works in a fresh process (scripts, Ray workers).

Nothing is recorded before an endpoint has answered: the run's manifest is written with its
first committed shard (``Run.open(defer_manifest=True)``), with the model of the endpoint that
answered when the start could not learn it; a run that holds no completion yet takes changed
settings (or another model) without ``--allow-config-change``.

The run's settings (the manifest hash) are what changes the output: the prompts' identity
(sha256 of the files), the model, max tokens, sampling, reasoning mode and template kwargs,
history handling, ``n``, per-source overrides and extra body fields. Endpoints, concurrency,
``limit``, ``partition`` and timeouts are not, so a run can be resumed on another fleet, in
partitions, or first tried with ``--limit``.

Secrets stay in the process: the API key and the passwords of endpoint URLs go out only in
requests. URLs are shown and recorded without their password (``redact.redact_url``), and every
log line and the error a command ends with pass through the run's ``Redactor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Collection
from functools import partial
from typing import Any

import msgspec
import numpy as np

from draftdata.errors import DraftdataError, LeaseLostError, StoreError
from draftdata.generate.config import GenerateConfig, validate
from draftdata.generate.engine.client import EndpointClient
from draftdata.generate.engine.concurrency import queue_target
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.limits import FALLBACK_MAX_TOKENS, INITIAL_TOKENS_PER_BYTE
from draftdata.generate.engine.loop import Engine, Log, probe_session, run_engine, stderr_log
from draftdata.generate.preflight import (
    Preflight,
    api_key,
    check_credentials,
    endpoint_urls,
    fleet_contexts,
    preflight,
)
from draftdata.generate.prompts.rejects import Rejects
from draftdata.generate.prompts.source import PromptFile, PromptReader, prompt_files
from draftdata.generate.summary import GenerateSummary
from draftdata.records import Completion, Failure, Message, Turn
from draftdata.shared.endpoints import Capacity
from draftdata.shared.formats import completions_table, failures_table
from draftdata.stats.runfigures import RunFigures, run_figures
from draftdata.store.lease import LeaseOptions, scope_of
from draftdata.store.protect import check_not_protected
from draftdata.store.run import Run
from draftdata.store.write import parquet_bytes
from draftdata.support.redact import Redactor
from draftdata.support.workerpool import signals_free


def generate(
    config: GenerateConfig,
    *,
    partition: str | None = None,
    writer_id: str | None = None,
    log: Log | None = None,
    live: bool | None = None,
    handle_signals: bool = True,
    on_engine: Callable[[Engine], None] | None = None,
    only: Collection[str] | None = None,
) -> GenerateSummary:
    """Run the generate stage for ``config`` and return its summary.

    ``partition``/``writer_id`` override the config's fields (the Ray driver passes them);
    ``log`` receives start-up, endpoint and plain progress lines (default: stderr); ``live``
    forces the rich display on or off (default: from ``config.progress`` and whether stdout
    is a terminal); ``on_engine`` is called with the Engine on its event loop before it starts
    (to interrupt it from another thread: ``loop.call_soon_threadsafe(engine.interrupt)``);
    ``only`` limits the command to those prompt ids within the scope (a pilot's sample,
    ``pilot.py``; not a setting of the run: the same command without it answers the rest).
    Raises a DraftdataError subclass for anything the user can fix.
    """
    changes = {k: v for k, v in (("partition", partition), ("writer_id", writer_id)) if v}
    config = validate(msgspec.structs.replace(config, **changes) if changes else config)
    # refuse a protected output before any request (Run.open checks again, with a listing)
    check_not_protected(config.out, config.protect, describe=True)
    files = prompt_files(config.prompts)
    urls, fleet_caps = endpoint_urls(config)
    contexts = fleet_contexts(config, len(urls))
    key = api_key(config)
    check_credentials(urls, key)
    redact = Redactor.of(key, urls)
    if live is None:
        live = config.progress == "rich" or (config.progress == "auto" and sys.stdout.isatty())
    sink = log or stderr_log

    def emit(line: str) -> None:
        sink(redact(line))

    if handle_signals:
        # take over SIGINT/SIGTERM only where nobody else (a Ray worker, a notebook) has: over
        # Python's defaults or the command line's handler (``interrupts``), given back after
        handle_signals = signals_free()
    try:
        return asyncio.run(
            _generate(
                config,
                files,
                urls,
                fleet_caps,
                key,
                emit,
                contexts=contexts,
                live=live,
                signals=handle_signals,
                on_engine=on_engine,
                redact=redact,
                only=only,
            )
        )
    except DraftdataError as exc:  # the line the command ends with
        said = str(exc)
        if redact(said) == said:
            raise
        try:
            clean = type(exc)(redact(said))
        except Exception:  # a subclass with other arguments: the message is what counts
            clean = DraftdataError(redact(said))
        raise clean from None


async def _generate(
    config: GenerateConfig,
    files: list[PromptFile],
    urls: list[str],
    fleet_caps: list[int | None],
    key: str | None,
    log: Log,
    *,
    contexts: list[int | None],
    live: bool,
    signals: bool,
    on_engine: Callable[[Engine], None] | None,
    redact: Callable[[str], str] = str,
    only: Collection[str] | None = None,
) -> GenerateSummary:
    """The phases (module docstring), on the event loop."""
    async with _warming(), probe_session(key) as session:
        pre = await preflight(config, files, urls, contexts, key, session, log)
        hooks = EngineHooks(log, on_engine, signals=signals)
        run = await open_run(config, pre, hooks.lease_lost, log)
        endpoints: list[Endpoint] = []
        rejects = Rejects(log)
        try:  # from here on the lease is released whatever happens
            endpoints = make_endpoints(
                config, urls, pre.caps, fleet_caps, key, log, contexts, redact, _prompt_guess(pre)
            )
            _say_resuming(config, pre, run, log)
            reader = PromptReader(
                files,
                limit=config.limit,
                partition=pre.partition,
                on_reject=rejects.add,
                settled=partial(settled_samples, run, config.n),
                only=only,
            )
            summary = await run_engine(
                config,
                run,
                endpoints,
                reader,
                model=pre.model,
                session=session,
                total=(pre.found.in_scope if only is None else len(only)) * config.n,
                log=log,
                live=live,
                on_engine=hooks.started,
                settle_model=config.model is None,
            )
        finally:
            hooks.unwire()
            await close_run(run, endpoints, rejects, log)
    if summary.interrupted and hooks.signalled:
        summary.signal = signal.Signals(hooks.signalled[0]).name
    return await finish(config, run, summary, log)


async def open_run(
    config: GenerateConfig, pre: Preflight, lease_lost: Callable[[str], None], log: Log
) -> Run:
    """Open (or resume) the run at ``config.out`` with the preflight's settings and take its
    lease (``lease_lost`` is called, from any thread, if another process takes it over).
    Nothing is recorded yet: the manifest is written with the first committed shard."""
    lease = LeaseOptions(scope_of(pre.partition), config.lease_ttl, config.lease_wait, lease_lost)
    run = await asyncio.to_thread(
        Run.open,
        config.out,
        settings=pre.settings.to_json(),
        protect=config.protect,
        allow_config_change=config.allow_config_change,
        retry_failed=config.retry_failed,
        flush_records=config.flush_records,
        flush_seconds=config.flush_seconds,
        writer_id=config.writer_id,
        lease=lease,
        log=log,
        defer_manifest=True,
    )
    if run.changes:
        changed = "; ".join(run.changes[:4]) + ("; ..." if len(run.changes) > 4 else "")
        log(
            f"generate: {config.out}: settings changed ({changed}); recorded in "
            "manifest-history/; its earlier fatal failures are tried again"
        )
    return run


def _say_resuming(config: GenerateConfig, pre: Preflight, run: Run, log: Log) -> None:
    """One line on what a resumed run skips. A partition's done-set holds the other
    partitions' records too: it says what it skipped of its own in the summary ("already done
    before")."""
    if pre.partition is None and (run.resumed_done or (run.resumed_fatal and not run.changes)):
        fatal = 0 if run.retry_failed else run.resumed_fatal
        log(
            f"generate: resuming {config.out}: {run.resumed_done:,} completed and "
            f"{fatal:,} fatally failed records are skipped"
        )


async def close_run(run: Run, endpoints: list[Endpoint], rejects: Rejects, log: Log) -> None:
    """Whatever happened: close the endpoints, write the invalid prompt lines (a run that
    recorded nothing, or was taken over, gets no list) and release the lease."""
    await asyncio.gather(*(e.client.close() for e in endpoints), return_exceptions=True)
    try:
        if (run.lease is None or not run.lease.lost) and run.manifest_written:
            key = await asyncio.to_thread(rejects.write, run)
            if key is not None:
                log(rejects.summary(key))
        elif rejects.rows:
            log(rejects.summary(None))
    except StoreError as exc:
        log(f"generate: could not write the invalid prompt lines: {exc}")
    finally:
        await asyncio.to_thread(run.release_lease)


async def finish(
    config: GenerateConfig, run: Run, summary: GenerateSummary, log: Log
) -> GenerateSummary:
    """After the engine: a run taken over raises LeaseLostError (what we did not commit is
    theirs); the whole run's figures join the summary (not a partition's: the Ray driver sums
    them; not a run that recorded nothing); an interrupt says how to resume."""
    if run.lease is not None and run.lease.lost:
        raise LeaseLostError(run.lease.lost)
    if not config.partition and run.manifest_written:
        summary.run = await asyncio.to_thread(_whole_run, run, log)
    if summary.interrupted:
        log(
            f"generate: interrupted with {summary.remaining} left; run the same command "
            "again to resume (committed work is skipped)"
        )
    return summary


class EngineHooks:
    """What the stage wires onto the engine once it runs: the lease's loss aborts it (from
    the heartbeat or the commit thread), SIGINT/SIGTERM interrupt it (main thread only), and
    the caller's ``on_engine`` sees it."""

    def __init__(
        self, log: Log, on_engine: Callable[[Engine], None] | None, *, signals: bool
    ) -> None:
        self.log = log
        self.on_engine = on_engine
        self.signals = signals
        self._stops: list[Callable[[], object]] = []  # set once the engine runs
        self._undo: list[Callable[[], None]] = []
        self.signalled: list[int] = []  # the signals that interrupted the engine, in order

    def lease_lost(self, message: str) -> None:
        """Another process took the run over: stop the engine (thread-safe)."""
        self.log(f"generate: {message}")
        for stop in self._stops:
            stop()

    def started(self, engine: Engine) -> None:
        """The engine is about to run (on its event loop)."""
        loop = asyncio.get_running_loop()
        self._stops.append(lambda: loop.call_soon_threadsafe(engine.dispatcher.abort))
        if self.on_engine is not None:
            self.on_engine(engine)
        if self.signals and (undo := _install_signals(engine, self.signalled)) is not None:
            self._undo.append(undo)

    def unwire(self) -> None:
        """Give the signals back."""
        for undo in self._undo:
            undo()


def settled_samples(run: Run, n: int, ids: list[str]) -> list[int]:
    """How many samples of each prompt the run settled: ``n`` when all are (the reader skips
    the prompt), else 0."""
    if n == 1:
        done = run.done_mask(ids)
    else:
        pairs = run.done_mask([i for i in ids for _ in range(n)], list(range(n)) * len(ids))
        done = np.asarray(pairs.reshape(-1, n).all(axis=1))
    return [n if d else 0 for d in done.tolist()]


def _prompt_guess(pre: Preflight) -> float:
    """Tokens of an average prompt line, from the files' size (``Endpoint`` capacity prior)."""
    return pre.found.bytes / max(1, pre.found.prompts) * INITIAL_TOKENS_PER_BYTE


def _whole_run(run: Run, log: Log) -> RunFigures | None:
    """The whole run's figures (all segments, committed only), or None if unreadable now."""
    try:
        return run_figures(run.store)
    except Exception as exc:  # the figures are informational: a finished run stays finished
        log(f"generate: could not count the whole run's figures: {type(exc).__name__}: {exc}")
        return None


def make_endpoints(
    config: GenerateConfig,
    urls: list[str],
    caps: list[Capacity | None],
    fleet_caps: list[int | None],
    key: str | None,
    log: Log,
    contexts: list[int | None],
    redact: Callable[[str], str] = str,
    prompt_guess: float = 0.0,
) -> list[Endpoint]:
    """One Endpoint per URL, its capacity and starting concurrency set from the probe.

    ``prompt_guess`` (tokens of an average prompt line, from the files' size) and half the
    output limit are the tokens a sequence is expected to hold until answers tell
    (``Endpoint.held_prior``).
    """
    out = []
    for i, (url, cap, fleet_max) in enumerate(zip(urls, caps, fleet_caps, strict=True)):
        # the keep-alive pool is sized to the most requests the endpoint may get at once
        known = (cap.max_running if cap is not None else None) or fleet_max
        if config.concurrency != "auto":
            pool = int(config.concurrency) + 8
        elif known:
            pool = known + 2 * queue_target(known) + 8
        else:
            pool = 1024  # found by growing (vLLM reports no capacity)
        client = EndpointClient(
            url,
            api_key=key,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            pool_size=pool,
        )
        ep = Endpoint(
            url,
            client,
            index=i,
            concurrency=config.concurrency,
            default_concurrency=config.default_concurrency,
            breaker_failures=config.breaker_failures,
            redact=redact,
        )
        context = (cap.context_length if cap is not None else None) or contexts[i]
        output_limit = config.max_tokens or context
        ep.concurrency.held_prior = prompt_guess + (output_limit or FALLBACK_MAX_TOKENS) / 2
        ep.set_capacity(cap, fleet_max, contexts[i])
        if cap is None:
            ep.breaker.state = "down"
            ep.breaker.fault = "not reachable"
            log(f"endpoint {ep.url}: not reachable now; probing every {config.probe_interval:g} s")
        else:
            ep.breaker.state = "up"
            reported = cap.max_running if cap.max_running else "not reported"
            if ep.concurrency.kv_tokens:
                c = ep.concurrency
                reported = (
                    f"{c.fitted()} (KV cache {c.kv_tokens} tokens / ~{c.held_tokens():.0f} "
                    f"a request, running cap {c.running_cap or 'none'})"
                )
            how = "auto" if ep.concurrency.auto else "fixed"
            if config.max_tokens is not None:
                output = f"output limit {config.max_tokens}"
                if ep.context_length and not config.strict_limit:
                    output += (
                        f" (lowered where a request would not fit the context of "
                        f"{ep.context_length})"
                    )
            elif ep.context_length:
                output = f"output fills the context of {ep.context_length}"
            else:
                output = f"context length unknown: output limit {FALLBACK_MAX_TOKENS}"
            log(
                f"endpoint {ep.url}: {cap.engine}, model {cap.model}, capacity {reported}, "
                f"concurrency {ep.concurrency.limit} ({how}), {output}"
            )
        out.append(ep)
    return out


@contextlib.asynccontextmanager
async def _warming() -> AsyncIterator[None]:
    """``_warm_up`` in a worker thread, beside probing, scanning and the first requests: the
    fleet does not wait for it (it took 0.16 s in-process and about a second from the CLI
    before the first request), only a first flush that comes before it ends does, on
    Python's import lock. Its outcome is not the run's: a failure shows at the first flush."""
    warm = asyncio.ensure_future(asyncio.to_thread(_warm_up))
    try:
        yield
    finally:
        if warm.done():
            if not warm.cancelled():
                warm.exception()  # retrieved: the flush reports what matters
        else:
            warm.cancel()


def _warm_up() -> None:
    """Encode one throw-away shard, so the first real flush does not pay pyarrow's lazy
    imports (about a second, and several under a busy event loop) while results wait."""
    msg = [Message(role="user", content="warm-up")]
    parquet_bytes(completions_table([Completion(id="w", messages=msg, turns=[Turn(content="w")])]))
    parquet_bytes(failures_table([Failure(id="w", reason="warm_up")]))


def _install_signals(engine: Engine, signalled: list[int]) -> Callable[[], None] | None:
    """SIGINT/SIGTERM interrupt the engine (noted in ``signalled``) until the returned
    function gives the handlers from before back (asyncio's own removal would put Python's
    defaults there, not the command line's handler)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    loop = asyncio.get_running_loop()
    installed: dict[int, Any] = {}  # signal -> its handler before

    def interrupt(sig: int) -> None:
        signalled.append(sig)
        engine.interrupt()

    for sig in (signal.SIGINT, signal.SIGTERM):
        before = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, interrupt, sig)
        except (ValueError, RuntimeError, NotImplementedError):
            continue
        installed[sig] = before

    def restore() -> None:
        # held back meanwhile: asyncio's removal puts Python's defaults in for a moment, and a
        # SIGTERM then would end the process without its line
        held = signal.pthread_sigmask(signal.SIG_BLOCK, list(installed))
        try:
            for sig, before in installed.items():
                loop.remove_signal_handler(sig)
                if before is not None:
                    signal.signal(sig, before)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    return restore
