"""The request as a typed item (``generate/engine/request.py``) sends the bytes the dict bodies did.

``data/request_bodies.jsonl`` holds 320 request shapes and the exact bytes the code before the
item (commit df87645: ``client.build_body``, ``limits.OutputLimit.send``'s smaller retry, the
client's token-id fallback, hidden-states' literal prefill body) encoded for each: chat and
completion, ``n``, reasoning on/off/server, sampling, tools, extra body fields (template
kwargs merged or not), token ids asked or dropped. Each is rebuilt from the item and compared
byte for byte, on a real socket too; a generator over the same shapes compares the item's
body with that code's rule, kept here as the oracle."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.generate.config import Sampling
from draftdata.generate.engine.client import EndpointClient, request_body
from draftdata.generate.engine.request import Request
from draftdata.hidden.vllm_backend import prefill_request
from draftdata.records import Message

ROWS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "request_bodies.jsonl").read_text().splitlines()
]


def _item(shape: dict[str, Any]) -> Request:
    """The request of a recorded shape, as the engine's layers now make it."""
    if shape["call"] == "completion":
        return prefill_request(shape["model"], shape["prompt"])
    request = Request(
        messages=[msgspec.convert(m, Message) for m in shape["messages"]],
        tools=shape["tools"],
        model=shape["model"],
        max_tokens=shape["max_tokens"],
        sampling=msgspec.convert(shape["sampling"], Sampling),
        reasoning=shape["reasoning"],
        n=shape["n"],
        token_ids=shape["token_ids"],
        extra_body=shape["extra_body"],
    )
    if shape["shrink"] is not None:  # limits.OutputLimit.send's smaller retry
        request = request.with_max_tokens(shape["shrink"])
    if shape["strip"]:  # the client's token-id fallback
        request = request.without_token_ids()
    return request


def test_the_recorded_shapes_cover_what_the_engine_sends() -> None:
    shapes = [r["shape"] for r in ROWS]
    chats = [s for s in shapes if s["call"] == "chat"]
    assert any(s["call"] == "completion" for s in shapes)
    assert {s["reasoning"] for s in chats} == {"on", "off", "server"}
    assert {s["n"] for s in chats} >= {1, 2, 4} and any(s["tools"] for s in chats)
    assert any(s["shrink"] for s in chats) and any(s["strip"] and s["token_ids"] for s in chats)
    assert any("chat_template_kwargs" in s["extra_body"] for s in chats)
    assert any(len(s["extra_body"]) > 1 for s in chats)


@pytest.mark.parametrize("row", ROWS, ids=range(len(ROWS)))
def test_the_body_of_the_item_is_the_recorded_body(row: dict[str, Any]) -> None:
    assert msgspec.json.encode(request_body(_item(row["shape"]))).decode() == row["body"]


