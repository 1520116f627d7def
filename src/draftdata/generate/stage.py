"""``generate(config) -> GenerateSummary``: the generate stage as one plain function.

It checks everything before the first request: the config, the prompt files (and that their
first lines are prompts at all: a file in another schema stops with one line naming the
``prepare`` schema that converts it), the API key variable, that at least one endpoint answers
(else a one-line FleetError), that the output limits can fit a request in the endpoints'
context (``--strict-limit`` refuses one that cannot; otherwise each request's limit is lowered
to fit, and the start says so in one line), and the run store (``Run.open``: protected
prefixes, the manifest's settings hash). Then it runs the engine on a fresh event loop, with
SIGINT/SIGTERM wired to the engine's graceful stop when called from the main thread, and
returns the summary. Works in a fresh process (scripts, Ray workers).

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
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import msgspec
import numpy as np

from draftdata.endpoints import base_url, probe_capacity
from draftdata.errors import ConfigError, DraftdataError, FleetError, LeaseLostError, StoreError
from draftdata.fleetspec import read_fleet
from draftdata.generate.client import EndpointClient
from draftdata.generate.config import GenerateConfig, validate
from draftdata.generate.endpoint import Endpoint, queue_target
from draftdata.generate.engine import Engine, Log, probe_session, run_engine, stderr_log
from draftdata.generate.limits import FALLBACK_MAX_TOKENS, INITIAL_TOKENS_PER_BYTE
from draftdata.generate.models import check_fleet_models, check_resume_model, recorded_model
from draftdata.generate.partition import parse_partition
from draftdata.generate.rejects import Rejects, check_schema
from draftdata.generate.source import PromptReader, Scan, prompt_files, scan
from draftdata.generate.summary import GenerateSummary
from draftdata.generate.thinking import server_kwargs
from draftdata.redact import Redactor, redact_url
from draftdata.store.lease import LeaseOptions, scope_of
from draftdata.store.manifest import SERVER_TEMPLATE_KWARGS
from draftdata.store.protect import check_not_protected
from draftdata.store.run import Run


def run_settings(config: GenerateConfig, prompts: Scan, model: str) -> dict[str, Any]:
    """The settings whose hash identifies the run (module docstring)."""
    kwargs: dict[str, Any] = dict(config.extra_body.get("chat_template_kwargs") or {})
    if config.reasoning != "server":
        kwargs["enable_thinking"] = config.reasoning == "on"
    return {
        "stage": "generate",
        "prompts": {"sha256": prompts.sha256, "lines": prompts.prompts, "bytes": prompts.bytes},
        "model": model,
        "max_tokens": config.max_tokens if config.max_tokens is not None else "auto",
        # only when set: the settings (and hash) of runs that never used it stay as they were
        **({"strict_limit": True} if config.strict_limit else {}),
        "sampling": msgspec.to_builtins(config.sampling),
        "reasoning": config.reasoning,
        "chat_template_kwargs": kwargs,
        "keep_reasoning_history": config.keep_reasoning_history,
        "n": config.n,
        "overrides": msgspec.to_builtins(config.overrides),
        "extra_body": config.extra_body,
    }


def endpoint_urls(config: GenerateConfig) -> tuple[list[str], list[int | None]]:
    """The endpoints' base URLs and the capacity fleet.yaml records for each (if any)."""
    if config.fleet is not None:
        if not os.path.exists(config.fleet):
            raise ConfigError(
                f"--fleet {config.fleet}: {config.fleet} does not exist; start a fleet with "
                "`draftdata fleet up` (it writes fleet.yaml) or give --endpoint URLs"
            )
        spec = read_fleet(config.fleet)
        return [base_url(e.url) for e in spec.endpoints], [
            e.max_running_requests for e in spec.endpoints
        ]
    urls = [base_url(u) for u in config.endpoints]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ConfigError(
            f"--endpoint {redact_url(bad[0])}: give a URL such as http://127.0.0.1:30000"
        )
    unique = list(dict.fromkeys(urls))
    return unique, [None] * len(unique)


