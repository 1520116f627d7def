"""Everything generate checks before it opens a run: nothing is recorded until these pass.

``preflight`` runs the checks in order and returns what the run is opened with (``Preflight``):
the endpoints' probed capacities (at least one must answer, else a one-line FleetError), one
model across the fleet and against a resumed run's (``run_model.py``), the output limits against
each endpoint's context (``check_limits``), token ids where ``--token-ids on`` asks for them
(``check_token_ids``), the prompt files' schema and identity (``source.scan``), and the run's
settings (``run_settings``: what the manifest hashes). Reading the options is here too: the
endpoints' URLs (``endpoint_urls``), the API key (``api_key``, ``check_credentials``).

It opens no run and sends no chat request but the one-token ``--token-ids on`` check.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec

from draftdata.errors import ConfigError, FleetError, ServerError
from draftdata.generate.answers.thinking import recorded
from draftdata.generate.config import GenerateConfig, Sampling
from draftdata.generate.engine.client import EndpointClient, token_ids_refusal
from draftdata.generate.engine.request import Request
from draftdata.generate.prompts.partition import Partition, parse_partition
from draftdata.generate.prompts.rejects import check_schema
from draftdata.generate.prompts.source import PromptFile, Scan, scan
from draftdata.generate.run_model import check_fleet_models, check_resume_model, recorded_model
from draftdata.records import Message
from draftdata.shared.endpoints import Capacity, api_key_from_env, base_url, probe_capacity
from draftdata.shared.fleetspec import read_fleet
from draftdata.store.settings import PromptsIdentity, RunSettings
from draftdata.support.redact import redact_url

Log = Callable[[str], None]


@dataclass(frozen=True)
class Preflight:
    """What the checks found: the run is opened and the engine started with it."""

    caps: list[Capacity | None]  # per endpoint URL; None: not reachable now
    model: str  # the run's model: configured, served, recorded, or "default"
    partition: Partition | None
    found: Scan  # the prompt files' identity and counts in scope
    settings: RunSettings  # what the run's manifest records and hashes (``run_settings``)


async def preflight(
    config: GenerateConfig,
    files: list[PromptFile],
    urls: list[str],
    contexts: list[int | None],
    key: str | None,
    session: aiohttp.ClientSession,
    log: Log,
) -> Preflight:
    """Probe the endpoints and check everything that can be checked before a run is opened
    (module docstring); a DraftdataError names the first problem in one line."""
    timeout = min(10.0, config.connect_timeout)
    shown = [redact_url(u) for u in urls]
    caps = list(await asyncio.gather(*(probe_capacity(session, u, timeout=timeout) for u in urls)))
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
        await check_token_ids(config, urls, caps, key, model)
    part = parse_partition(config.partition) if config.partition else None
    await asyncio.to_thread(check_schema, files, config.limit)
    found = await asyncio.to_thread(scan, files, limit=config.limit, partition=part)
    settings = run_settings(config, found, model)
    if config.reasoning == "server" and (before := await asyncio.to_thread(recorded, config.out)):
        # an older run recorded one mode for all its answers: kept, so its hash holds
        settings = msgspec.structs.replace(settings, server_chat_template_kwargs=before)
    return Preflight(caps=caps, model=model, partition=part, found=found, settings=settings)


def run_settings(config: GenerateConfig, prompts: Scan, model: str) -> RunSettings:
    """The settings whose hash identifies the run (module docstring)."""
    kwargs: dict[str, Any] = dict(config.extra_body.get("chat_template_kwargs") or {})
    if config.reasoning != "server":
        kwargs["enable_thinking"] = config.reasoning == "on"
    return RunSettings(
        stage="generate",
        prompts=PromptsIdentity(sha256=prompts.sha256, lines=prompts.prompts, bytes=prompts.bytes),
        model=model,
        max_tokens=config.max_tokens if config.max_tokens is not None else "auto",
        strict_limit=config.strict_limit,
        sampling=msgspec.to_builtins(config.sampling),
        reasoning=config.reasoning,
        chat_template_kwargs=kwargs,
        keep_reasoning_history=config.keep_reasoning_history,
        n=config.n,
        overrides=msgspec.to_builtins(config.overrides),
        extra_body=config.extra_body,
    )


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
    return api_key_from_env(config.api_key_env)


def check_credentials(urls: list[str], key: str | None) -> None:
    """ConfigError when a URL carries a user (HTTP basic auth) and an API key is given too:
    both would be the one ``Authorization`` header of every request."""
    if key is None:
        return
    with_user = [u for u in urls if urlsplit(u).username is not None]
    if with_user:
        raise ConfigError(
            f"--api-key-env: {redact_url(with_user[0])} carries a user and password (sent as "
            "HTTP basic auth) and --api-key-env sends a key in the same Authorization header; "
            "give one of the two (the URL without user:password@, or no --api-key-env)"
        )


def check_limits(
    config: GenerateConfig,
    urls: list[str],
    caps: list[Capacity | None],
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


async def check_token_ids(
    config: GenerateConfig,
    urls: list[str],
    caps: list[Capacity | None],
    key: str | None,
    model: str,
) -> None:
    """``--token-ids on``: one 1-token request per reachable endpoint; refuse (one line) before
    the run is opened when one answers without token ids. An endpoint that cannot be asked now
    is checked by the engine when it first answers."""

    async def ask(url: str, served: str | None) -> bool | None:
        request = Request(
            messages=[Message(role="user", content="Say OK.")],
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
                await c.chat(request)
            except ServerError:
                return None
            return c.token_ids_supported

    up = [(u, c) for u, c in zip(urls, caps, strict=True) if c is not None]
    answers = await asyncio.gather(*(ask(u, c.model) for u, c in up))
    for (url, _), ok in zip(up, answers, strict=True):
        if ok is False:
            raise ConfigError(token_ids_refusal(redact_url(url)))
