"""request_body, classify_http_error and error_message on real engine error texts."""

from __future__ import annotations

import msgspec
import pytest

import draftdata.errors as errors
from draftdata.errors import (
    ContextLengthError,
    EndpointFaultError,
    EndpointRefusedError,
    FatalRequestError,
    RateLimitedError,
    ServerError,
)
from draftdata.generate.config import Sampling
from draftdata.generate.engine.client import (
    EndpointClient,
    classify_http_error,
    error_message,
    request_body,
)
from draftdata.generate.engine.request import Request
from draftdata.records import FATAL_REASONS, Message
from draftdata.sim.shapes import context_message, error_body

MSGS = [Message(role="system", content="s"), Message(role="user", content="u")]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def body(**kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "tools": None,
        "model": "M",
        "max_tokens": 100,
        "sampling": Sampling(),
        "reasoning": "server",
        "n": 1,
        "token_ids": False,
        "extra_body": {},
    }
    args.update(kw)
    return request_body(Request(messages=MSGS, **args))  # type: ignore[arg-type]


def test_minimal_body() -> None:
    assert body() == {
        "model": "M",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "max_completion_tokens": 100,
        "max_tokens": 100,
    }


@pytest.mark.parametrize(
    ("mode", "kwargs"), [("on", {"enable_thinking": True}), ("off", {"enable_thinking": False})]
)
def test_reasoning_switch(mode: str, kwargs: dict[str, bool]) -> None:
    assert body(reasoning=mode)["chat_template_kwargs"] == kwargs
    assert "chat_template_kwargs" not in body(reasoning="server")


