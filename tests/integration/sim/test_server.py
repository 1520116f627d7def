"""The simulator over real HTTP: endpoints, both flavours, streaming, n, tools, reasoning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
USER = [{"role": "user", "content": "Explain the idea briefly."}]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def fleet(request: pytest.FixtureRequest) -> Iterator[SimFleet]:
    config = SimConfig(flavor=request.param, time_scale=0.001, mean_output_tokens=80)
    with SimFleet(n=2, config=config) as f:
        yield f


async def chat(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body) as r,
    ):
        return r.status, json.loads(await r.read())


async def stream(url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json={**body, "stream": True}) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: ")
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


def reasoning_of(flavor: str, msg: dict[str, Any]) -> str | None:
    key = "reasoning_content" if flavor == "sglang" else "reasoning"
    assert key in msg
    value: str | None = msg[key]
    return value


async def test_models_health_and_flavour_endpoints(fleet: SimFleet) -> None:
    url, flavor = fleet.urls[0], fleet.config.flavor
    status, body = await get(url + "/v1/models")
    card = json.loads(body)["data"][0]
    assert (status, card["owned_by"], card["max_model_len"]) == (200, flavor, 8192)
    assert card["id"] == fleet.config.model
    assert (await get(url + "/health"))[0] == 200
    status, text = await get(url + "/metrics")
    assert status == 200
    if flavor == "vllm":
        assert 'vllm:num_requests_running{engine="0",model_name="Qwen3.6-27B-sim"}' in text
        assert "vllm:num_requests_waiting{" in text
        assert "vllm:generation_tokens_total{" in text
        assert (await get(url + "/server_info"))[0] == 404
        assert json.loads((await get(url + "/version"))[1])["version"]
    else:
        assert 'sglang:num_running_reqs{model_name="Qwen3.6-27B-sim"}' in text
        for path in ("/server_info", "/get_server_info"):
            status, body = await get(url + path)
            info = json.loads(body)
            assert status == 200
            assert info["max_running_requests"] == 64
            assert info["context_length"] == 8192
            assert info["dp_size"] == 1
            state = info["internal_states"][0]
            assert state["effective_max_running_requests_per_dp"] == 64
            assert "last_gen_throughput" in state
        loads = json.loads((await get(url + "/v1/loads"))[1])
        assert loads["aggregate"] == {
            "num_running_reqs": 0,
            "num_waiting_reqs": 0,
            "num_used_tokens": 0,
        }
        assert (await get(url + "/health_generate"))[0] == 200


async def test_non_streaming_shape(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    status, body = await chat(fleet.urls[0], {"model": fleet.config.model, "messages": USER})
    assert status == 200
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    msg = choice["message"]
    assert msg["role"] == "assistant"
    reasoning = reasoning_of(flavor, msg)
    assert reasoning and reasoning.startswith("\n") and reasoning.endswith("\n")
    assert msg["content"].startswith("\n\n")
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    if flavor == "sglang":
        assert choice["matched_stop"] == 151645
        assert "response_token_ids" not in choice and "prompt_token_ids" not in choice
        assert msg["tool_calls"] is None
    else:
        assert choice["stop_reason"] is None
        assert choice["token_ids"] is None and body["prompt_token_ids"] is None
        assert "tool_calls" not in msg
        assert body["model"] == fleet.config.model


async def test_token_ids_where_each_engine_puts_them(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    body = {"messages": USER, "return_token_ids": True, "return_prompt_token_ids": True}
    _, out = await chat(fleet.urls[0], body)
    choice = out["choices"][0]
    if flavor == "sglang":
        prompt_ids, output_ids = choice["prompt_token_ids"], choice["response_token_ids"]
    else:
        prompt_ids, output_ids = out["prompt_token_ids"], choice["token_ids"]
    assert len(prompt_ids) == out["usage"]["prompt_tokens"]
    assert len(output_ids) == out["usage"]["completion_tokens"]
    assert output_ids[0] == 151667 and output_ids[-1] == 151645  # <think> ... <|im_end|>


async def test_same_prompt_same_answer_on_any_server(fleet: SimFleet) -> None:
    body = {"messages": [{"role": "user", "content": "determinism please"}]}
    a = (await chat(fleet.urls[0], body))[1]["choices"][0]["message"]
    b = (await chat(fleet.urls[1], body))[1]["choices"][0]["message"]
    c = (await chat(fleet.urls[0], {**body, "seed": 7}))[1]["choices"][0]["message"]
    assert a == b
    assert a != c


async def test_n_samples_differ_and_usage_counts_prompt_once(fleet: SimFleet) -> None:
    _, one = await chat(fleet.urls[0], {"messages": USER})
    _, out = await chat(fleet.urls[0], {"messages": USER, "n": 3})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in out["choices"]}) == 3
    assert out["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]


async def test_max_tokens_caps_and_finishes_with_length(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    _, out = await chat(fleet.urls[0], {"messages": USER, "max_completion_tokens": 5})
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 5
    assert reasoning_of(flavor, choice["message"])
    assert choice["message"]["content"] == ("" if flavor == "sglang" else None)


async def test_thinking_off_and_inline_reasoning(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    body = {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    msg = (await chat(fleet.urls[0], body))[1]["choices"][0]["message"]
    assert reasoning_of(flavor, msg) is None
    assert "<think>" not in msg["content"]
    if flavor == "sglang":
        msg = (await chat(fleet.urls[0], {"messages": USER, "separate_reasoning": False}))[1]
        content = msg["choices"][0]["message"]["content"]
        assert content.startswith("<think>\n") and "</think>\n\n" in content
    else:
        msg = (await chat(fleet.urls[0], {"messages": USER, "include_reasoning": False}))[1]
        assert msg["choices"][0]["message"]["reasoning"] is None


async def test_tool_calls(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    _, out = await chat(fleet.urls[0], body)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"][:1]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    prefix = "call_" if flavor == "sglang" else "chatcmpl-tool-"
    assert call["id"].startswith(prefix)
    # tool_choice auto: some answers call, some do not; none: never
    finishes = set()
    for i in range(12):
        auto = {"messages": [{"role": "user", "content": f"q{i}"}], "tools": TOOLS}
        finishes.add((await chat(fleet.urls[0], auto))[1]["choices"][0]["finish_reason"])
    assert finishes == {"stop", "tool_calls"}
    _, none = await chat(fleet.urls[0], {**body, "tool_choice": "none"})
    assert none["choices"][0]["finish_reason"] == "stop"


async def test_streaming_reassembles_to_the_non_streaming_answer(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    body = {
        "messages": USER,
        "n": 2,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    _, full = await chat(fleet.urls[1], body)
    events = await stream(fleet.urls[1], body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"] == []
    usage = dict(chunks[-1]["usage"])
    assert usage.pop("prompt_tokens_details")["cached_tokens"] > 0  # the same prompt again
    assert usage == {k: v for k, v in full["usage"].items() if k != "prompt_tokens_details"}
    rkey = "reasoning_content" if flavor == "sglang" else "reasoning"
    for i, choice in enumerate(full["choices"]):
        mine = [ch for c in chunks for ch in c["choices"] if ch["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        reasoning = "".join(ch["delta"].get(rkey) or "" for ch in mine)
        content = "".join(ch["delta"].get("content") or "" for ch in mine)
        assert reasoning == choice["message"][rkey]
        assert content == choice["message"]["content"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"]
        if flavor == "vllm":
            ids = [t for ch in mine for t in ch.get("token_ids") or []]
            assert ids == choice["token_ids"]
    if flavor == "vllm":
        assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]
        assert all("prompt_token_ids" not in c for c in chunks[1:])


async def test_streaming_tool_call_deltas(fleet: SimFleet) -> None:
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    _, full = await chat(fleet.urls[0], body)
    events = await stream(fleet.urls[0], body)
    deltas = [
        tc for c in events[:-1] for ch in c["choices"] for tc in ch["delta"].get("tool_calls") or []
    ]
    want = full["choices"][0]["message"]["tool_calls"]
    assert deltas[0]["function"]["name"] == want[0]["function"]["name"]
    assert deltas[0]["id"] == want[0]["id"]
    args = "".join(d["function"]["arguments"] or "" for d in deltas if d["index"] == 0)
    assert args == want[0]["function"]["arguments"]


async def test_context_length_errors_have_the_engine_shape(fleet: SimFleet) -> None:
    flavor = fleet.config.flavor
    long = [{"role": "user", "content": "word " * 9000}]
    status, body = await chat(fleet.urls[0], {"messages": long})
    assert status == 400
    status2, body2 = await chat(fleet.urls[0], {"messages": USER, "max_tokens": 8190})
    assert status2 == 400
    if flavor == "sglang":
        assert body["object"] == "error" and body["code"] == 400
        assert body["type"] == "BadRequestError"
        assert "is longer than the model's context length (8192 tokens)" in body["message"]
        assert body2["message"].startswith(
            "Requested token count exceeds the model's maximum context length of 8192 tokens."
        )
    else:
        err = body["error"]
        assert (err["type"], err["code"], err["param"]) == ("BadRequestError", 400, None)
        assert err["message"].startswith("This model's maximum context length is 8192 tokens.")
        assert (
            "'max_tokens' or 'max_completion_tokens' is too large: 8190"
            in body2["error"]["message"]
        )


async def test_bad_requests_are_400(fleet: SimFleet) -> None:
    assert (await chat(fleet.urls[0], {"messages": []}))[0] == 400
    assert (await chat(fleet.urls[0], {"messages": [{"role": "gpt", "content": "x"}]}))[0] == 400
    assert (await chat(fleet.urls[0], {"messages": USER, "max_tokens": 0}))[0] == 400
    async with (
        aiohttp.ClientSession() as s,
        s.post(fleet.urls[0] + "/v1/chat/completions", data=b"{not json") as r,
    ):
        assert r.status == 400
    if fleet.config.flavor == "vllm":
        status, body = await chat(fleet.urls[0], {"messages": USER, "model": "other"})
        assert status == 404 and body["error"]["message"] == "The model `other` does not exist."


async def test_prefix_cache_reports_cached_tokens(fleet: SimFleet) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    first = [system, {"role": "user", "content": "first question"}]
    second = [system, {"role": "user", "content": "second question"}]
    await chat(fleet.urls[1], {"messages": first})
    _, out = await chat(fleet.urls[1], {"messages": second})
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < out["usage"]["prompt_tokens"]


async def test_output_mean_per_prompt_prefix() -> None:
    """``mean_output_tokens_for``: a prompt starting with a prefix draws around its own mean
    (mixed-domain benchmarks); other prompts keep the default mean."""
    config = SimConfig(
        time_scale=0,
        mean_output_tokens=100,
        output_sigma=0.3,
        mean_output_tokens_for={"math": 1200, "tool": 20},
        context_length=65536,
    )
    with SimFleet(n=1, config=config) as f:
        means = {}
        for word in ("math", "tool", "other"):
            got = []
            for i in range(12):
                msgs = [{"role": "user", "content": f"{word} question {i}"}]
                _, out = await chat(f.urls[0], {"messages": msgs})
                got.append(out["usage"]["completion_tokens"])
            means[word] = sum(got) / len(got)
    assert 700 < means["math"] < 2000
    assert means["tool"] < 40
    assert 50 < means["other"] < 200