class _Server:
    """A server that records the bytes of every request and answers each as it should be."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.raw.append(raw)
        body = json.loads(raw)
        if request.path.endswith("/completions") and "messages" not in body:
            return web.json_response({"choices": [{"text": "x"}], "kv_transfer_params": {}})
        if body.get("return_token_ids"):  # refused: the client asks again without
            msg = "return_token_ids: Extra inputs are not permitted"
            return web.json_response({"error": {"message": msg}}, status=400)
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}}
        choices = [{**choice, "index": i, "finish_reason": "stop"} for i in range(body.get("n", 1))]
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        return web.json_response({"choices": choices, "usage": usage})


@pytest.fixture
async def server() -> AsyncIterator[tuple[_Server, str]]:
    srv = _Server()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", srv.handle)
    app.router.add_post("/v1/completions", srv.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield srv, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_the_bytes_on_the_wire_are_the_recorded_ones(server: tuple[_Server, str]) -> None:
    """Every recorded body, sent by the client over a socket: the server reads those bytes.
    A shape that asks for token ids goes out with them first, then (refused, as the shape's
    recorded fallback says) without."""
    srv, url = server
    for row in ROWS:
        shape = row["shape"]
        srv.raw.clear()
        async with EndpointClient(url) as client:
            if shape["call"] == "completion":
                await client.send_json(_item(shape))
                assert [r.decode() for r in srv.raw] == [row["body"]]
                continue
            request = _item({**shape, "strip": False})
            await client.chat(request)
            if request.token_ids:  # refused, then sent without: the recorded strip
                strip = _item({**shape, "strip": True})
                assert srv.raw[-1].decode() == msgspec.json.encode(request_body(strip)).decode()
                assert client.token_ids_supported is False
                if shape["strip"]:
                    assert srv.raw[-1].decode() == row["body"]
                else:
                    assert srv.raw[0].decode() == row["body"]
            else:
                assert [r.decode() for r in srv.raw] == [row["body"]]


# -- the rule of the bodies before the item, as the oracle for any shape ----------------------


def _before(
    messages: list[Message],
    *,
    tools: list[dict[str, Any]] | None,
    model: str,
    max_tokens: int,
    sampling: Sampling,
    reasoning: str,
    n: int,
    token_ids: bool,
    extra_body: dict[str, Any],
) -> dict[str, Any]:
    """``client.build_body`` as of df87645."""
    body: dict[str, Any] = {
        "model": model,
        "messages": msgspec.to_builtins(messages),
        "max_completion_tokens": max_tokens,
        "max_tokens": max_tokens,
    }
    body.update(sampling.body())
    if tools:
        body["tools"] = tools
    if n > 1:
        body["n"] = n
    if token_ids:
        for field in ("return_token_ids", "return_prompt_token_ids"):
            body[field] = True
    kwargs: dict[str, Any] = {}
    if reasoning != "server":
        kwargs["enable_thinking"] = reasoning == "on"
    extra = dict(extra_body or {})
    user_kwargs = extra.pop("chat_template_kwargs", None)
    if isinstance(user_kwargs, dict):
        kwargs = {**user_kwargs, **kwargs}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    body.update(extra)
    return body


_text = st.text(max_size=12)
_message = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=st.none() | _text,
    reasoning_content=st.none() | _text,
    tool_call_id=st.none() | st.just("c1"),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_sampling = st.builds(
    Sampling,
    temperature=st.none() | st.floats(0, 2),
    top_p=st.none() | st.floats(0.01, 1),
    top_k=st.none() | st.integers(-1, 100),
    seed=st.none() | st.integers(0, 99),
    stop=st.none() | st.lists(_text, max_size=2),
)
_extra = st.dictionaries(
    st.sampled_from(["skip_special_tokens", "guided_json", "priority", "chat_template_kwargs"]),
    _json | st.dictionaries(st.sampled_from(["enable_thinking", "x"]), _json, max_size=2),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(_message, min_size=1, max_size=4),
    tools=st.none() | st.just([]) | st.lists(st.dictionaries(_text, _json, max_size=2), max_size=2),
    model=_text,
    max_tokens=st.integers(1, 1 << 17),
    sampling=_sampling,
    reasoning=st.sampled_from(["on", "off", "server"]),
    n=st.integers(1, 8),
    token_ids=st.booleans(),
    extra_body=_extra,
    shrink=st.none() | st.integers(16, 4096),
    strip=st.booleans(),
)
def test_any_chat_request_has_the_body_it_had(
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    model: str,
    max_tokens: int,
    sampling: Sampling,
    reasoning: Any,
    n: int,
    token_ids: bool,
    extra_body: dict[str, Any],
    shrink: int | None,
    strip: bool,
) -> None:
    args = {
        "tools": tools,
        "model": model,
        "max_tokens": max_tokens,
        "sampling": sampling,
        "reasoning": reasoning,
        "n": n,
        "token_ids": token_ids,
        "extra_body": extra_body,
    }
    before = _before(messages, **args)
    request = Request(messages=messages, **args)
    if shrink is not None:  # OutputLimit.send: both limits replaced in place
        before = {**before, "max_tokens": shrink, "max_completion_tokens": shrink}
        request = request.with_max_tokens(shrink)
    if strip:  # the client's fallback: the token-id fields dropped
        ids = ("return_token_ids", "return_prompt_token_ids")
        before = {k: v for k, v in before.items() if k not in ids}
        request = request.without_token_ids()
    assert msgspec.json.encode(request_body(request)) == msgspec.json.encode(before)