def test_extra_chat_template_kwargs_merge_with_the_switch() -> None:
    b = body(reasoning="off", extra_body={"chat_template_kwargs": {"x": 1}, "top_k": 5})
    assert b["chat_template_kwargs"] == {"x": 1, "enable_thinking": False}
    assert b["top_k"] == 5
    b = body(extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert b["chat_template_kwargs"] == {"enable_thinking": True}


def test_sampling_tools_n_and_token_ids() -> None:
    b = body(
        sampling=Sampling(temperature=0.6, top_p=0.95, top_k=20, seed=3),
        tools=TOOLS,
        n=4,
        token_ids=True,
    )
    assert (b["temperature"], b["top_p"], b["top_k"], b["seed"]) == (0.6, 0.95, 20, 3)
    assert b["tools"] == TOOLS and b["n"] == 4
    assert b["return_token_ids"] is True and b["return_prompt_token_ids"] is True
    plain = body(tools=[], n=1)
    for key in ("tools", "n", "return_token_ids", "return_prompt_token_ids", "temperature"):
        assert key not in plain


def test_body_messages_keep_tool_fields_and_encode() -> None:
    call = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msgs = [
        Message(role="user", content="u"),
        Message(role="assistant", tool_calls=call),
        Message(role="tool", content="r", tool_call_id="c"),
    ]
    b = request_body(
        Request(
            messages=msgs,
            tools=TOOLS,
            model="M",
            max_tokens=5,
            sampling=Sampling(),
            reasoning="on",
            n=1,
            token_ids=False,
            extra_body={},
        )
    )
    assert b["messages"][1] == {"role": "assistant", "tool_calls": call}
    assert b["messages"][2] == {"role": "tool", "content": "r", "tool_call_id": "c"}
    assert msgspec.json.decode(msgspec.json.encode(b)) == b


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
@pytest.mark.parametrize(("prompt", "max_new"), [(9000, None), (8000, 1000)])
def test_engine_context_errors_are_context_length(
    flavor: str, prompt: int, max_new: int | None
) -> None:
    text = context_message(flavor, prompt, max_new, 8192)
    assert text is not None
    raw = msgspec.json.encode(error_body(flavor, 400, text)).decode()
    assert classify_http_error(400, raw) is ContextLengthError
    assert error_message(raw) == text


@pytest.mark.parametrize(
    "text",
    [
        # OpenAI
        '{"error": {"message": "This model\'s maximum context length is 8192 tokens. However, '
        'your messages resulted in 9000 tokens. Please reduce the length of the messages.", '
        '"type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}',
        # older vLLM flat body
        '{"object": "error", "message": "This model\'s maximum context length is 4096 tokens. '
        'However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).", '
        '"type": "BadRequestError", "param": null, "code": 400}',
    ],
)
def test_other_context_texts(text: str) -> None:
    assert classify_http_error(400, text) is ContextLengthError


@pytest.mark.parametrize(
    ("status", "text", "expected"),
    [
        (
            400,
            '{"object": "error", "message": "messages.0.role: unknown role \'gpt2\'"}',
            "invalid_request",
        ),
        (
            404,
            '{"error": {"message": "The model `x` does not exist.", "code": 404}}',
            "refused",
        ),
        (
            422,
            '{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}',
            "invalid_request",
        ),
        (401, "Unauthorized", "refused"),
        (403, "Forbidden", "refused"),
        (405, "Method Not Allowed", "refused"),
        (501, "Not Implemented", "refused"),
        # a refusal's wording never makes it the prompt's fault
        (404, "maximum context length is 8192 tokens", "refused"),
        (408, "", "timeout"),
        (429, '{"error": {"message": "Too many requests: simulated"}}', "rate_limited"),
        (500, "Internal server error: simulated failure", "server_error"),
        (502, "<html>Bad Gateway</html>", "server_error"),
        (503, "Service unavailable", "server_error"),
        # the wording must come with a 4xx: a 500 that mentions context is still the server's
        (500, "context length exceeded while scheduling", "server_error"),
    ],
)
def test_classify_statuses(status: int, text: str, expected: str) -> None:
    assert classify_http_error(status, text).reason == expected


@pytest.mark.parametrize("status", [401, 403, 404, 405, 407, 501])
def test_refusals_are_endpoint_refused_errors_by_type(status: int) -> None:
    err = classify_http_error(status, "")("no", status=status)
    assert isinstance(err, EndpointRefusedError) and isinstance(err, EndpointFaultError)
    assert not isinstance(err, FatalRequestError)
    other = classify_http_error(400, "")("bad", status=400)
    assert not isinstance(other, EndpointFaultError)


def test_error_message_shapes() -> None:
    assert error_message('{"error": {"message": "a\\n b"}}') == "a b"
    assert error_message('{"object": "error", "message": "flat"}') == "flat"
    assert error_message('{"detail": "Not Found"}') == "Not Found"
    assert error_message("plain text") == "plain text"
    assert len(error_message("x" * 2000)) == 500


def test_request_error_fields() -> None:
    e = ContextLengthError("too long", status=400)
    assert e.status == 400 and e.reason == "context_length" and e.retry_after is None
    assert isinstance(e, FatalRequestError)
    assert str(e) == "context_length: HTTP 400: too long"
    r = RateLimitedError("slow down", status=429, retry_after=2.0)
    assert not isinstance(r, FatalRequestError) and r.retry_after == 2.0


def test_the_fatal_error_types_are_the_fatal_failure_reasons() -> None:
    """A Failure whose reason is fatal is skipped on resume (records.FATAL_REASONS): exactly
    the reasons of the FatalRequestError types; every raised type has its own reason."""
    leaves = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, ServerError) and c is not ServerError
    ]
    fatal = {c.reason for c in leaves if issubclass(c, FatalRequestError)}
    assert fatal == FATAL_REASONS
    raised = [c for c in leaves if c is not EndpointFaultError]
    assert len({c.reason for c in raised}) == len(raised)


def test_client_base_url_and_repr_hide_the_key() -> None:
    c = EndpointClient("http://h:1/v1/", api_key="sk-secret")
    assert c.base_url == "http://h:1"
    assert c.chat_url == "http://h:1/v1/chat/completions"
    assert "sk-secret" not in repr(c) and "sk-secret" not in str(vars(c).get("base_url"))
    assert EndpointClient("http://h:1").chat_url == "http://h:1/v1/chat/completions"
