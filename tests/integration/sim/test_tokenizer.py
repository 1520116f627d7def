"""The simulator with a real (locally trained) Hugging Face tokenizer: token ids are exact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    return ensure_demo_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def fleet(request: pytest.FixtureRequest, tokenizer_dir: Path) -> Iterator[SimFleet]:
    config = SimConfig(
        flavor=request.param, time_scale=0.0, mean_output_tokens=60, tokenizer=str(tokenizer_dir)
    )
    with SimFleet(n=1, config=config) as f:
        yield f


async def _chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        result: dict[str, Any] = json.loads(await r.read())
        return result


@pytest.mark.parametrize("tools", [None, TOOLS])
async def test_token_ids_decode_to_the_text(
    fleet: SimFleet, tokenizer_dir: Path, tools: list[dict[str, Any]] | None
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write a function that adds two numbers."},
    ]
    body: dict[str, Any] = {
        "messages": messages,
        "max_completion_tokens": 400,
        "return_token_ids": True,
        "return_prompt_token_ids": True,
        "seed": 3,
    }
    if tools:
        body["tools"] = tools
    resp = await _chat(fleet.urls[0], body)
    choice = resp["choices"][0]
    flavor = fleet.config.flavor
    prompt_ids = choice["prompt_token_ids"] if flavor == "sglang" else resp["prompt_token_ids"]
    output_ids = choice["response_token_ids" if flavor == "sglang" else "token_ids"]
    expected_prompt = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if isinstance(expected_prompt, dict):  # transformers 5 may return a BatchEncoding
        expected_prompt = expected_prompt["input_ids"]
    assert prompt_ids == list(expected_prompt)
    usage = resp["usage"]
    assert usage["prompt_tokens"] == len(prompt_ids)
    assert usage["completion_tokens"] == len(output_ids)

    text = tok.decode(output_ids, skip_special_tokens=False)
    msg = choice["message"]
    reasoning = msg.get("reasoning_content" if flavor == "sglang" else "reasoning")
    assert reasoning and text.startswith("<think>" + reasoning + "</think>")
    if choice["finish_reason"] in ("stop", "tool_calls"):
        assert text.endswith("<|im_end|>") and output_ids[-1] == tok.convert_tokens_to_ids(
            "<|im_end|>"
        )
    if msg.get("content"):
        assert msg["content"].strip() in text
    for call in msg.get("tool_calls") or []:
        assert call["function"]["name"] in text
    # re-tokenizing the decoded text gives the same ids (the ids are a real tokenization)
    assert tok.encode(text, add_special_tokens=False) == output_ids