def fleet_contexts(config: GenerateConfig, n: int) -> list[int | None]:
    """The context length fleet.yaml records for each endpoint (None where it has none)."""
    if config.fleet is None:
        return [None] * n
    return [e.context_length for e in read_fleet(config.fleet).endpoints]


def api_key(config: GenerateConfig) -> str | None:
    """The API key from the environment variable named by ``api_key_env`` (never logged)."""
    if not config.api_key_env:
        return None
    value = os.environ.get(config.api_key_env)
    if not value:
        raise ConfigError(f"--api-key-env: ${config.api_key_env} is not set or empty")
    return value


def check_credentials(urls: list[str], key: str | None) -> None:
    """ConfigError when a URL carries a user (HTTP basic auth) and an API key is given too:
    both would be the one ``Authorization`` header of every request."""
    if key is None:
        return
    from urllib.parse import urlsplit

    with_user = [u for u in urls if urlsplit(u).username is not None]
    if with_user:
        raise ConfigError(
            f"--api-key-env: {redact_url(with_user[0])} carries a user and password (sent as "
            "HTTP basic auth) and --api-key-env sends a key in the same Authorization header; "
            "give one of the two (the URL without user:password@, or no --api-key-env)"
        )


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
        import sys

        live = config.progress == "rich" or (config.progress == "auto" and sys.stdout.isatty())
    sink = log or stderr_log

    def emit(line: str) -> None:
        sink(redact(line))

    if handle_signals:
        # take over SIGINT/SIGTERM only where nobody else (a Ray worker, a notebook) has
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        handle_signals = all(signal.getsignal(s) is h for s, h in defaults.items())
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
    files: list[Any],
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
    timeout = min(10.0, config.connect_timeout)
    shown = [redact_url(u) for u in urls]
    async with _warming() as warm, probe_session(key) as session:
        caps = await asyncio.gather(*(probe_capacity(session, u, timeout=timeout) for u in urls))
        if all(c is None for c in caps):
            which = ", ".join(shown[:4]) + (f" and {len(urls) - 4} more" if len(urls) > 4 else "")
            raise FleetError(
                f"generate: no endpoint reachable ({which}); start the fleet "
                "(draftdata fleet up / fleet sim) or check --endpoint/--fleet"
            )
        check_fleet_models(shown, [c.model if c else None for c in caps], config.allow_mixed_models)
        served = next((c.model for c in caps if c and c.model), None)
        if config.model is None and served is None:  # a resumed run stays what it recorded
            served = await asyncio.to_thread(recorded_model, config.out)
        model = config.model or served or "default"
        await asyncio.to_thread(check_resume_model, config.out, model, config.allow_config_change)
        check_limits(config, shown, caps, contexts, log)
        if config.token_ids == "on":
            await _check_token_ids(config, urls, caps, key, model)
        part = parse_partition(config.partition) if config.partition else None
        await asyncio.to_thread(check_schema, files, config.limit)
        found = await asyncio.to_thread(scan, files, limit=config.limit, partition=part)
        settings = run_settings(config, found, model)
        alive = next((u for u, c in zip(urls, caps, strict=True) if c is not None), None)
        if kwargs := await server_kwargs(
            config.reasoning, config.token_ids, config.out, session, alive, model
        ):
            settings[SERVER_TEMPLATE_KWARGS] = kwargs  # what tokenize renders with (thinking.py)

        stop_engine: list[Callable[[], object]] = []  # set once the engine runs

        def lease_lost(message: str) -> None:  # from the heartbeat or the commit thread
            log(f"generate: {message}")
            for stop in stop_engine:
                stop()

        lease = LeaseOptions(scope_of(part), config.lease_ttl, config.lease_wait, lease_lost)
        run = await asyncio.to_thread(
            Run.open,
            config.out,
            settings=settings,
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
        endpoints: list[Endpoint] = []
        rejects = Rejects(log)
        restore: list[Callable[[], None]] = []
        try:  # from here on the lease is released whatever happens
            await warm
            prompt_guess = found.bytes / max(1, found.prompts) * INITIAL_TOKENS_PER_BYTE
            endpoints = _endpoints(
                config, urls, caps, fleet_caps, key, log, contexts, redact, prompt_guess
            )
            n = config.n

            def settled(ids: list[str]) -> list[int]:
                # all n samples of a prompt must be settled for the reader to skip it
                if n == 1:
                    done = run.done_mask(ids)
                else:
                    pairs = run.done_mask(
                        [i for i in ids for _ in range(n)], list(range(n)) * len(ids)
                    )
                    done = np.asarray(pairs.reshape(-1, n).all(axis=1))
                return [n if d else 0 for d in done.tolist()]

            reader = PromptReader(
                files,
                limit=config.limit,
                partition=part,
                on_reject=rejects.add,
                settled=settled,
                only=only,
            )
            # a partition's done-set holds the other partitions' records too: it says what it
            # skipped of its own in the summary ("already done before")
            if part is None and (run.resumed_done or (run.resumed_fatal and not run.changes)):
                fatal = 0 if run.retry_failed else run.resumed_fatal
                log(
                    f"generate: resuming {config.out}: {run.resumed_done:,} completed and "
                    f"{fatal:,} fatally failed records are skipped"
                )

            def started(engine: Engine) -> None:
                loop = asyncio.get_running_loop()
                stop_engine.append(lambda: loop.call_soon_threadsafe(engine.dispatcher.abort))
                if on_engine is not None:
                    on_engine(engine)
                if signals and (undo := _install_signals(engine)) is not None:
                    restore.append(undo)

            summary = await run_engine(
                config,
                run,
                endpoints,
                reader,
                model=model,
                session=session,
                total=(found.in_scope if only is None else len(only)) * config.n,
                log=log,
                live=live,
                on_engine=started,
                settle_model=config.model is None,
            )
        finally:
            for undo in restore:
                undo()
            await asyncio.gather(*(e.client.close() for e in endpoints), return_exceptions=True)
            try:
                # a taken-over run is not ours; a run that recorded nothing gets no list either
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
    if run.lease is not None and run.lease.lost:  # taken over: what we did not commit is theirs
        raise LeaseLostError(run.lease.lost)
    # a partition (a Ray task) reports its own part (the driver sums); a run that recorded
    # nothing has no whole-run figures
    if not config.partition and run.manifest_written:
        summary.run = await asyncio.to_thread(_whole_run, run, log)
    if summary.interrupted:
        log(
            f"generate: interrupted with {summary.remaining} left; run the same command "
            "again to resume (committed work is skipped)"
        )
    return summary


def _whole_run(run: Run, log: Log) -> Any:
    """The whole run's figures (all segments, committed only), or None if unreadable now."""
    from draftdata.stats.runfigures import run_figures

    try:
        return run_figures(run.store)
    except Exception as exc:  # the figures are informational: a finished run stays finished
        log(f"generate: could not count the whole run's figures: {type(exc).__name__}: {exc}")
        return None


async def _check_token_ids(
    config: GenerateConfig, urls: list[str], caps: list[Any], key: str | None, model: str
) -> None:
    """``--token-ids on``: one 1-token request per reachable endpoint; refuse (one line) before
    the run is opened when one answers without token ids. An endpoint that cannot be asked now
    is checked by the engine when it first answers."""
    from draftdata.generate.client import RequestError, build_body, token_ids_refusal
    from draftdata.generate.config import Sampling
    from draftdata.records import Message

    async def ask(url: str, served: str | None) -> bool | None:
        body = build_body(
            [Message(role="user", content="Say OK.")],
            model=config.model or served or model,
            max_tokens=1,
            sampling=Sampling(),
            token_ids=True,
        )
        read = min(config.read_timeout, 120.0)  # one token: a server that hangs is not asked
        async with EndpointClient(
            url, api_key=key, connect_timeout=config.connect_timeout, read_timeout=read
        ) as c:
            try:
                await c.chat(body)
            except RequestError:
                return None
            return c.token_ids_supported

    up = [(u, c) for u, c in zip(urls, caps, strict=True) if c is not None]
    answers = await asyncio.gather(*(ask(u, c.model) for u, c in up))
    for (url, _), ok in zip(up, answers, strict=True):
        if ok is False:
            raise ConfigError(token_ids_refusal(redact_url(url)))


def check_limits(
    config: GenerateConfig,
    urls: list[str],
    caps: list[Any],
    contexts: list[int | None],
    log: Log,
) -> None:
    """The configured output limits (``max_tokens`` and the overrides') against each reachable
    endpoint's context, before anything is recorded: a limit that leaves no room for any prompt
    is refused with ``--strict-limit`` (ConfigError, one line) and otherwise said in one line
    (each request's limit is then lowered to the context minus its prompt: ``limits.py``)."""
    limits = [("max_tokens", config.max_tokens)] + [
        (f"{o.domain or o.source}: {o.max_tokens}", o.max_tokens) for o in config.overrides
    ]
    named = [(what, n) for what, n in limits if n is not None]
    if not named:
        return
    for url, cap, fleet_context in zip(urls, caps, contexts, strict=True):
        context = (cap.context_length if cap is not None else None) or fleet_context
        if cap is None or not context:
            continue
        unfit = [
            (what if what != "max_tokens" else f"max_tokens {n}")
            for what, n in named
            if n >= context
        ]
        if not unfit:
            continue
        shown = ", ".join(unfit)
        if config.strict_limit:
            raise ConfigError(
                f"generate: {shown} cannot fit the context of {context} tokens at {url} (a "
                "request needs its prompt too); give a limit below the context, or leave out "
                "--strict-limit to lower each request's limit to the context minus its prompt"
            )
        log(
            f"generate: {shown} cannot fit the context of {context} tokens at {url}: each "
            "request's limit is lowered to the context minus its prompt (counted in the "
            "summary; --strict-limit refuses instead)"
        )
        return


def _endpoints(
    config: GenerateConfig,
    urls: list[str],
    caps: list[Any],
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
        ep.held_prior = prompt_guess + (output_limit or FALLBACK_MAX_TOKENS) / 2
        ep.set_capacity(cap, fleet_max, contexts[i])
        if cap is None:
            ep.state = "down"
            ep.fault = "not reachable"
            log(f"endpoint {ep.url}: not reachable now; probing every {config.probe_interval:g} s")
        else:
            ep.state = "up"
            reported = cap.max_running if cap.max_running else "not reported"
            if ep.kv_tokens:
                fitted = ep.fitted()
                reported = (
                    f"{fitted} (KV cache {ep.kv_tokens} tokens / ~{ep.held_tokens():.0f} "
                    f"a request, running cap {ep.running_cap or 'none'})"
                )
            how = "auto" if ep.auto else "fixed"
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
                f"concurrency {ep.limit} ({how}), {output}"
            )
        out.append(ep)
    return out


@contextlib.asynccontextmanager
async def _warming() -> AsyncIterator[asyncio.Future[None]]:
    """``_warm_up`` in a worker thread, beside probing and scanning (cancelled if unused)."""
    warm = asyncio.ensure_future(asyncio.to_thread(_warm_up))
    try:
        yield warm
    finally:
        if not warm.done():
            warm.cancel()


def _warm_up() -> None:
    """Encode one throw-away shard, so the first real flush does not pay pyarrow's lazy
    imports (about a second, and several under a busy event loop) while results wait."""
    from draftdata.formats import completions_table, failures_table
    from draftdata.records import Completion, Failure, Message, Turn
    from draftdata.store.read import parquet_bytes

    msg = [Message(role="user", content="warm-up")]
    parquet_bytes(completions_table([Completion(id="w", messages=msg, turns=[Turn(content="w")])]))
    parquet_bytes(failures_table([Failure(id="w", reason="warm_up")]))


def _install_signals(engine: Engine) -> Callable[[], None] | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, engine.interrupt)
        except (ValueError, RuntimeError, NotImplementedError):
            continue
        installed.append(sig)

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return restore
