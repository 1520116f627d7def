"""One simulated inference server: aiohttp routes, fault injection, crash and restart.

``SimServer`` owns an ``aiohttp.web.AppRunner`` (created with ``handler_cancellation=True`` so a
client that gives up cancels its handler and frees its batch slot), a ``Batcher`` and per-server
counters. ``crash()`` closes the listening socket, ends every connection it accepted (served or
not yet: ``_Listener``) and drops the batch, as a killed process's kernel would; a request that
still reaches a handler of a crashed server is cut, never answered. ``restart()`` rebinds the
same port and reports /health 503 while "starting".
Response shapes live in ``shapes.py``, answers in ``request.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import secrets
import socket
import time
import weakref
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from draftdata.errors import RefusedRequestError
from draftdata.sim import shapes
from draftdata.sim.answers import digest, split_chunk
from draftdata.sim.config import SimConfig
from draftdata.sim.hidden import PendingWrite, file_bytes
from draftdata.sim.request import ChoiceOut, PrefixCache, Prepared, prepare
from draftdata.sim.scheduler import Batcher, Seq
from draftdata.sim.spec import SpecCounters
from draftdata.sim.tokens import Tokenizer

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _first_user(body: Any) -> Any:
    """The first user message's content of a chat body (None: none): what ``bad_prompts``
    judges a prompt by, the same in each request of its conversation."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict) and m.get("role") == "user":
            return m.get("content")
    return None


_REFUSALS = {
    # a server launched wrong for the run (another engine version, chat template or LoRA set)
    400: "Bad request: this server is configured differently (simulated)",
    401: "Invalid API key (simulated)",
    403: "Forbidden: this key may not use the model (simulated)",
    404: "The model does not exist (simulated)",
    405: "Method Not Allowed (simulated)",
    501: "Not Implemented (simulated)",
}

# Client disconnects are normal (hedged requests): keep aiohttp from logging them.
logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


_WEDGED = 1e12  # the step-time factor of a wedged server: no step ever ends


class _Listener(socket.socket):
    """A listening socket that remembers every connection it accepted (in ``accepted``).

    asyncio holds an accepted connection for a few loop turns before its transport exists and
    aiohttp knows of it; on Python 3.11 one accepted just before the server closes never gets a
    transport (``Server._attach`` asserts the server is open) and stays open, unread, until the
    garbage collector finds it: its client waits for an answer no crash would leave it waiting
    for. The crash ends these too."""

    def __init__(self, family: int, accepted: weakref.WeakSet[socket.socket]) -> None:
        super().__init__(family, socket.SOCK_STREAM)
        self.accepted = accepted

    def accept(self) -> tuple[socket.socket, Any]:
        conn, addr = super().accept()
        self.accepted.add(conn)
        return conn, addr


def _listen(host: str, port: int, accepted: weakref.WeakSet[socket.socket]) -> _Listener:
    """A non-blocking listening socket on (host, port), address reuse on (a restart rebinds the
    port its connections of before the crash may still hold in TIME_WAIT)."""
    family, _, _, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = _Listener(family, accepted)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ServerStats(msgspec.Struct, kw_only=True):
    """Counters of one server (readable while it runs)."""

    requests: int = 0
    served: int = 0
    rejected: int = 0
    cancelled: int = 0
    crashes: int = 0
    restarts: int = 0
    faults: dict[str, int] = msgspec.field(default_factory=dict)
    finished: dict[str, int] = msgspec.field(default_factory=dict)


