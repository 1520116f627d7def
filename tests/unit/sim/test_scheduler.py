"""The simulator's continuous-batching scheduler, driven directly on an event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.sim.config import FaultConfig, SimConfig, validate
from draftdata.sim.scheduler import Batcher, Seq


async def _until(cond: Callable[[], object]) -> None:
    """Yield to the scheduler until ``cond()`` holds (10 s: a bug's bound, not a pace)."""
    async with asyncio.timeout(10):
        while not cond():
            await asyncio.sleep(0.001)


async def test_at_most_max_running_decode_and_the_rest_wait() -> None:
    config = SimConfig(max_running=4, time_scale=0.01, prefill_per_token_s=0.0)
    b = Batcher(config)
    b.start()
    seqs = [Seq(50, 10, None) for _ in range(10)]
    for s in seqs:
        b.submit(s)
    await asyncio.sleep(0)  # one scheduler pass admits the first batch
    assert len(b.running) == 4
    assert len(b.waiting) == 6
    await asyncio.wait_for(asyncio.gather(*(s.finished for s in seqs)), 30)
    assert all(s.done == 50 for s in seqs)
    assert b.generated_tokens == 500
    assert b.prompt_tokens == 100
    assert not b.running and not b.waiting
    await b.stop()


async def test_cancel_frees_the_slot() -> None:
    b = Batcher(SimConfig(max_running=1, time_scale=0.01))
    b.start()
    first, second = Seq(10_000, 1, None), Seq(5, 1, None)
    b.submit(first)
    b.submit(second)
    await _until(lambda: b.running)
    assert b.running == [first]
    b.cancel(first)
    await asyncio.wait_for(second.finished, 10)
    assert first.finished.cancelled()
    await b.stop()


async def test_streaming_sequences_report_progress_in_steps() -> None:
    config = SimConfig(time_scale=0.05, stream_interval=4, prefill_per_token_s=0.0)
    b = Batcher(config)
    b.start()
    event = asyncio.Event()
    s = Seq(40, 1, event)
    b.submit(s)
    seen = []
    while not s.finished.done():
        await event.wait()
        event.clear()
        seen.append(s.done)
    assert seen[-1] == 40
    assert len(seen) >= 3  # progress came in several steps, not only at the end
    await b.stop()


async def test_drop_all_cancels_everything() -> None:
    b = Batcher(SimConfig(max_running=2, time_scale=0.01))
    b.start()
    seqs = [Seq(10_000, 1, None) for _ in range(3)]
    for s in seqs:
        b.submit(s)
    await _until(lambda: len(b.running) == 2)
    b.drop_all()
    assert all(s.finished.cancelled() for s in seqs)
    assert not b.running and not b.waiting
    await b.stop()


def test_step_time_defaults_model_a_27b_gpu() -> None:
    c = SimConfig()
    assert 0.015 < c.step_s(1) < 0.025
    assert 0.025 < c.step_s(64) < 0.035
    assert c.step_s(64, slow=2.0) == pytest.approx(2 * c.step_s(64))
    assert SimConfig(time_scale=0).step_s(64) == 0


@pytest.mark.parametrize(
    ("config", "servers", "needle"),
    [
        (SimConfig(max_running=0), 1, "--max-running"),
        (SimConfig(time_scale=-1), 1, "--time-scale"),
        (SimConfig(faults=FaultConfig(error_500=1.5)), 1, "--fault-500"),
        (SimConfig(faults=FaultConfig(error_500=0.6, hang=0.6)), 1, "sum"),
        (SimConfig(faults=FaultConfig(server=3)), 2, "--fault-server"),
        (SimConfig(faults=FaultConfig(slow={5: 2.0})), 2, "--slow"),
        (SimConfig(faults=FaultConfig(crash_after={0: 0})), 2, "--crash-after"),
    ],
)
def test_validate_names_the_option(config: SimConfig, servers: int, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("-", "\\-")):
        validate(config, servers)


_ROLES = ["system", "user", "assistant", "tool", "developer"]


@given(role=st.sampled_from([*_ROLES, "Tool", "tools", "", "gpt2"]) | st.text(max_size=12))
def test_unsupported_role_names_a_message_role(role: str) -> None:
    """``--unsupported role:ROLE`` refuses requests with a message of that role: a ROLE no
    message can have (a typo, a capital) is refused at the start, not left refusing nothing."""
    config = SimConfig(unsupported=[f"role:{role}"])
    if role in _ROLES:
        assert validate(config) is config
    else:
        with pytest.raises(ConfigError, match="names no message role"):
            validate(config)
