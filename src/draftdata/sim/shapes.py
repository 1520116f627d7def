"""JSON and Prometheus bodies exactly as SGLang 0.5.x and vLLM >= 0.11 shape them.

Pure functions from already-decided values to the dicts/text the server sends; the field sets
and null conventions follow the engines' pydantic models (SGLang ``ChatCompletionResponse`` with
per-choice ``prompt_token_ids``/``response_token_ids`` and ``matched_stop``; vLLM's with top-level
``prompt_token_ids`` and per-choice ``token_ids``/``stop_reason``). The exact shapes are listed
in ``draftdata.sim.run``'s docstring. This module decides nothing and does no I/O.
"""

from __future__ import annotations

import time
from typing import Any

from draftdata.sim.answers import Parsed
from draftdata.sim.config import SimConfig
from draftdata.sim.spec import SpecCounters

ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(flavor: str, status: int, message: str) -> dict[str, Any]:
    """SGLang: a flat ``ErrorResponse``; vLLM: ``{"error": {...}}``."""
    err = {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": None}
    if flavor == "sglang":
        return {"object": "error", **err, "code": status}
    return {"error": {**err, "code": status}}


def context_message(flavor: str, prompt: int, max_new: int | None, context: int) -> str | None:
    """The engine's too-long message, or None when the request fits.

    SGLang refuses ``prompt >= C`` and ``prompt + max_new >= C``; vLLM refuses
    ``prompt >= C`` and ``prompt + max_tokens > C``.
    """
    if flavor == "sglang":
        if prompt >= context:
            return (
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({context} tokens)."
            )
        if max_new is not None and prompt + max_new >= context:
            return (
                f"Requested token count exceeds the model's maximum context length of {context} "
                f"tokens. You requested a total of {prompt + max_new} tokens: {prompt} tokens "
                f"from the input messages and {max_new} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the "
                "limit."
            )
        return None
    if prompt >= context:
        return (
            f"This model's maximum context length is {context} tokens. However, your request "
            f"has {prompt} input tokens. Please reduce the length of the input messages."
        )
    if max_new is not None and prompt + max_new > context:
        return (
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_new}. This model's "
            f"maximum context length is {context} tokens and your request has {prompt} input "
            f"tokens ({max_new} > {context} - {prompt})."
        )
    return None


def usage(
    flavor: str, prompt: int, completion: int, cached: int | None, reasoning: int
) -> dict[str, Any]:
    """``usage``; ``prompt_tokens_details`` is ``{"cached_tokens": N}`` with cache report on."""
    details = {"cached_tokens": cached} if cached is not None else None
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
    }
    if flavor == "sglang":
        out["reasoning_tokens"] = reasoning
    return out


def tool_call(flavor: str, call_id: str, index: int, name: str, arguments: str) -> dict[str, Any]:
    """One ``message.tool_calls[]`` entry (arguments a JSON string)."""
    fn = {"name": name, "arguments": arguments}
    if flavor == "sglang":
        return {"id": call_id, "index": index, "type": "function", "function": fn}
    return {"id": call_id, "type": "function", "function": fn}


