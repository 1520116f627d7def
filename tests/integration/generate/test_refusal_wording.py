"""An endpoint that refuses chat requests is said in true words (issue 31): the server's status
and reason once (it was ``HTTP 404: HTTP 404`` for an answer without a reason), and where its
requests went as it is (it was ``5 requeued on the other endpoints`` with no other endpoint).

Generated over the refusal statuses x the bodies servers answer them with (none, the status
again as text, JSON in vLLM's, SGLang's and FastAPI's shapes, a reason) x whether a good server
is beside it, over real sockets: a small aiohttp server that passes /v1/models but refuses
every chat request, and the simulator."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import fast_config, write_prompts

from draftdata.errors import FleetUnavailableError
from draftdata.generate.stage import generate
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet

pytestmark = pytest.mark.integration

MODEL = SimConfig().model


def bodies(status: int) -> dict[str, tuple[bytes, str]]:
    """Body shapes (bytes, content type) of a refusal, by name; ``reason`` carries one."""
    return {
        "empty": (b"", "text/plain"),
        "status-text": (f"{status}: Not Found".encode(), "text/plain"),
        "http-status": (f"HTTP {status}".encode(), "text/plain"),
        "vllm-echo": (
            json.dumps({"error": {"message": f"HTTP {status}", "code": status}}).encode(),
            "application/json",
        ),
        "fastapi": (json.dumps({"detail": "Not Found"}).encode(), "application/json"),
        "reason": (
            json.dumps({"object": "error", "message": "the key was rotated"}).encode(),
            "application/json",
        ),
    }


class Refuser:
    """A server on a background loop: /v1/models and /health answer, chat is refused with
    ``status`` and ``body`` (set per example)."""

    def __init__(self) -> None:
        self.status = 404
        self.body: tuple[bytes, str] = (b"", "text/plain")
        self.loop = asyncio.new_event_loop()
        self.url = ""

    async def _models(self, _r: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _health(self, _r: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _chat(self, _r: web.Request) -> web.Response:
        body, kind = self.body
        return web.Response(body=body, status=self.status, content_type=kind)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> Refuser:
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def refuser() -> Iterator[Refuser]:
    with Refuser() as r:
        yield r


@pytest.fixture(scope="module")
def good() -> Iterator[SimFleet]:
    with SimFleet(1, SimConfig(time_scale=0.02, mean_output_tokens=30)) as f:
        yield f


@settings(
    max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    status=st.sampled_from([401, 403, 404, 405, 501]),
    shape=st.sampled_from(sorted(bodies(404))),
    beside=st.booleans(),
)
def test_a_refusing_endpoint_is_said_once_and_truly(
    tmp_path_factory: pytest.TempPathFactory,
    refuser: Refuser,
    good: SimFleet,
    status: int,
    shape: str,
    beside: bool,
) -> None:
    refuser.status, refuser.body = status, bodies(status)[shape]
    tmp = tmp_path_factory.mktemp("w")
    prompts = tmp / "p.jsonl"
    write_prompts(prompts, 12)
    urls = [refuser.url, *good.urls] if beside else [refuser.url]
    lines: list[str] = []
    cfg = fast_config(prompts, tmp / "run", urls, hedge=False, concurrency=4)
    if beside:
        generate(cfg, log=lines.append, handle_signals=False)
    else:
        with pytest.raises(FleetUnavailableError) as info:
            generate(cfg, log=lines.append, handle_signals=False)
        lines.append(str(info.value))
    said = [line for line in lines if refuser.url in line and "HTTP" in line]
    assert said, lines
    for line in said:
        assert line.count(f"HTTP {status}") == 1, line  # the status once
        assert f"HTTP {status}: HTTP" not in line and f"HTTP {status}: {status}" not in line
        if shape == "reason":
            assert f"HTTP {status}: the key was rotated" in line, line
        if not beside:
            assert "other endpoints" not in line and "elsewhere" not in line, line
    (out,) = [line for line in lines if "taken out" in line]
    if "requeued" in out and beside:
        assert "requeued on the other endpoints" in out, out


def test_fates_name_where_the_requests_go() -> None:
    from draftdata.generate.engine.dispatch import fates

    for others in (0, 1, 3):
        line = fates(moved=5, retried=2, running=1, abandoned=0, others=others)
        assert ("other endpoints" in line) == bool(others), line
        assert ("elsewhere" in line) == bool(others), line


def test_said_shows_status_and_reason_once(tmp_path: Path) -> None:
    from draftdata.errors import EndpointRefusedError

    cases = {
        ("HTTP 404", 404): "HTTP 404",
        ("404: Not Found", 404): "HTTP 404: Not Found",
        ("", 404): "HTTP 404",
        ("HTTP 401: bad key", 401): "HTTP 401: bad key",
        ("4040 widgets", 404): "HTTP 404: 4040 widgets",
        ("no answer", None): "no answer",
    }
    for (message, status), shown in cases.items():
        err = EndpointRefusedError(message, status=status)
        assert err.said == shown and str(err) == f"refused: {shown}"
