"""Every fault knob of the simulator, crash/restart, batching and client cancellations."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration

USER = [{"role": "user", "content": "hello"}]


def config(flavor: str = "sglang", **faults: Any) -> SimConfig:
    return SimConfig(
        flavor=flavor,  # type: ignore[arg-type]
        time_scale=0.001,
        mean_output_tokens=40,
        faults=FaultConfig(**faults),
    )


async def post(url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> Any:
    t = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(timeout=t) as s,
        s.post(url + "/v1/chat/completions", json=body or {"messages": USER}) as r,
    ):
        return r.status, dict(r.headers), await r.read()


async def health(url: str) -> int:
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
            return r.status
    except aiohttp.ClientConnectionError:
        return -1


async def wait_for(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
@pytest.mark.parametrize(
    ("fault", "status", "etype"),
    [
        ("error_500", 500, "InternalServerError"),
        ("error_503", 503, "ServiceUnavailableError"),
        ("error_429", 429, "RateLimitError"),
        ("context_400", 400, "BadRequestError"),
    ],
)
async def test_http_error_faults(flavor: str, fault: str, status: int, etype: str) -> None:
    with SimFleet(1, config(flavor, **{fault: 1.0})) as fleet:
        got, headers, raw = await post(fleet.urls[0])
        body = json.loads(raw)
        err = body if flavor == "sglang" else body["error"]
        assert (got, err["type"], err["code"]) == (status, etype, status)
        if fault == "error_429":
            assert headers["Retry-After"] == "1"
        if fault == "context_400":
            assert "context length" in err["message"]
        assert fleet.stats(0).faults == {fault: 1}


async def test_fault_server_limits_faults_to_one_server() -> None:
    with SimFleet(2, config(error_500=1.0, server=1)) as fleet:
        assert (await post(fleet.urls[0]))[0] == 200
        assert (await post(fleet.urls[1]))[0] == 500


async def test_rates_are_seeded() -> None:
    def outcomes(seed: int) -> list[int]:
        cfg = SimConfig(time_scale=0, seed=seed, faults=FaultConfig(error_500=0.5))
        with SimFleet(1, cfg) as fleet:
            return [asyncio.run(post(fleet.urls[0]))[0] for _ in range(16)]

    a = await asyncio.to_thread(outcomes, 1)
    assert a == await asyncio.to_thread(outcomes, 1)
    assert set(a) == {200, 500}


async def test_reset_drops_the_connection_mid_response() -> None:
    with SimFleet(1, config(reset=1.0)) as fleet:
        with pytest.raises(aiohttp.ClientError):
            await post(fleet.urls[0])
        assert fleet.stats(0).faults == {"reset": 1}


async def test_malformed_body_is_200_with_truncated_json() -> None:
    with SimFleet(1, config(malformed=1.0)) as fleet:
        status, _, raw = await post(fleet.urls[0])
        assert status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(raw)


async def test_hang_never_answers_and_the_client_gives_up() -> None:
    with SimFleet(1, config(hang=1.0)) as fleet:
        with pytest.raises(asyncio.TimeoutError):
            await post(fleet.urls[0], timeout=0.3)
        assert fleet.stats(0).faults == {"hang": 1}
        assert await health(fleet.urls[0]) == 200


async def test_crash_after_n_then_restart_on_the_same_port() -> None:
    cfg = config(crash_after={0: 3}, restart_after=0.3, starting_s=0.3)
    with SimFleet(2, cfg) as fleet:
        url = fleet.urls[0]
        assert (await post(url))[0] == 200
        assert (await post(url))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await post(url)
        assert await health(url) == -1  # the socket is closed
        assert (await post(fleet.urls[1]))[0] == 200  # the other server is unaffected
        await wait_for(lambda: _is(health(url), 503))  # back, but starting
        await wait_for(lambda: _is(health(url), 200))
        assert fleet.urls[0] == url
        assert (await post(url))[0] == 200  # crashes once only
        stats = fleet.stats(0)
        assert (stats.crashes, stats.restarts, stats.served) == (1, 1, 3)


async def _is(coro: Any, value: int) -> bool:
    return bool(await coro == value)


async def test_crash_drops_in_flight_requests_and_manual_restart() -> None:
    cfg = SimConfig(time_scale=1.0, mean_output_tokens=5000, min_output_tokens=4000)
    with SimFleet(1, cfg) as fleet:
        url = fleet.urls[0]
        task = asyncio.ensure_future(post(url))
        await wait_for(lambda: _running(fleet))
        fleet.crash(0)
        with pytest.raises(aiohttp.ClientError):
            await task
        assert fleet.load(0) == (0, 0)
        fleet.restart(0)
        await wait_for(lambda: _is(health(url), 200))


async def _running(fleet: SimFleet) -> bool:
    return fleet.load(0)[0] > 0


async def test_more_than_max_running_requests_wait() -> None:
    cfg = SimConfig(flavor="vllm", max_running=2, time_scale=1.0, min_output_tokens=4000)
    with SimFleet(1, cfg) as fleet:
        url = fleet.urls[0]
        tasks = [
            asyncio.ensure_future(post(url, {"messages": [{"role": "user", "content": str(i)}]}))
            for i in range(6)
        ]

        async def queued() -> bool:
            return fleet.load(0) == (2, 4)

        await wait_for(queued)
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            text = await r.text()
        assert 'vllm:num_requests_running{engine="0",model_name="Qwen3.6-27B-sim"} 2.0' in text
        assert 'vllm:num_requests_waiting{engine="0",model_name="Qwen3.6-27B-sim"} 4.0' in text
        # Clients that give up (hedging) free their slots at once.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        async def drained() -> bool:
            return fleet.load(0) == (0, 0)

        await wait_for(drained)
        assert fleet.stats(0).cancelled == 6


async def test_slow_server_decodes_slower() -> None:
    cfg = SimConfig(time_scale=0.05, min_output_tokens=6000, faults=FaultConfig(slow={1: 10.0}))
    with SimFleet(2, cfg) as fleet:
        tasks = [asyncio.ensure_future(post(u)) for u in fleet.urls]

        async def progressed() -> bool:
            return fleet.servers[0]._batcher.generated_tokens > 400

        await wait_for(progressed)
        tokens = [s._batcher.generated_tokens for s in fleet.servers]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert tokens[0] > 3 * tokens[1] > 0


async def test_startup_period_reports_503() -> None:
    with SimFleet(1, SimConfig(time_scale=0, startup_s=0.4)) as fleet:
        assert await health(fleet.urls[0]) == 503
        assert (await post(fleet.urls[0]))[0] == 503
        await wait_for(lambda: _is(health(fleet.urls[0]), 200))


async def test_cancelled_streams_print_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    cfg = SimConfig(time_scale=1.0, min_output_tokens=4000)
    with SimFleet(1, cfg) as fleet:
        async with aiohttp.ClientSession() as s:
            for stream in (True, False):
                body = {"messages": USER, "stream": stream}
                try:
                    async with s.post(
                        fleet.urls[0] + "/v1/chat/completions",
                        json=body,
                        timeout=aiohttp.ClientTimeout(total=0.2),
                    ) as r:
                        await r.read()
                except TimeoutError:
                    pass

        async def drained() -> bool:
            return fleet.load(0) == (0, 0)

        await wait_for(drained)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error handling request" not in err


@pytest.mark.parametrize("status", [401, 404, 501])
async def test_refuse_answers_every_chat_request_after_n_while_probes_pass(status: int) -> None:
    with SimFleet(2, config(refuse={1: status}, refuse_after=2)) as fleet:
        url = fleet.urls[1]
        got = [(await post(url))[0] for _ in range(5)]
        assert got == [200, 200, status, status, status]
        assert await health(url) == 200
        async with aiohttp.ClientSession() as s, s.get(url + "/v1/models") as r:
            assert r.status == 200
        assert [(await post(fleet.urls[0]))[0] for _ in range(3)] == [200] * 3  # only server 1
        assert fleet.stats(1).faults["refuse"] == 3


def test_sim_without_token_ids_ignores_the_request_for_them() -> None:
    body = {"messages": USER, "return_token_ids": True, "return_prompt_token_ids": True}
    for token_ids in (True, False):
        cfg = SimConfig(time_scale=0.0, mean_output_tokens=10, token_ids=token_ids)
        with SimFleet(1, cfg) as fleet:
            status, _, raw = asyncio.run(post(fleet.urls[0], body))
        choice = json.loads(raw)["choices"][0]
        key = "response_token_ids" if "matched_stop" in choice else "token_ids"
        assert status == 200 and (key in choice) == token_ids


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(delay=st.floats(0.0, 0.006), burst=st.integers(1, 24))
def test_a_crash_ends_every_request_it_accepted_whenever_it_comes(delay: float, burst: int) -> None:
    """A crash while a burst of connections is still being accepted ends every one of them at
    once, as a killed process's would: none is answered, none is left open unread. (A
    connection the event loop had accepted but not yet handed to aiohttp escaped the old crash:
    it was either served by the "crashed" server or, on Python 3.11, held open unread until the
    garbage collector found it, and its client waited: an engine saw a server that was down as
    up with every slot busy.)"""
    cfg = SimConfig(time_scale=0.05, mean_output_tokens=60, min_output_tokens=40)

    async def burst_then_crash(fleet: SimFleet) -> list[Any]:
        async def one(s: aiohttp.ClientSession) -> Any:
            try:
                async with s.post(
                    fleet.urls[0] + "/v1/chat/completions", json={"messages": USER}
                ) as r:
                    return r.status
            except aiohttp.ClientError as exc:
                return exc
            except TimeoutError:
                return "left waiting"

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            tasks = [asyncio.ensure_future(one(s)) for _ in range(burst)]
            await asyncio.sleep(delay)
            await asyncio.to_thread(fleet.crash, 0)
            return list(await asyncio.gather(*tasks))

    with SimFleet(1, cfg) as fleet:
        outcomes = asyncio.run(burst_then_crash(fleet))
        served = fleet.stats(0).served
    assert all(isinstance(o, aiohttp.ClientError) for o in outcomes), outcomes
    assert served == 0


async def test_unsupported_role_refuses_requests_with_it_after_n() -> None:
    """``--unsupported role:ROLE``: a request with a message of that role is refused once the
    server has taken its first ``--unsupported-after`` requests; one without is answered."""
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "and then?"},
    ]
    cfg = SimConfig(time_scale=0, unsupported=["role:assistant"], unsupported_after=1)
    with SimFleet(1, cfg) as fleet:
        url = fleet.urls[0]
        assert (await post(url, {"messages": history}))[0] == 200  # its first request
        status, _, body = await post(url, {"messages": history})
        assert status == 400 and b"Unsupported message role: assistant" in body
        assert (await post(url, {"messages": USER}))[0] == 200