class SimServer:
    """One OpenAI-compatible server on ``config.host``; ``port`` 0 picks a free port."""

    def __init__(self, index: int, config: SimConfig, tokenizer: Tokenizer, port: int = 0) -> None:
        self.index = index
        self.config = config
        self.tokenizer = tokenizer
        self.port = port
        self.stats = ServerStats()
        self.state = "down"
        self._ready_at = 0.0
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        self._accepted: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._batcher = Batcher(config, config.faults.slow.get(index, 1.0))
        self._cache = PrefixCache()
        self._rng = random.Random(digest(config.seed, "faults", index))
        self._crash_pending = index in config.faults.crash_after
        self._restart_task: asyncio.Task[None] | None = None
        self.spec = SpecCounters(config.spec_tokens) if config.spec_tokens > 0 else None
        # the template's default enable_thinking here (None: config.reasoning decides); a test
        # changes it to model a server restarted with other default chat-template kwargs
        self.default_thinking: bool | None = config.default_thinking.get(index)
        # hidden states (sim/hidden.py): prefills run under the batch's limit; writes not done
        self._prefill_slots = asyncio.Semaphore(config.max_running)
        self._prefilling = 0
        self._writes: dict[asyncio.Future[None], PendingWrite] = {}
        self._hidden_rng = random.Random(digest(config.seed, "hidden", index))

    @property
    def url(self) -> str:
        """The base URL (no trailing slash, no /v1)."""
        return f"http://{self.config.host}:{self.port}"

    # -- lifecycle -----------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._alive])
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        if self.config.hidden_states is not None:
            r.add_post("/v1/completions", self._completions)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health)
        r.add_get("/metrics", self._metrics)
        if self.config.flavor == "sglang":
            r.add_get("/health_generate", self._health_generate)
            r.add_get("/server_info", self._server_info)
            r.add_get("/get_server_info", self._server_info)
            r.add_get("/v1/loads", self._loads)
            r.add_get("/get_load", self._get_load)
            r.add_get("/get_model_info", self._model_info)
            r.add_get("/model_info", self._model_info)
        else:
            r.add_get("/version", self._version)
        return app

    async def start(self) -> None:
        """Bind and serve; /health is 503 for ``startup_s`` seconds."""
        self._runner = web.AppRunner(self._app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await self._bind(self.config.startup_s)
        self._batcher.start()

    async def _bind(self, starting_s: float) -> None:
        assert self._runner is not None
        site = web.SockSite(self._runner, _listen(self.config.host, self.port, self._accepted))
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        self._site = site
        self._ready_at = time.monotonic() + starting_s
        self.state = "up"

    def crash_pending_now(self) -> None:
        """The crash ``--crash-after`` has in store for this server, now (once)."""
        if self._crash_pending:
            self._crash_pending = False
            self.crash()

    def crash(self) -> None:
        """Die like a killed process: close the socket, drop every connection and the batch."""
        if self.state == "down" or self._runner is None:
            return
        self.state = "down"
        self.stats.crashes += 1
        site, self._site = self._site, None
        if site is not None:
            server = getattr(site, "_server", None)
            if server is not None:
                server.close()
            with contextlib.suppress(Exception):
                self._runner._unreg_site(site)
        handler = self._runner.server
        for conn in list(getattr(handler, "connections", [])):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()
        for conn in list(self._accepted):  # those aiohttp does not know of (yet): _Listener
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._batcher.drop_all()
        for task, pending in list(self._writes.items()):  # a dead engine writes nothing more
            task.cancel()
            pending.drop()
        delay = self.config.faults.restart_after
        if delay is not None:
            loop = asyncio.get_running_loop()
            self._restart_task = loop.create_task(self._restart_later(delay))

    def wedge(self, wedged: bool = True) -> None:
        """Stop answering without dying, as a deadlocked engine does: what runs and what
        comes stops making progress, while /health and the probes still answer (False:
        go on again)."""
        self._batcher.slow = _WEDGED if wedged else self.config.faults.slow.get(self.index, 1.0)

    async def _restart_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.restart()

    async def restart(self) -> None:
        """Come back on the same port; /health is 503 for ``faults.starting_s`` seconds."""
        if self.state != "down" or self._runner is None:
            return
        for _ in range(50):
            try:
                await self._bind(self.config.faults.starting_s)
                break
            except OSError:
                await asyncio.sleep(0.1)
        self.stats.restarts += 1

    async def stop(self) -> None:
        """Shut down for good (writes under way end first: a clean stop loses no file)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        self.state = "down"
        if self._restart_task is not None:
            self._restart_task.cancel()
        await self._batcher.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def starting(self) -> bool:
        """Whether the server is up but still in its "starting" period."""
        return self.state == "up" and time.monotonic() < self._ready_at

    def load(self) -> tuple[int, int]:
        """(running, waiting) sequences (hidden-state prefills count as running)."""
        return len(self._batcher.running) + self._prefilling, len(self._batcher.waiting)

    # -- helpers ---------------------------------------------------------------------------

    def _error(
        self, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        body = _encode(shapes.error_body(self.config.flavor, status, message))
        return web.Response(
            body=body, status=status, content_type="application/json", headers=headers
        )

    def _json(self, data: Any) -> web.Response:
        return web.Response(body=_encode(data), content_type="application/json")

    def _draw_fault(self) -> str | None:
        f = self.config.faults
        if not f.applies_to(self.index):
            return None
        u = self._rng.random()
        acc = 0.0
        for name, rate in f.rates():
            acc += rate
            if rate > 0 and u < acc:
                self.stats.faults[name] = self.stats.faults.get(name, 0) + 1
                return name
        return None

    async def _forever(self) -> web.StreamResponse:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    # -- routes ----------------------------------------------------------------------------

    @web.middleware
    async def _alive(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A request that reaches a crashed server (its connection was accepted before the
        crash, its handler ran after) is cut, as the dead process's would be."""
        if self.state == "down":
            if request.transport is not None:
                request.transport.abort()
            return await self._forever()
        response: web.StreamResponse = await handler(request)
        return response

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.starting() else 200)

    async def _health_generate(self, request: web.Request) -> web.Response:
        if self.starting():
            return web.Response(status=503)
        await asyncio.sleep(self.config.step_s(1))
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        return self._json(shapes.models(self.config))

    async def _version(self, request: web.Request) -> web.Response:
        return self._json({"version": self.config.version})

    async def _model_info(self, request: web.Request) -> web.Response:
        return self._json(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.tokenizer or self.config.model_path,
                "is_generation": True,
            }
        )

    async def _server_info(self, request: web.Request) -> web.Response:
        tput = self._batcher.throughput()
        accept = self.spec.avg_accept_length() if self.spec is not None else None
        return self._json(
            shapes.server_info(self.config, self.port, tput, self.config.tokenizer, accept)
        )

    def _used_tokens(self) -> int:
        return sum(s.prompt_tokens + s.done for s in self._batcher.running)

    async def _loads(self, request: web.Request) -> web.Response:
        running, waiting = self.load()
        return self._json(shapes.loads(running, waiting, self._used_tokens(), self.config.dp_size))

    async def _get_load(self, request: web.Request) -> web.Response:
        running, waiting = self.load()
        body = shapes.loads(running, waiting, self._used_tokens(), self.config.dp_size)
        old = [
            {
                "dp_rank": r["dp_rank"],
                "num_reqs": r["num_running_reqs"] + r["num_waiting_reqs"],
                "num_waiting_reqs": r["num_waiting_reqs"],
                "num_tokens": r["num_used_tokens"],
            }
            for r in body["loads"]
        ]
        return self._json(old)

    async def _metrics(self, request: web.Request) -> web.Response:
        running, waiting = self.load()
        text = shapes.metrics(
            self.config,
            running,
            waiting,
            self._batcher.generated_tokens,
            self._batcher.prompt_tokens,
            self.stats.finished,
            self._batcher.throughput(),
            self.spec,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _admit(self, request: web.Request) -> tuple[Any, str | None] | web.StreamResponse:
        """The faults every generating route (chat, and hidden states' completions) goes
        through before its work: starting, a crash, a refusal, an unreadable body, and the
        drawn rate faults that answer at once. Returns (the decoded body, the drawn fault
        still to apply) or the answer to send instead."""
        if self.starting():
            return self._error(503, "The server is starting; retry shortly.")
        self.stats.requests += 1
        crash_n = self.config.faults.crash_after.get(self.index)
        if self._crash_pending and crash_n is not None and self.stats.requests >= crash_n:
            self._crash_pending = False
            self.crash()
            return await self._forever()
        refuse = self.config.faults.refuse.get(self.index)
        if refuse is not None and self.stats.requests > self.config.faults.refuse_after:
            self.stats.faults["refuse"] = self.stats.faults.get("refuse", 0) + 1
            return self._error(refuse, _REFUSALS.get(refuse, "Refused (simulated)"))
        try:
            body = _decode(await request.read())
        except msgspec.DecodeError as exc:
            self.stats.rejected += 1
            return self._error(400, f"JSON decode error: {exc}")
        fault = self._draw_fault()
        if fault == "error_500":
            return self._error(500, "Internal server error: simulated failure")
        if fault == "error_503":
            return self._error(503, "Service unavailable: simulated overload")
        if fault == "error_400":
            return self._error(400, "Invalid request: simulated refusal")
        if fault == "error_429":
            retry = str(self.config.faults.retry_after_s)
            return self._error(429, "Too many requests: simulated", {"Retry-After": retry})
        if fault == "hang":
            return await self._forever()
        if fault == "reset":
            return await self._reset(request)
        return body, fault

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        body, fault = admitted
        bad = self.config.faults.bad_prompts
        if bad and digest("bad prompt", _first_user(body)) < bad * 2**64:
            self.stats.faults["bad_prompt"] = self.stats.faults.get("bad_prompt", 0) + 1
            return self._error(400, "Invalid request: this prompt cannot be rendered (simulated)")
        try:
            prep = prepare(
                body,
                self.config,
                self.tokenizer,
                self._cache,
                self.default_thinking,
                requests=self.stats.requests,
            )
        except RefusedRequestError as exc:
            self.stats.rejected += 1
            return self._error(exc.status, exc.message)
        if fault == "context_400":
            n = len(prep.prompt_ids)
            ctx = self.config.context_length
            msg = shapes.context_message(self.config.flavor, n, max(ctx - n, 1), ctx)
            return self._error(400, msg or "context length exceeded (simulated)")
        if prep.stream:
            return await self._stream(request, prep, malformed=fault == "malformed")
        await self._generate(prep)
        data = _encode(self._completion(prep))
        self._count_finished(prep)
        if fault == "malformed":
            data = data[: max(1, len(data) // 2)]
        self.stats.served += 1
        return web.Response(body=data, content_type="application/json")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        """A prefill-only request of hidden-state extraction (``sim/hidden.py``)."""
        admitted = await self._admit(request)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        body, fault = admitted
        cfg = self.config
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
        ):
            self.stats.rejected += 1
            return self._error(400, "prompt: a non-empty list of token ids is expected")
        model = body.get("model")
        if model not in (None, cfg.model):
            self.stats.rejected += 1
            return self._error(404, f"The model `{model}` does not exist.")
        ids = [int(i) for i in prompt]
        if fault == "context_400" or len(ids) >= cfg.context_length:
            msg = shapes.context_message("vllm", len(ids), 1, cfg.context_length)
            return self._error(400, msg or "context length exceeded (simulated)")
        slow = cfg.faults.slow.get(self.index, 1.0)
        async with self._prefill_slots:
            self._prefilling += 1
            try:
                prefill = len(ids) * cfg.prefill_per_token_s * cfg.time_scale * slow
                await asyncio.sleep(prefill + cfg.step_s(1, slow))  # and its one token
            finally:
                self._prefilling -= 1
        self._batcher.prompt_tokens += len(ids)
        # unique across servers and processes that share the folder (as vLLM's request ids)
        rid = f"cmpl-{secrets.token_hex(8)}"
        folder = Path(cfg.hidden_states or ".")
        path = folder / f"{rid}-0-{secrets.token_hex(4)}.safetensors"
        pending = PendingWrite(path)
        await asyncio.to_thread(pending.open)
        data: bytes | None = None
        f = cfg.faults
        u = self._hidden_rng.random() if f.applies_to(self.index) else 1.0
        if u < f.hidden_missing:
            self.stats.faults["hidden_missing"] = self.stats.faults.get("hidden_missing", 0) + 1
        else:
            stored = ids
            if u < f.hidden_missing + f.hidden_wrong_ids:
                self.stats.faults["hidden_wrong_ids"] = (
                    self.stats.faults.get("hidden_wrong_ids", 0) + 1
                )
                stored = [*ids[1:], ids[0]]  # another sample's ids: same length, not these
            data = file_bytes(ids, cfg.hidden_layers, cfg.hidden_size, stored_ids=stored)
        task = asyncio.ensure_future(pending.finish(data, cfg.hidden_write_s * cfg.time_scale))
        self._writes[task] = pending
        task.add_done_callback(lambda t: self._writes.pop(t, None))
        answer = shapes.hidden_completion(cfg, rid, len(ids), str(path))
        self.stats.served += 1
        self.stats.finished["length"] = self.stats.finished.get("length", 0) + 1
        data_out = _encode(answer)
        if fault == "malformed":
            data_out = data_out[: max(1, len(data_out) // 2)]
        return web.Response(body=data_out, content_type="application/json")

    async def _reset(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.content_length = 4096
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            await resp.write(b'{"id": "chatcmpl-reset", "object": "chat.completion", "choi')
        if request.transport is not None:
            request.transport.abort()
        return resp

    def _count_finished(self, prep: Prepared) -> None:
        for c in prep.choices:
            if self.spec is not None and c.spec is not None:
                self.spec.add(c.spec, len(c.ids))
            key = "stop" if c.finish in ("stop", "tool_calls") else c.finish
            self.stats.finished[key] = self.stats.finished.get(key, 0) + 1

    def _seqs(self, prep: Prepared, progress: asyncio.Event | None) -> list[Seq]:
        n_prompt = len(prep.prompt_ids)
        return [Seq(len(c.ids), n_prompt, progress) for c in prep.choices]

    async def _generate(self, prep: Prepared) -> None:
        """Wait until every choice has been decoded by the batcher."""
        if self.config.time_scale <= 0:
            self._batcher.generated_tokens += sum(len(c.ids) for c in prep.choices)
            self._batcher.prompt_tokens += len(prep.prompt_ids)
            return
        seqs = self._seqs(prep, None)
        for s in seqs:
            self._batcher.submit(s)
        try:
            await asyncio.gather(*(s.finished for s in seqs))
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            for s in seqs:
                self._batcher.cancel(s)
            raise

    def _completion(self, prep: Prepared) -> dict[str, Any]:
        flavor = self.config.flavor
        choices = []
        for i, c in enumerate(prep.choices):
            msg = shapes.message(flavor, c.parsed, c.calls)
            choices.append(
                shapes.choice(
                    flavor,
                    i,
                    msg,
                    c.finish,
                    c.matched_stop,
                    prep.prompt_ids if prep.want_prompt_ids else None,
                    c.ids if prep.want_output_ids else None,
                )
            )
        return shapes.completion(
            flavor,
            prep.rid,
            prep.model,
            choices,
            self._usage(prep),
            prep.prompt_ids if prep.want_prompt_ids else None,
            self._spec_details(prep),
        )

    def _spec_details(self, prep: Prepared) -> Any:
        """SGLang's ``sglext.spec_tokens_details`` (a list when ``n`` > 1), when asked for."""
        if not prep.want_spec_details or self.spec is None:
            return None
        details = [c.spec.details(len(c.ids)) for c in prep.choices if c.spec is not None]
        return details if len(prep.choices) > 1 else (details[0] if details else None)

    def _usage(self, prep: Prepared) -> dict[str, Any] | None:
        # --usage none: no usage object (a server that sends none); zero: 0 completion tokens
        if self.config.usage == "none":
            return None
        completion = sum(len(c.ids) for c in prep.choices) if self.config.usage == "full" else 0
        return shapes.usage(
            self.config.flavor,
            len(prep.prompt_ids),
            completion,
            prep.cached_tokens,
            sum(c.reasoning_tokens for c in prep.choices),
        )

    async def _stream(
        self, request: web.Request, prep: Prepared, malformed: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        progress = asyncio.Event()
        seqs: list[Seq] = []
        if self.config.time_scale > 0:
            seqs = self._seqs(prep, progress)
            for s in seqs:
                self._batcher.submit(s)
        try:
            await self._stream_body(resp, prep, seqs, progress, malformed)
        except (asyncio.CancelledError, ConnectionError):
            self.stats.cancelled += 1
            for s in seqs:
                self._batcher.cancel(s)
            raise
        self.stats.served += 1
        self._count_finished(prep)
        return resp

    async def _stream_body(
        self,
        resp: web.StreamResponse,
        prep: Prepared,
        seqs: list[Seq],
        progress: asyncio.Event,
        malformed: bool,
    ) -> None:
        flavor = self.config.flavor
        out = _SSE(resp, flavor, prep, self.config.model)
        first_prompt = prep.prompt_ids if prep.want_prompt_ids else None
        for i in range(len(prep.choices)):
            role = shapes.delta(flavor, role="assistant", content="")
            await out.send([shapes.stream_choice(flavor, i, role)], prompt_ids=first_prompt)
            first_prompt = None
            if malformed:
                await resp.write(b'data: {"id": "' + prep.rid.encode() + b'", "choi\n\n')
        sent = [0] * len(prep.choices)
        step = self.config.stream_interval
        while True:
            if seqs:
                if all(s.finished.done() for s in seqs) and all(
                    sent[i] >= s.done for i, s in enumerate(seqs)
                ):
                    break
                await progress.wait()
                progress.clear()
                if any(s.finished.cancelled() for s in seqs):
                    raise ConnectionError("the server dropped the request")
                targets = [s.done for s in seqs]
            else:
                if all(sent[i] >= len(c.ids) for i, c in enumerate(prep.choices)):
                    break
                targets = [min(len(c.ids), sent[i] + step) for i, c in enumerate(prep.choices)]
            for i, c in enumerate(prep.choices):
                while targets[i] > sent[i]:
                    upto = min(targets[i], sent[i] + step)
                    await out.tokens(i, c, sent[i], upto)
                    sent[i] = upto
        usage = self._usage(prep)
        if prep.include_usage and usage is not None:
            await out.send([], usage_=usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()


class _SSE:
    """Writes the chunks of one streaming response."""

    def __init__(self, resp: web.StreamResponse, flavor: str, prep: Prepared, model: str) -> None:
        self.resp = resp
        self.flavor = flavor
        self.prep = prep
        self.model = prep.model if flavor == "sglang" else model
        self.calls_sent: collections.defaultdict[int, int] = collections.defaultdict(int)

    async def send(
        self,
        choices: list[dict[str, Any]],
        usage_: dict[str, Any] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> None:
        data = shapes.chunk(
            self.flavor, self.prep.rid, self.model, choices, usage_=usage_, prompt_ids=prompt_ids
        )
        await self.resp.write(b"data: " + _encode(data) + b"\n\n")

    async def tokens(self, i: int, c: ChoiceOut, t0: int, t1: int) -> None:
        """Emit tokens [t0, t1) of choice ``i`` (and its finish chunk when t1 is the end)."""
        f = self.flavor
        a = c.ends[t0 - 1] if 0 < t0 <= len(c.ends) else (0 if t0 == 0 else len(c.text))
        b = c.ends[t1 - 1] if 0 < t1 <= len(c.ends) else len(c.text)
        reasoning, content, done_calls = split_chunk(c.parsed, c.text, a, b)
        ids = c.ids[t0:t1] if self.prep.want_output_ids and f == "vllm" else None
        final = t1 >= len(c.ids)
        pending: list[dict[str, Any]] = []
        if reasoning:
            pending.append(shapes.stream_choice(f, i, shapes.delta(f, reasoning=reasoning)))
        if content:
            pending.append(shapes.stream_choice(f, i, shapes.delta(f, content=content)))
        for k in done_calls:
            call = c.calls[k]
            head = {"index": k, "id": call["id"], "type": "function"}
            fn = call["function"]
            pending.append(
                shapes.stream_choice(
                    f,
                    i,
                    shapes.delta(
                        f, tool_calls=[{**head, "function": {"name": fn["name"], "arguments": ""}}]
                    ),
                )
            )
            tail: dict[str, Any] = {"index": k, "function": {"arguments": fn["arguments"]}}
            if f == "sglang":
                tail = {"index": k, "id": None, "type": "function", **tail}
                tail["function"]["name"] = None
            pending.append(shapes.stream_choice(f, i, shapes.delta(f, tool_calls=[tail])))
        if not pending and ids:
            pending.append(shapes.stream_choice(f, i, shapes.delta(f)))
        if ids is not None and pending:
            pending[-1]["token_ids"] = ids
        for ch in pending:
            await self.send([ch])
        if final:
            fin = shapes.stream_choice(f, i, shapes.delta(f), c.finish, c.matched_stop)
            if f == "vllm" and self.prep.want_output_ids and "token_ids" not in fin:
                fin["token_ids"] = [] if pending else ids or []
            await self.send([fin])
