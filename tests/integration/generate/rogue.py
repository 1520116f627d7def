"""A small misbehaving OpenAI-compatible server for the fault tests: a real aiohttp server on
127.0.0.1 (ephemeral port) on its own thread, that passes ``/health`` and ``/v1/models`` like a
healthy engine and answers chat requests the way ``behaviour`` says:

- ``echo``: an error (``status``) whose body repeats the request's headers, Authorization
  included, as some gateways do (to every ``every``-th chat request; the others are answered);
- ``hang``: never answers (the connection stays open);
- ``trickle``: a valid chat completion, one byte every ``interval`` seconds;
- ``huge``: a valid chat completion whose content is ``size`` bytes;
- ``usage``: a valid short answer with the given ``usage`` numbers (and ``content``).

``stats`` counts chat requests, and ``cut`` the answers whose client hung up before the whole
body was sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class RogueStats:
    """What the server saw."""

    chats: int = 0
    cut: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)


def chat_body(content: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A vLLM-shaped chat completion with one choice."""
    return {
        "id": "chatcmpl-rogue",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "rogue",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage or {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


class RogueServer:
    """``with RogueServer("hang", model=...) as rogue: rogue.url`` (see the module doc)."""

    def __init__(
        self,
        behaviour: str,
        *,
        model: str = "Qwen3.6-27B-sim",
        status: int = 401,
        interval: float = 1.0,
        size: int = 50 << 20,
        usage: dict[str, Any] | None = None,
        content: str = "Four.",
        every: int = 1,
    ) -> None:
        self.behaviour = behaviour
        self.every = every
        self.model = model
        self.status = status
        self.interval = interval
        self.size = size
        self.usage = usage
        self.content = content
        self.stats = RogueStats()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._stop = asyncio.Event()

    # -- routes -----------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        return web.json_response(data)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.chats += 1
        self.stats.headers.append(dict(request.headers))
        await request.read()
        if self.behaviour == "echo" and self.stats.chats % self.every:
            return web.json_response(chat_body(self.content))
        if self.behaviour == "echo":
            seen = "; ".join(f"{k}: {v}" for k, v in request.headers.items())
            message = f"request rejected by the gateway; headers received: {seen}"
            return web.json_response(
                {"error": {"message": message, "type": "Unauthorized"}}, status=self.status
            )
        if self.behaviour == "hang":
            await self._stop.wait()
            return web.Response(status=503)
        if self.behaviour == "usage":
            return web.json_response(chat_body(self.content, self.usage))
        if self.behaviour == "huge":
            body = json.dumps(chat_body("x" * self.size)).encode()
        else:  # trickle
            body = json.dumps(chat_body(self.content)).encode()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(body)
        await resp.prepare(request)
        step = 1 if self.behaviour == "trickle" else 1 << 20
        try:
            for i in range(0, len(body), step):
                await resp.write(body[i : i + step])
                if self.behaviour == "trickle":
                    await asyncio.sleep(self.interval)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self.stats.cut += 1
            raise
        return resp

    # -- lifecycle --------------------------------------------------------------------------

    async def _start(self) -> str:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{port}"

    async def _close(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> RogueServer:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
