"""The thinking mode each server applies by default, known per endpoint and per answer.

With ``reasoning: server`` the requests carry no ``enable_thinking`` and each server's own
default applies (``fleet sim --default-thinking``, vLLM's ``--default-chat-template-kwargs``,
…). tokenize must render each answer in the mode it was written in, or the empty
``<think>\\n\\n</think>\\n\\n`` that a thinking-off server put in the prompt would be rendered as
the target's output. Servers of one fleet may differ, and a server may be restarted with other
kwargs between a run and its resume, or during it; so the mode is learnt per endpoint and
recorded per answer (``Completion.server_thinking``), never once for the run.

``probe_thinking`` asks a server: the same one-token request without and with
``enable_thinking: false``; the same ``usage.prompt_tokens`` means the default is off (or the
template ignores the switch, where rendering with it off changes nothing), more tokens with it
off means the default is on. ``ThinkingMode`` is what an endpoint knows of its mode: generate
probes an endpoint before its first request of the command that may be answered without token
ids (``first``: a refused or no-op command asks nothing, nor ``--token-ids auto`` of a server
that returns them), again each time it comes back into service or passes a health check
after a connection error (``engine.py``), and again while the mode is unknown. An answer is
labelled with the mode only when the endpoint's mode was known when its request started and
neither changed nor was put in doubt by a suspected restart (``suspect``: a connection error, a
health check, the endpoint taken out) before it ended (``mark`` / ``since``); otherwise its
mode is unknown (None), and tokenize takes it from the prompt tokens the server counted, or
drops it (it never guesses).

When the run asks for token ids, the served prompt ids tell the mode themselves and nothing is
probed (``--token-ids on``). ``recorded`` keeps what an older run's manifest recorded once
(``server_chat_template_kwargs``) so the settings hash of its resume holds; nothing reads it as
the mode of an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from draftdata.errors import DraftdataError
from draftdata.store.opener import open_store
from draftdata.store.settings import recorded_settings


def recorded(out: str) -> dict[str, Any] | None:
    """What the run at ``out`` recorded once (``{}`` when it recorded nothing), None for a new
    run: kept on resume so the run's settings hash holds."""
    try:
        settings = recorded_settings(open_store(out))
    except DraftdataError:
        return None  # Run.open reports the problem with the prefix
    if settings is None:
        return None
    return dict(settings.server_chat_template_kwargs or {})


def needs_probe(reasoning: str, override_reasonings: Sequence[str | None], token_ids: str) -> bool:
    """Whether a run's answers need their servers' default mode: some request leaves it to the
    server (``reasoning: server``, the run's or an override's) and the served ids may not tell
    (``--token-ids`` off or auto)."""
    if token_ids == "on":
        return False
    return reasoning == "server" or "server" in override_reasonings


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
    return tokens if isinstance(tokens, int) and tokens > 0 else None


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


Mark = tuple[bool | None, int]  # (the mode when a request started, changes seen by then)


class ThinkingMode:
    """What generate knows of one endpoint's default thinking mode (module docstring)."""

    __slots__ = ("_last", "_lock", "asked", "changes", "probe", "untold", "value")

    def __init__(self) -> None:
        self.value: bool | None = None  # None: not known now (not probed, or it did not tell)
        self.changes = 0  # probes that found another mode, and suspected restarts
        self.asked = False  # probed at least once in this command
        self.untold = 0  # probes in a row the server did not answer (no usage, errors)
        # asks the server (the engine sets it where answers need the mode; None: never asked)
        self.probe: Callable[[], Awaitable[bool | None]] | None = None
        self._last: bool | None = None
        self._lock = asyncio.Lock()

    def learn(self, value: bool | None, asked_at: int | None = None) -> None:
        """A probe's answer (None: the server did not tell; the mode is unknown until a
        later probe tells). ``asked_at``: ``changes`` when the probe was sent; a restart
        suspected since makes its answer untold (it may be the old server's)."""
        if asked_at is not None and asked_at != self.changes:
            value = None
        self.asked = True
        self.untold = 0 if value is not None else self.untold + 1
        if value is not None and self._last is not None and value != self._last:
            self.changes += 1
        if value is not None:
            self._last = value
        self.value = value

    def suspect(self) -> None:
        """The server may have restarted (a connection error, a failed health check): its mode
        is unknown until the next probe, and no answer started before now keeps a label (it
        may have been written by the restarted server: a server restarted twice between two
        probes shows the same mode to both)."""
        self.value = None
        self.changes += 1

    async def first(self) -> None:
        """Probe once before the endpoint's first request (concurrent first requests wait for
        the one probe); nothing where no ``probe`` is set or it was asked already."""
        if self.probe is None or self.asked:
            return
        async with self._lock:
            if not self.asked:
                at = self.changes
                self.learn(await self.probe(), at)

    def mark(self) -> Mark:
        """Taken when a request starts."""
        return (self.value, self.changes)

    def since(self, mark: Mark) -> bool | None:
        """The mode an answer to a request started at ``mark`` was written in: the mode known
        then, if it is still the one known now and neither a probe found another nor a
        restart was suspected in between; else None (unknown)."""
        value, changes = mark
        if value is None or self.changes != changes or self.value != value:
            return None
        return value


RETRIES = 3  # probes in a row a server may leave untold before generate stops asking it again


def joined(a: bool | None, b: bool | None) -> bool | None:
    """The mode of turns labelled ``a`` and ``b`` (one answer's turns, several attempts):
    the same known mode, else unknown."""
    return a if a is not None and a == b else None
