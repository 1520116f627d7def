"""--extra-body against the sampling options, and the hedge age of multi-turn requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.unit.generate.fakes import (
    FakeClient,
    TickingClient,
    endpoint,
    run_dispatch,
    until,
    write,
)

from draftdata.errors import ConfigError
from draftdata.generate.config import GenerateConfig, Override, Sampling, validate


def cfg(**kw: Any) -> GenerateConfig:
    base: dict[str, Any] = {"prompts": "p", "out": "o", "endpoints": ["http://x:1"]}
    base.update(kw)
    return GenerateConfig(**base)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (
            {"sampling": Sampling(temperature=0.6), "extra_body": {"temperature": 1.0}},
            "--temperature",
        ),
        ({"sampling": Sampling(top_k=20), "extra_body": {"top_k": 5, "min_p": 0.1}}, "--top-k"),
        (
            {
                "overrides": [Override(domain="math", sampling=Sampling(seed=1))],
                "extra_body": {"seed": 7},
            },
            "sampling.seed",
        ),
        ({"max_tokens": 64, "extra_body": {"max_tokens": 10}}, "--max-tokens"),
        ({"extra_body": {"max_completion_tokens": 10}}, "--max-tokens"),
        ({"extra_body": {"n": 2}}, "--n"),
        ({"extra_body": {"model": "other"}}, "--model"),
        ({"extra_body": {"return_token_ids": False}}, "--token-ids"),
        (
            {"reasoning": "off", "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
            "--reasoning off",
        ),
    ],
)
def test_extra_body_that_an_option_also_sets_is_refused(
    changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError) as info:
        validate(cfg(**changes))
    text = str(info.value)
    assert text.startswith("--extra-body:") and named in text and "\n" not in text


def test_extra_body_with_fields_no_option_sets_is_kept() -> None:
    extra = {"min_p": 0.05, "top_k": 20, "chat_template_kwargs": {"x": 1}}
    assert validate(cfg(sampling=Sampling(temperature=0.6), extra_body=extra)).extra_body == extra
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    assert validate(cfg(reasoning="server", extra_body=kwargs)).extra_body == kwargs


def test_extra_body_conflict_is_one_line_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from draftdata.cli import main

    row = {"id": "a", "messages": [{"role": "user", "content": "q"}]}
    prompts = write(tmp_path / "p.jsonl", [row])
    args = ["generate", "-p", str(prompts), "-e", "http://127.0.0.1:9", "-o", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as info:
        main([*args, "--temperature", "0.6", "--extra-body", '{"temperature": 1.0}'])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 1 and len(err.splitlines()) == 1
    assert "'temperature' is also set by the sampling options" in err


async def test_hedge_age_is_per_request_not_per_conversation(tmp_path: Path) -> None:
    """Six short turns of one conversation: no single request is old enough to hedge, although
    the conversation as a whole runs far past the age and latency thresholds."""
    turns: list[dict[str, Any]] = []
    for t in range(6):
        turns += [{"role": "user", "content": f"turn {t}"}, {"role": "assistant", "content": "x"}]
    prompts = write(tmp_path / "p.jsonl", [{"id": "m", "messages": turns[:-1]}])
    now = [0.0]  # each request takes 0.15 s of the dispatcher's clock, the six 0.9 s
    busy, idle = TickingClient(now, 0.15), FakeClient(0.0)
    eps = [endpoint(0, busy, limit=2), endpoint(1, idle, limit=1)]
    eps[0].breaker.state, eps[1].breaker.state = "up", "down"  # the first turn goes to endpoint 0
    config = cfg(hedge=True, hedge_min_age=0.3, backoff_base=0.001)

    async def admit_idle() -> None:
        await until("the first turn is sent", lambda: busy.bodies)
        eps[1].breaker.state = "up"

    admit = asyncio.ensure_future(admit_idle())
    d, sink = await run_dispatch(config, eps, prompts, clock=lambda: now[0])
    await admit
    assert [c.id for c in sink.completions] == ["m"] and len(sink.completions[0].turns) == 6
    assert len(busy.bodies) == 6 and d.hedges == 0 and idle.bodies == []
