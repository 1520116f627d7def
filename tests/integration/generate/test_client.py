"""EndpointClient against real servers on 127.0.0.1: the simulator in both flavours (every fault
knob to its error type, reasoning modes, tools, n, token ids) and a strict server for token-id
detection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
from aiohttp import web

from draftdata.errors import (
    ConnectionLostError,
    ContextLengthError,
    EndpointRefusedError,
    FatalRequestError,
    MalformedAnswerError,
    RateLimitedError,
    RequestTimeoutError,
    RetryableServerError,
    ServerError,
)
from draftdata.generate.config import Reasoning, Sampling
from draftdata.generate.engine.client import EndpointClient
from draftdata.generate.engine.request import Request
from draftdata.records import Message
from draftdata.shared.conversation import TurnPlan
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration

FLAVORS = ["sglang", "vllm"]
MODEL = "Qwen3.6-27B-sim"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def sim(flavor: str, **kw: Any) -> SimFleet:
    base: dict[str, Any] = {"flavor": flavor, "time_scale": 0.0, "mean_output_tokens": 60}
    base.update(kw)
    return SimFleet(1, SimConfig(**base))


def chat_body(
    text: str = "Explain sorting.",
    *,
    max_tokens: int = 512,
    reasoning: Reasoning = "on",
    n: int = 1,
    token_ids: bool = True,
    tools: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Request:
    return Request(
        messages=[Message(role="user", content=text)],
        tools=tools,
        model=MODEL,
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.6, seed=1),
        reasoning=reasoning,
        n=n,
        token_ids=token_ids,
        extra_body=extra or {},
    )


@pytest.fixture(params=FLAVORS)
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fleet(flavor: str) -> Iterator[SimFleet]:
    with sim(flavor) as f:
        yield f


async def test_answer_with_reasoning_usage_and_token_ids(fleet: SimFleet) -> None:
    async with EndpointClient(fleet.urls[0] + "/v1") as client:
        (turn,) = await client.chat(chat_body())
        assert client.token_ids_supported is True
    assert turn.finish_reason == "stop"
    assert turn.reasoning and turn.content
    assert turn.prompt_token_ids and turn.output_token_ids
    assert turn.usage.completion_tokens == len(turn.output_token_ids)
    assert turn.usage.prompt_tokens == len(turn.prompt_token_ids)


async def test_reasoning_off_has_no_reasoning(fleet: SimFleet) -> None:
    async with EndpointClient(fleet.urls[0]) as client:
        (turn,) = await client.chat(chat_body(reasoning="off"))
    assert turn.reasoning is None and turn.content


@pytest.mark.parametrize("max_tokens", [512, 12])
async def test_inline_think_parses_like_the_server_parser(flavor: str, max_tokens: int) -> None:
    # the same seeded answer through the server's reasoning parser and raw inline: equal turns,
    # including an answer cut inside its reasoning by max tokens
    results = []
    for mode in ("parsed", "inline"):
        with sim(flavor, reasoning=mode) as f:
            async with EndpointClient(f.urls[0]) as client:
                results.append(await client.chat(chat_body(max_tokens=max_tokens)))
    parsed, inline = results
    assert parsed == inline
    if max_tokens == 12:
        assert parsed[0].finish_reason == "length" and parsed[0].content is None
        assert parsed[0].reasoning


async def test_tool_calls(flavor: str) -> None:
    with sim(flavor, tool_call_rate=1.0) as f:
        async with EndpointClient(f.urls[0]) as client:
            (turn,) = await client.chat(chat_body("Weather in Paris?", tools=TOOLS))
    assert turn.finish_reason == "tool_calls"
    assert turn.tool_calls
    call = turn.tool_calls[0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert "city" in msgspec.json.decode(call["function"]["arguments"])


async def test_n_samples_and_multi_turn_history(fleet: SimFleet) -> None:
    async with EndpointClient(fleet.urls[0]) as client:
        turns = await client.chat(chat_body(n=3))
        assert len(turns) == 3
        assert len({t.content for t in turns}) == 3  # distinct samples
        for t in turns:
            assert t.output_token_ids is not None
            assert t.usage.completion_tokens == len(t.output_token_ids)
        # feed the first answer back and ask a follow-up
        prompt = [
            Message(role="user", content="Explain sorting."),
            Message(role="user", content="Shorter, please."),
        ]
        history = TurnPlan(prompt).context(1, turns[:1])
        assert [m.role for m in history] == ["user", "assistant", "user"]
        body = Request(
            messages=history,
            tools=None,
            model=MODEL,
            max_tokens=256,
            sampling=Sampling(),
            reasoning="on",
            n=1,
            token_ids=True,
            extra_body={},
        )
        (second,) = await client.chat(body)
    assert second.content and second.prompt_token_ids
    assert len(second.prompt_token_ids) > len(turns[0].prompt_token_ids or [])


async def test_many_concurrent_requests_share_a_small_pool(fleet: SimFleet) -> None:
    async with EndpointClient(fleet.urls[0], pool_size=4) as client:
        bodies = [chat_body(f"question {i}") for i in range(40)]
        results = await asyncio.gather(*(client.chat(b) for b in bodies))
    assert all(len(r) == 1 and r[0].content for r in results)


# -- faults ------------------------------------------------------------------------------------

FAULTS = [
    ({"error_500": 1.0}, RetryableServerError, 500),
    ({"error_503": 1.0}, RetryableServerError, 503),
    ({"error_429": 1.0, "retry_after_s": 3}, RateLimitedError, 429),
    ({"context_400": 1.0}, ContextLengthError, 400),
    ({"reset": 1.0}, ConnectionLostError, None),
    ({"hang": 1.0}, RequestTimeoutError, None),
    ({"malformed": 1.0}, MalformedAnswerError, 200),
]


@pytest.mark.parametrize(
    ("knob", "expected", "status"), FAULTS, ids=[f[1].reason + str(f[0]) for f in FAULTS]
)
async def test_fault_knobs_map_to_classes(
    flavor: str, knob: dict[str, Any], expected: type[ServerError], status: int | None
) -> None:
    with sim(flavor, faults=FaultConfig(**knob)) as f:
        async with EndpointClient(f.urls[0], read_timeout=0.5) as client:
            with pytest.raises(ServerError) as info:
                await client.chat(chat_body())
    err = info.value
    assert type(err) is expected
    assert err.status == status
    assert isinstance(err, FatalRequestError) == (expected is ContextLengthError)
    if expected is RateLimitedError:
        assert err.retry_after == 3.0
    if expected is ContextLengthError:
        assert "context length" in err.message


async def test_real_context_overflow_is_fatal(flavor: str) -> None:
    with sim(flavor, context_length=64) as f:
        async with EndpointClient(f.urls[0]) as client:
            with pytest.raises(ServerError) as info:
                await client.chat(chat_body("word " * 200))
    assert type(info.value) is ContextLengthError


async def test_unknown_model_is_a_refusal_not_the_prompts_fault() -> None:
    with sim("vllm") as f:
        async with EndpointClient(f.urls[0]) as client:
            body = msgspec.structs.replace(chat_body(), model="no-such-model")
            with pytest.raises(ServerError) as info:
                await client.chat(body)
    assert type(info.value) is EndpointRefusedError and info.value.status == 404
    assert not isinstance(info.value, FatalRequestError)


async def test_crashed_and_restarted_server(flavor: str) -> None:
    with sim(flavor, faults=FaultConfig(starting_s=0.3)) as f:
        async with EndpointClient(f.urls[0], connect_timeout=1) as client:
            await client.chat(chat_body())
            f.crash(0)
            with pytest.raises(ServerError) as info:
                await client.chat(chat_body())
            assert type(info.value) is ConnectionLostError
            f.restart(0)
            with pytest.raises(ServerError) as info:
                await client.chat(chat_body())  # 503 while starting
            assert type(info.value) is RetryableServerError
            await asyncio.sleep(0.4)
            (turn,) = await client.chat(chat_body())
            assert turn.content


async def test_unreachable_endpoint_is_connection() -> None:
    with sim("sglang") as f:
        url = f.urls[0]
    async with EndpointClient(url, connect_timeout=1) as client:
        with pytest.raises(ServerError) as info:
            await client.chat(chat_body())
        assert type(info.value) is ConnectionLostError


# -- token-id detection against a strict and a plain server ------------------------------------


async def test_cancelled_request_frees_the_server_slot() -> None:
    # a hedged request that loses is cancelled: the connection closes and the server drops it
    with sim("sglang", time_scale=1.0, mean_output_tokens=2000) as f:
        async with EndpointClient(f.urls[0]) as client:
            task = asyncio.create_task(client.chat(chat_body(max_tokens=4000)))
            for _ in range(100):
                await asyncio.sleep(0.02)
                if f.load(0)[0] == 1:
                    break
            assert f.load(0) == (1, 0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                await asyncio.sleep(0.02)
                if f.stats(0).cancelled:
                    break
            assert f.stats(0).cancelled == 1 and f.load(0) == (0, 0)


class Recorder:
    """A tiny OpenAI-compatible server: ``strict`` 400s on unknown fields, like a pydantic
    model with extra="forbid"; otherwise it answers without token ids. ``finish`` is the
    finish_reason it answers with."""

    def __init__(self, strict: bool, finish: str = "stop") -> None:
        self.strict = strict
        self.finish = finish
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.peers: list[int | None] = []  # client port of each request

    async def chat(self, request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read())
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.peers.append(peer[1] if peer else None)
        if self.strict:
            for key in ("return_token_ids", "return_prompt_token_ids"):
                if key in body:
                    msg = f"1 validation error: {key}: Extra inputs are not permitted"
                    return web.json_response({"error": {"message": msg, "code": 400}}, status=400)
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "<think>r</think>ok"},
                        "finish_reason": self.finish,
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )


@contextlib.asynccontextmanager
async def serve(rec: Recorder) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", rec.chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture(params=[True, False], ids=["strict", "plain"])
async def recorder(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder(strict=bool(request.param))
    async with serve(rec) as url:
        yield rec, url


async def test_connections_are_kept_alive_and_pooled() -> None:
    rec = Recorder(strict=False)
    async with serve(rec) as url, EndpointClient(url, pool_size=3) as client:
        for _ in range(5):
            await client.chat(chat_body())
        assert len(set(rec.peers)) == 1  # one connection, reused
        await asyncio.gather(*(client.chat(chat_body()) for _ in range(12)))
    assert len(set(rec.peers)) <= 3  # never more connections than the pool


async def test_aborted_answer_is_a_server_error() -> None:
    async with serve(Recorder(strict=False, finish="abort")) as url, EndpointClient(url) as c:
        with pytest.raises(ServerError) as info:
            await c.chat(chat_body())
    assert type(info.value) is RetryableServerError


async def test_token_id_support_detected_once(recorder: tuple[Recorder, str]) -> None:
    rec, url = recorder
    async with EndpointClient(url, api_key="sk-test-123") as client:
        for _ in range(3):
            (turn,) = await client.chat(chat_body())
            assert (turn.reasoning, turn.content, turn.output_token_ids) == ("r", "ok", None)
        assert client.token_ids_supported is False
    asked = ["return_token_ids" in b for b in rec.bodies]
    # strict: asked, refused, asked again without; plain: asked once, answered without ids
    assert asked == ([True, False, False, False] if rec.strict else [True, False, False])
    assert all(h["Authorization"] == "Bearer sk-test-123" for h in rec.headers)


async def test_api_key_never_in_errors() -> None:
    with sim("sglang", faults=FaultConfig(error_500=1.0)) as f:
        async with EndpointClient(f.urls[0], api_key="sk-very-secret") as client:
            with pytest.raises(ServerError) as info:
                await client.chat(chat_body())
            assert "sk-very-secret" not in str(info.value) + repr(client)
