"""The thinking mode a run's requests got from the server, found once and kept in the manifest.

With ``reasoning: server`` the requests carry no ``enable_thinking`` and the server's own default
applies (``fleet sim --reasoning off``, vLLM's ``--default-chat-template-kwargs``, …). tokenize
must render with that same mode, or the empty ``<think>\\n\\n</think>\\n\\n`` that a thinking-off
server put in the prompt would be rendered as the target's output. When the run asks for token
ids, tokenize reads the mode from each completion's served prompt ids. Without them (``--token-ids
off``) a fresh run asks the server once: the same one-token request without and with
``enable_thinking: false``; the same ``usage.prompt_tokens`` means the default is off (or the
template ignores the switch, where rendering with it off changes nothing), more tokens with it
off means the default is on. The answer goes into the run's settings as
``server_chat_template_kwargs``; a resumed run reuses what its manifest recorded (nothing, for
runs started before this existed) and asks nothing.

It does not choose a mode (``--reasoning on|off`` does) and never fails a run: a server that
does not answer the probe leaves the key out, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from draftdata.errors import DraftdataError
from draftdata.store.opener import open_store
from draftdata.store.settings import recorded_settings


def recorded(out: str) -> dict[str, Any] | None:
    """What the run at ``out`` recorded (``{}`` when it recorded nothing), None for a new run."""
    try:
        settings = recorded_settings(open_store(out))
    except DraftdataError:
        return None  # Run.open reports the problem with the prefix
    if settings is None:
        return None
    return dict(settings.server_chat_template_kwargs or {})


async def _prompt_tokens(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float
) -> int | None:
    try:
        async with session.post(
            url + "/v1/chat/completions",
            json=body,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            if resp.status != 200:
                return None
            data = await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None


async def probe_thinking(
    session: aiohttp.ClientSession, url: str, model: str, *, timeout: float = 30.0
) -> bool | None:
    """Whether ``url``'s default renders with thinking on (None: it did not tell)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "max_completion_tokens": 1,
    }
    plain = await _prompt_tokens(session, url, body, timeout)
    if plain is None:
        return None
    off = await _prompt_tokens(
        session, url, {**body, "chat_template_kwargs": {"enable_thinking": False}}, timeout
    )
    if off is None:
        return None
    return off > plain


async def server_kwargs(
    reasoning: str,
    token_ids: str,
    out: str,
    session: aiohttp.ClientSession,
    url: str | None,
    model: str,
) -> dict[str, Any]:
    """The template kwargs the server applied by default to this run's requests ({} unknown
    or not needed: every request says ``enable_thinking``, or the served ids will tell)."""
    if reasoning != "server":
        return {}
    before = await asyncio.to_thread(recorded, out)
    if before is not None:
        return before
    if url is None or token_ids != "off":
        return {}
    thinking = await probe_thinking(session, url, model)
    return {} if thinking is None else {"enable_thinking": thinking}
