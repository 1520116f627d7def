"""The simulator's per-domain answer lengths (``--domain-mean``) and their spread
(``--output-sigma``), over real HTTP."""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from draftdata.cli import app
from draftdata.errors import ConfigError
from draftdata.sim.config import SimConfig, validate
from draftdata.sim.run import SimFleet

pytestmark = pytest.mark.integration

PROMPTS = {
    "math": "Solve for x: {i}x + 2 = 11. What is the probability that it is prime?",
    "code": "Write a python function that sorts the list {i} and explain the algorithm.",
    "general": "Tell me about the weather on day {i}.",
    "tool": "What is the weather in city {i}?",
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


async def _lengths(url: str, domain: str, k: int) -> list[int]:
    out = []
    async with aiohttp.ClientSession() as s:
        for i in range(k):
            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": PROMPTS[domain].format(i=i)}],
                "max_tokens": 4000,
            }
            if domain == "tool":
                body["tools"] = TOOLS
                body["tool_choice"] = "none"  # a plain answer, so its length is the drawn one
            async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                out.append((await r.json())["usage"]["completion_tokens"])
    return out


def test_each_domain_draws_around_its_mean() -> None:
    means = {"math": 400, "code": 120, "tool": 40}  # general: the default mean
    config = SimConfig(time_scale=0, mean_output_tokens=60, domain_mean_output_tokens=means,
                       output_sigma=0.0)  # fmt: skip
    with SimFleet(1, config) as fleet:
        got = {d: asyncio.run(_lengths(fleet.urls[0], d, 5)) for d in PROMPTS}
    # no spread: every answer is its domain's mean (plus the end-of-turn token; the text is
    # planned in words, so a long one lands within a few percent)
    want = {**means, "general": 60}
    for d, lengths in got.items():
        assert all(abs(n - want[d] - 1) <= 0.05 * want[d] for n in lengths), (d, lengths)
    spread = SimConfig(time_scale=0, domain_mean_output_tokens=means, output_sigma=0.8)
    with SimFleet(1, spread) as fleet:
        math = asyncio.run(_lengths(fleet.urls[0], "math", 60))
    assert len(set(math)) > 30 and 250 < statistics.mean(math) < 600  # lognormal, mean 400


def test_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="--domain-mean: kode is no domain of the classifier"):
        validate(SimConfig(domain_mean_output_tokens={"kode": 5}))
    with pytest.raises(ConfigError, match="--domain-mean: every mean must be at least 1"):
        validate(SimConfig(domain_mean_output_tokens={"code": 0}))
    with pytest.raises(ConfigError, match=r"--output-sigma: -1\.0 is not in"):
        validate(SimConfig(output_sigma=-1.0))
    res = CliRunner().invoke(app, ["fleet", "sim", "--domain-mean", "math"])
    assert isinstance(res.exception, ConfigError)
    assert str(res.exception) == "--domain-mean 'math': expected DOMAIN:N, e.g. math:6000"
