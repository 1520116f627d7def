"""Capacity from the server's own figures: the KV cache over the tokens a request holds.

SGLang reports a running cap (``effective_max_running_requests_per_dp``, 2048 when automatic)
that is a scheduling limit, not room: its KV pool (``max_total_tokens``) decides how many
requests really run. vLLM reports its KV cache in ``/metrics`` (``vllm:cache_config_info``).
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient, endpoint

from draftdata.generate.engine.concurrency import queue_target
from draftdata.shared.endpoints import Capacity, Load, parse_server_info, parse_vllm_kv_tokens

# /server_info of the real SGLang 0.5.23 on CPU (the fields that matter, as it answered)
SGLANG_INFO = {
    "max_running_requests": None,
    "max_total_tokens": 4096,
    "dp_size": 1,
    "context_length": 2048,
    "served_model_name": "tiny-qwen3",
    "internal_states": [
        {"effective_max_running_requests_per_dp": 2048, "max_total_tokens": 4096},
    ],
}


def test_sglang_kv_pool_is_read_beside_the_running_cap() -> None:
    cap = parse_server_info(SGLANG_INFO)
    assert (cap.max_running, cap.kv_tokens) == (2048, 4096)
    two = {
        "dp_size": 2,
        "internal_states": [
            {"effective_max_running_requests_per_dp": 64, "max_total_tokens": 100_000},
            {"effective_max_running_requests_per_dp": 64, "max_total_tokens": 90_000},
        ],
    }
    assert parse_server_info(two).kv_tokens == 190_000
    one_of_four = {"dp_size": 4, "internal_states": [{"max_total_tokens": 1000}]}
    assert parse_server_info(one_of_four).kv_tokens == 4000
    flag_only = {"dp_size": 2, "max_total_tokens": 5000}  # an older build: the flag per rank
    assert parse_server_info(flag_only).kv_tokens == 10_000
    assert parse_server_info({"max_total_tokens": None}).kv_tokens is None


def test_vllm_kv_cache_from_the_cache_config_gauge() -> None:
    line = (
        'vllm:cache_config_info{block_size="128",engine="%s",kv_cache_size_tokens="%s",'
        'num_gpu_blocks="%s",sliding_window="None"} 1.0\n'
    )
    text = "# HELP vllm:cache_config_info x\n" + line % ("0", "2097152", "16384")
    assert parse_vllm_kv_tokens(text) == 2_097_152
    older = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0\n'
    assert parse_vllm_kv_tokens(older) == 16_000
    dp = line % ("0", "5000", "40") + line % ("1", "5000", "40")
    assert parse_vllm_kv_tokens(dp) == 10_000
    assert parse_vllm_kv_tokens('vllm:num_requests_running{engine="0"} 1.0\n') is None
    assert parse_vllm_kv_tokens('vllm:cache_config_info{num_gpu_blocks="None"} 1.0\n') is None


def test_a_2048_running_cap_on_a_4096_token_pool_starts_small() -> None:
    """The finding: draftdata started at concurrency 2151 on a server that holds 4096 tokens."""
    ep = endpoint(0, FakeClient(), concurrency="auto", limit=32)
    ep.concurrency.held_prior = 64 + 16  # half a 128-token output limit, and the prompt
    ep.set_capacity(parse_server_info(SGLANG_INFO))
    assert ep.concurrency.fitted() == 4096 // 80
    assert ep.concurrency.limit == 51 + queue_target(51)
    # answers teach what a request really holds: 20 prompt + 108 output tokens
    for _ in range(40):
        ep.record_success(108, 20, latency=1.0)
    assert ep.concurrency.fitted() == math.floor(4096 / ep.concurrency.held_tokens())
    assert 4096 // 128 <= ep.concurrency.fitted() <= 4096 // 120
    at = ep.concurrency._fitted_at  # the limit moves in steps of 10% of the fitted capacity
    assert at is not None and abs(at - ep.concurrency.fitted()) < 0.1 * at
    assert ep.concurrency.limit == at + queue_target(at) < 45
    # the queue follower grows no further than the fitted capacity
    ep.slots.inflight = ep.concurrency.limit
    assert ep.adapt(Load(running=ep.concurrency.fitted(), waiting=0)) is None


def test_without_a_kv_figure_the_running_cap_decides_as_before() -> None:
    ep = endpoint(0, FakeClient(), concurrency="auto", limit=32)
    ep.concurrency.held_prior = 500
    ep.set_capacity(Capacity(engine="sglang", max_running=64))
    assert ep.concurrency.fitted() == 64 and ep.concurrency.limit == 68
    ep.record_success(5000, 5000, latency=1.0)
    assert ep.concurrency.limit == 68  # nothing to fit: answers do not move it
    vllm = endpoint(1, FakeClient(), concurrency="auto", limit=32)
    vllm.set_capacity(Capacity(engine="vllm", kv_tokens=2_097_152), fleet_max=16)
    vllm.concurrency.held_prior = 600
    vllm.set_capacity(Capacity(engine="vllm", kv_tokens=2_097_152))  # revived: keeps the cap
    assert vllm.concurrency.fitted() == 16 and vllm.concurrency.limit == 16 + 2


@settings(max_examples=300, deadline=None)
@given(
    running_cap=st.one_of(st.none(), st.integers(1, 4096)),
    kv=st.one_of(st.none(), st.integers(1, 10_000_000)),
    prior=st.one_of(st.none(), st.floats(1, 100_000)),
    answers=st.lists(
        st.tuples(st.integers(0, 30_000), st.integers(0, 30_000), st.integers(1, 8)), max_size=30
    ),
    fixed=st.booleans(),
)
def test_capacity_is_the_kv_fit_never_above_the_running_cap(
    running_cap: int | None,
    kv: int | None,
    prior: float | None,
    answers: list[tuple[int, int, int]],
    fixed: bool,
) -> None:
    ep = endpoint(0, FakeClient(), concurrency=7 if fixed else "auto", limit=32)
    ep.concurrency.held_prior = prior
    ep.set_capacity(Capacity(engine="sglang", max_running=running_cap, kv_tokens=kv))
    for out, prompt, seqs in answers:
        ep.record_success(out, prompt, latency=0.5, seqs=seqs)
    got = ep.concurrency.fitted()
    held = ep.concurrency.held_tokens()
    kv_fit = max(1, int(kv // held)) if kv and held else None
    want = min(c for c in (running_cap, kv_fit) if c) if (running_cap or kv_fit) else None
    assert got == want
    if got is not None:
        assert got >= 1 and (running_cap is None or got <= running_cap)
    if fixed:
        assert ep.concurrency.limit == 7  # a fixed --concurrency is never moved
    elif got is not None:
        # the limit sits on the fitted capacity it was last set from, within the refit step
        at = ep.concurrency._fitted_at
        assert at is not None and ep.concurrency.limit == at + queue_target(at)
        assert abs(at - got) < max(1, 0.1 * at)
    if prior is None and any(o + p for o, p, _ in answers):
        # no prior: the mean of what the answers held, per sequence
        seqs = sum(s for o, p, s in answers if o + p > 0)
        assert held is not None and math.isclose(
            held, sum(o + p for o, p, s in answers if o + p > 0) / seqs
        )
