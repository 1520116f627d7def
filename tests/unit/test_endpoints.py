"""Parsers of the server probes: SGLang server_info/loads, vLLM metrics, /v1/models."""

from __future__ import annotations

from draftdata.shared.endpoints import (
    Load,
    base_url,
    parse_loads,
    parse_models,
    parse_server_info,
    parse_vllm_metrics,
)


def test_server_info_sums_dp_ranks() -> None:
    info = {
        "max_running_requests": None,
        "dp_size": 2,
        "context_length": 8192,
        "served_model_name": "Q",
        "internal_states": [
            {"dp_rank": 0, "effective_max_running_requests_per_dp": 37},
            {"dp_rank": 1, "effective_max_running_requests_per_dp": 35},
        ],
    }
    cap = parse_server_info(info)
    assert (cap.max_running, cap.dp_size, cap.context_length, cap.model) == (72, 2, 8192, "Q")


def test_server_info_configured_total_caps_effective() -> None:
    info = {
        "max_running_requests": 48,
        "dp_size": 1,
        "internal_states": [{"effective_max_running_requests_per_dp": 64}],
    }
    assert parse_server_info(info).max_running == 48


def test_server_info_missing_ranks_use_mean() -> None:
    info = {"dp_size": 4, "internal_states": [{"effective_max_running_requests_per_dp": 10}]}
    assert parse_server_info(info).max_running == 40


def test_server_info_without_capacity() -> None:
    assert parse_server_info({"max_running_requests": None}).max_running is None
    assert parse_server_info({"max_running_requests": 16}).max_running == 16
    assert parse_server_info("junk").max_running is None


def test_vllm_metrics_sum_over_labels() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0\n'
    )
    assert parse_vllm_metrics(text) == Load(running=5, waiting=7)
    assert parse_vllm_metrics('sglang:num_running_reqs{a="b"} 4\nsglang:num_queue_reqs 1\n') == (
        Load(running=4, waiting=1)
    )
    assert parse_vllm_metrics("other_metric 1\n") is None


def test_loads_new_and_old_shapes() -> None:
    new = {"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 1}, {"num_running_reqs": 2}]}
    assert parse_loads(new) == Load(running=5, waiting=1)
    old = [{"num_reqs": 4, "num_waiting_reqs": 2}]
    assert parse_loads(old) == Load(running=4, waiting=2)
    assert parse_loads({"nothing": 1}) is None


def test_models_and_base_url() -> None:
    data = {"data": [{"id": "Q", "owned_by": "vllm", "max_model_len": 4096}]}
    assert parse_models(data) == ("Q", "vllm", 4096)
    assert parse_models({"data": []}) == (None, None, None)
    assert base_url("http://h:1/v1/") == "http://h:1"
    assert base_url("http://h:1") == "http://h:1"