def message(flavor: str, parsed: Parsed, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """``choices[].message``: SGLang ``reasoning_content``; vLLM ``reasoning``."""
    if flavor == "sglang":
        return {
            "role": "assistant",
            "content": parsed.content,
            "reasoning_content": parsed.reasoning,
            "tool_calls": calls or None,
        }
    out: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls:
        out["tool_calls"] = calls
    out["reasoning"] = parsed.reasoning
    return out


def choice(
    flavor: str,
    index: int,
    msg: dict[str, Any],
    finish: str,
    matched_stop: int | None,
    prompt_ids: list[int] | None,
    output_ids: list[int] | None,
) -> dict[str, Any]:
    """One ``choices[]`` entry; token-id fields only where the flavour puts them."""
    if flavor == "sglang":
        out: dict[str, Any] = {
            "index": index,
            "message": msg,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched_stop,
        }
        if prompt_ids is not None:
            out["prompt_token_ids"] = prompt_ids
        if output_ids is not None:
            out["response_token_ids"] = output_ids  # SGLang 0.5.x's name for the output ids
        return out
    return {
        "index": index,
        "message": msg,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": output_ids,
    }


def _spec_metrics(lab: str, spec: SpecCounters) -> list[str]:
    """vLLM's speculative-decoding counters (global to the server)."""
    lines: list[str] = []
    for name, value in (
        ("num_drafts", spec.drafts),
        ("num_draft_tokens", spec.draft_tokens),
        ("num_accepted_tokens", spec.accepted),
    ):
        lines += [
            f"# TYPE vllm:spec_decode_{name}_total counter",
            f"vllm:spec_decode_{name}_total{{{lab}}} {float(value)}",
        ]
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
    for pos, value in enumerate(spec.per_pos):
        lines.append(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{pos}"}} '
            f"{float(value)}"
        )
    return lines


def completion(
    flavor: str,
    rid: str,
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None,
    prompt_ids: list[int] | None,
    spec_details: Any = None,
) -> dict[str, Any]:
    """The whole non-streaming ``chat.completion`` body (SGLang: ``sglext`` with the
    speculative details when asked for; no ``usage`` key when ``usage_`` is None)."""
    base: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if flavor == "sglang":
        out = {**base, "usage": usage_, "metadata": {"weight_version": "default"}}
        if spec_details is not None:
            out["sglext"] = {"spec_tokens_details": spec_details}
    else:
        out = {
            **base,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage_,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids,
            "kv_transfer_params": None,
        }
    if usage_ is None:
        del out["usage"]
    return out


def delta(
    flavor: str,
    *,
    role: str | None = None,
    content: str | None = None,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A streaming ``delta``: SGLang lists every field (nulls), vLLM only the set ones."""
    if flavor == "sglang":
        return {
            "role": role,
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": tool_calls,
        }
    out: dict[str, Any] = {}
    if role is not None:
        out["role"] = role
    if content is not None:
        out["content"] = content
    if reasoning is not None:
        out["reasoning"] = reasoning
    if tool_calls is not None:
        out["tool_calls"] = tool_calls
    return out


def chunk(
    flavor: str,
    rid: str,
    model: str,
    choices: list[dict[str, Any]],
    *,
    usage_: dict[str, Any] | None = None,
    prompt_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (vLLM: ``prompt_token_ids`` on the first chunk only)."""
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }
    if flavor == "vllm" and prompt_ids is not None:
        out["prompt_token_ids"] = prompt_ids
    return out


def stream_choice(
    flavor: str,
    index: int,
    delta_: dict[str, Any],
    finish: str | None = None,
    matched_stop: int | None = None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One ``choices[]`` entry of a chunk (vLLM: per-chunk ``token_ids`` when asked)."""
    if flavor == "sglang":
        return {
            "index": index,
            "delta": delta_,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched_stop,
        }
    out: dict[str, Any] = {
        "index": index,
        "delta": delta_,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


def models(config: SimConfig) -> dict[str, Any]:
    """``GET /v1/models``: one model card with ``owned_by`` and ``max_model_len``."""
    card: dict[str, Any] = {
        "id": config.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": config.flavor,
        "root": config.model_path,
        "parent": None,
        "max_model_len": config.context_length,
    }
    if config.flavor == "vllm":
        card["permission"] = []
    return {"object": "list", "data": [card]}


def server_info(
    config: SimConfig,
    port: int,
    throughput: float,
    tokenizer: str | None,
    accept_length: float | None = None,
) -> dict[str, Any]:
    """SGLang ``GET /server_info``: the server args, ``internal_states`` and ``version`` (with
    speculative decoding: its algorithm, ``speculative_num_draft_tokens`` and the recent
    ``avg_spec_accept_length``)."""
    per_dp = max(1, config.max_running // config.dp_size)
    spec = config.spec_tokens > 0
    return {
        "model_path": config.model_path,
        "tokenizer_path": tokenizer or config.model_path,
        "served_model_name": config.model,
        "host": config.host,
        "port": port,
        "context_length": config.context_length,
        "max_running_requests": config.max_running if config.report_max_running else None,
        "max_total_tokens": None,
        "max_prefill_tokens": 16384,
        "chunked_prefill_size": 8192,
        "mem_fraction_static": 0.88,
        "schedule_policy": "fcfs",
        "tp_size": 1,
        "dp_size": config.dp_size,
        "attention_backend": "flashinfer",
        "mamba_scheduler_strategy": "no_buffer",
        "reasoning_parser": "qwen3" if config.reasoning == "parsed" else None,
        "tool_call_parser": "qwen25",
        "enable_cache_report": config.cache_report,
        "enable_metrics": True,
        "random_seed": config.seed,
        "stream_interval": config.stream_interval,
        "speculative_algorithm": "EAGLE3" if spec else None,
        "speculative_num_steps": config.spec_tokens if spec else None,
        "speculative_num_draft_tokens": config.spec_tokens + 1 if spec else None,
        "internal_states": [
            {
                "dp_rank": rank,
                "effective_max_running_requests_per_dp": per_dp,
                "last_gen_throughput": round(throughput / config.dp_size, 2),
                "memory_usage": {},
                **({"avg_spec_accept_length": accept_length} if spec else {}),
            }
            for rank in range(config.dp_size)
        ],
        "version": config.version,
        "simulated": True,
    }


def loads(running: int, waiting: int, used_tokens: int, dp_size: int) -> dict[str, Any]:
    """SGLang ``GET /v1/loads``: per-DP-rank running/waiting counts and their sum."""
    ranks = []
    for rank in range(dp_size):
        ranks.append(
            {
                "dp_rank": rank,
                "num_running_reqs": running // dp_size + (1 if rank < running % dp_size else 0),
                "num_waiting_reqs": waiting // dp_size + (1 if rank < waiting % dp_size else 0),
                "num_used_tokens": used_tokens // dp_size,
            }
        )
    return {
        "timestamp": time.time(),
        "dp_rank_count": dp_size,
        "loads": ranks,
        "aggregate": {
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_used_tokens": used_tokens,
        },
    }


def metrics(
    config: SimConfig,
    running: int,
    waiting: int,
    generated: int,
    prompt: int,
    finished: dict[str, int],
    throughput: float,
    spec: SpecCounters | None = None,
) -> str:
    """Prometheus text: vLLM's ``vllm:*`` names (with speculative decoding, its
    ``vllm:spec_decode_*`` counters), or SGLang's ``sglang:*`` (--enable-metrics)."""
    m = config.model.replace('"', '\\"')
    if config.flavor == "vllm":
        lab = f'engine="0",model_name="{m}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{lab}}} {float(prompt)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {float(generated)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason in ("stop", "length", "abort"):
            lines.append(
                f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} '
                f"{float(finished.get(reason, 0))}"
            )
        if spec is not None:
            lines += _spec_metrics(lab, spec)
        return "\n".join(lines) + "\n"
    lab = f'model_name="{m}"'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{lab}}} {float(running)}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{lab}}} {float(waiting)}",
        "# HELP sglang:gen_throughput The generation throughput (token/s).",
        "# TYPE sglang:gen_throughput gauge",
        f"sglang:gen_throughput{{{lab}}} {round(throughput, 3)}",
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{{{lab}}} {float(prompt)}",
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total{{{lab}}} {float(generated)}",
    ]
    return "\n".join(lines) + "\n"


def hidden_completion(config: SimConfig, rid: str, prompt_tokens: int, path: str) -> dict[str, Any]:
    """vLLM 0.32's ``/v1/completions`` answer with the hidden-states connector: one generated
    token and ``kv_transfer_params.hidden_states_path`` (sim/hidden.py)."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": config.model,
        "choices": [
            {
                "index": 0,
                "text": " the",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": f"vllm-{config.version}-sim",
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + 1,
            "completion_tokens": 1,
            "prompt_tokens_details": None,
        },
        "kv_transfer_params": {"hidden_states_path": path},
    }
