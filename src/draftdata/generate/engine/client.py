"""One inference endpoint over HTTP: request bodies, the transport, and error classes.

This is the narrow transport seam of the generation engine: a ``Request`` is one request as a
typed item (the messages or a prompt of token ids, the output limit, sampling, ``n``, the
reasoning switch, token ids asked, extra body fields, and which endpoint call it is); its JSON
body is built from it last, in one place (``Request.body``), when it is sent.
``EndpointClient.chat`` sends one and returns Turns or raises one of the ``ServerError`` leaves
of ``draftdata.errors``; the layers above (``limits.py``'s smaller retry, the token-id fallback
here) read and replace the item's fields, never a body. Every raw failure (HTTP
status, aiohttp timeout, reset, disconnect, unreadable body) is mapped to its type here, in one
place, so the engine decides retries by type and never by message text.

The client also detects once per endpoint whether the server returns token ids: the first
requests ask for them; a server that rejects the fields (a 400 naming them) is asked again
without, and one that answers without ids is not asked again. Neither ever fails a request.

Answers are bounded (``bounds.py``): a body is read up to a limit tied to the request's
``max_tokens`` and a whole answer must arrive within the read timeout (a deadline per request,
not per chunk, so a server that trickles bytes is timed out too); an answer over the limit or
with impossible usage raises ``ImpossibleAnswerError``, the endpoint's fault. Every server text
and error message passes through the client's ``Redactor`` (``draftdata.support.redact``): an echoed
``Authorization`` header, the API key or a URL password never reaches a log line, a Failure or
an exception, and the URL it shows (``shown``) has no password.

It deliberately holds no policy: no retries beyond that one token-id fallback, no backoff, no
dispatch, no logging of request contents (and never of the API key).
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import msgspec

from draftdata.errors import (
    ConnectionLostError,
    ContextLengthError,
    EndpointRefusedError,
    FatalRequestError,
    ImpossibleAnswerError,
    MalformedAnswerError,
    RateLimitedError,
    RequestTimeoutError,
    RetryableServerError,
    ServerError,
)
from draftdata.generate.answers.bounds import answer_fault, body_limit
from draftdata.generate.answers.parse import decode_chat_response
from draftdata.generate.engine.request import TOKEN_ID_FIELDS, Request
from draftdata.records import Turn
from draftdata.support.redact import Redactor, redact_url

# Answers that say "this endpoint serves nothing here" (a rotated key, a renamed served model, a
# server that is not OpenAI-compatible), whatever the request: the endpoint's fault.
REFUSAL_STATUSES = frozenset({401, 403, 404, 405, 407, 501})


# Too-long wording of SGLang ("longer than the model's context length", "exceeds the model's
# maximum context length"), vLLM ("maximum context length is C tokens", "'max_tokens' or
# 'max_completion_tokens' is too large") and OpenAI ("context_length_exceeded").
_CONTEXT_RE = re.compile(
    r"context[ _-]length|maximum context|context window|max_model_len|"
    r"'max_tokens' or 'max_completion_tokens' is too large|prompt is too long|"
    r"input is too long|too many (input )?tokens",
    re.IGNORECASE,
)


def classify_http_error(status: int, body_text: str) -> type[ServerError]:
    """The error type of an HTTP error answer: 401/403/404/405/407/501 are refusals (the
    endpoint's fault), other 4xx the request's (context-length wording gives
    ``ContextLengthError``), 408 is a timeout, 429 rate limiting, other 5xx the server's
    fault."""
    if status in REFUSAL_STATUSES:
        return EndpointRefusedError
    if status == 429:
        return RateLimitedError
    if status == 408:
        return RequestTimeoutError
    if status >= 500:
        return RetryableServerError
    if 400 <= status < 500:
        if status in (400, 413, 422) and _CONTEXT_RE.search(body_text):
            return ContextLengthError
        return FatalRequestError
    return MalformedAnswerError  # 1xx/2xx/3xx where a completion was expected


def error_message(body_text: str, limit: int = 500) -> str:
    """The ``message`` of an OpenAI-style error body (vLLM nested, SGLang flat), else the text."""
    text = body_text.strip()
    try:
        data = msgspec.json.decode(text) if text.startswith("{") else None
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = err["message"]
        elif isinstance(err, str):
            text = err
        elif isinstance(data.get("message"), str):
            text = data["message"]
        elif isinstance(data.get("detail"), str):
            text = data["detail"]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def request_body(request: Request) -> dict[str, Any]:
    """The JSON body of ``request``, the one place a body is built (``EndpointClient`` sends
    it; ``caller.py`` records it).

    Chat: ``max_completion_tokens`` (SGLang's and OpenAI's current name; it counts
    reasoning) and ``max_tokens`` (older servers) both carry ``max_tokens``. Reasoning
    ``on``/``off`` sets ``chat_template_kwargs.enable_thinking``; ``server`` leaves the
    server's default. Token ids ask for ``return_token_ids`` (vLLM: prompt and output ids;
    SGLang: output ids) and ``return_prompt_token_ids`` (SGLang's prompt ids; vLLM ignores
    it). ``tools`` only when given, ``n`` only when above 1. ``extra_body`` goes in last and
    wins, except that its ``chat_template_kwargs`` are merged with the reasoning switch.
    Completion: the model, the prompt, ``max_tokens``, the sampling, ``n`` above 1, then
    ``extra_body``.
    """
    if request.call == "completion":
        body: dict[str, Any] = {
            "model": request.model,
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
        }
        body.update(request.sampling.body())
        if request.n > 1:
            body["n"] = request.n
        body.update(request.extra_body)
        return body
    body = {
        "model": request.model,
        "messages": msgspec.to_builtins(request.messages),
        "max_completion_tokens": request.max_tokens,
        "max_tokens": request.max_tokens,
    }
    body.update(request.sampling.body())
    if request.tools:
        body["tools"] = request.tools
    if request.n > 1:
        body["n"] = request.n
    if request.token_ids:
        for field in TOKEN_ID_FIELDS:
            body[field] = True
    kwargs: dict[str, Any] = {}
    if request.reasoning != "server":
        kwargs["enable_thinking"] = request.reasoning == "on"
    extra = dict(request.extra_body)
    user_kwargs = extra.pop("chat_template_kwargs", None)
    if isinstance(user_kwargs, dict):
        kwargs = {**user_kwargs, **kwargs}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    body.update(extra)
    return body


def token_ids_refusal(url: str) -> str:
    """The one-line error of ``--token-ids on`` against a server that returns no ids."""
    return (
        f"generate: --token-ids on: {url} does not return token ids (SGLang and vLLM return "
        "them with return_token_ids in recent versions); use --token-ids auto (ids where a "
        "server returns them) or off"
    )


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: let the engine's backoff decide


UNBOUNDED_TOKENS = 1 << 17  # the size bound's output limit for a request that sets none


def _too_large(size: str, cap: int, limit: int) -> ImpossibleAnswerError:
    return ImpossibleAnswerError(
        f"an answer of {size} bytes to a request for at most {cap} tokens "
        f"(the bound is {limit:,} bytes)"
    )


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int, cap: int) -> bytes:
    """The body of ``resp`` (an answer to a request for at most ``cap`` tokens), or
    ImpossibleAnswerError as soon as it is known to pass ``limit`` bytes (the rest is never
    read: the connection is dropped with the response)."""
    if resp.content_length is not None and resp.content_length > limit:
        raise _too_large(f"{resp.content_length:,}", cap, limit)
    data = bytearray()
    async for chunk in resp.content.iter_any():
        data += chunk
        if len(data) > limit:
            raise _too_large(f"more than {len(data):,}", cap, limit)
    return bytes(data)


class EndpointClient:
    """HTTP client of one OpenAI-compatible server: one pooled keep-alive session.

    ``base_url`` is the server root with or without ``/v1``. The connect timeout is short (a
    dead server is found fast); the read timeout is long (a non-streaming answer of thousands
    of tokens sends nothing until it is done). Use ``async with`` or call ``close()``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10,
        read_timeout: float = 3600,
        pool_size: int = 64,
    ) -> None:
        root = base_url.strip().rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        self.base_url = root
        self.shown = redact_url(root)  # the form of the URL any message may carry
        self.redact = Redactor.of(api_key, [root])
        self.chat_url = f"{root}/v1/chat/completions"
        self.completions_url = f"{root}/v1/completions"
        self.token_ids_supported: bool | None = None
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # a deadline for the whole answer, not per read: a trickling server is timed out too
        self.read_timeout = read_timeout
        self._timeout = aiohttp.ClientTimeout(
            total=connect_timeout + read_timeout,
            sock_connect=connect_timeout,
            sock_read=read_timeout,
        )
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._encode = msgspec.json.Encoder().encode

    def __repr__(self) -> str:  # never shows the key
        return f"EndpointClient({self.shown!r})"

    async def __aenter__(self) -> EndpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # SGLang and vLLM serve with uvicorn, which closes idle keep-alive connections after
            # 5 s: dropping ours first avoids sending on a socket the server is closing.
            connector = aiohttp.TCPConnector(
                limit=self._pool_size, limit_per_host=self._pool_size, keepalive_timeout=4.0
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                headers=self._headers,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _error(self, kind: type[ServerError], message: str, **kw: Any) -> ServerError:
        return kind(self.redact(message), **kw)

    def _raise_for_status(self, status: int, data: bytes, retry_after: str | None) -> None:
        """The ``ServerError`` leaf of an answer that is not 200 (``classify_http_error``),
        carrying the server's own message with secrets hidden; nothing for a 200."""
        if status == 200:
            return
        text = data.decode("utf-8", "replace")
        raise self._error(
            classify_http_error(status, text),
            error_message(self.redact(text)) or f"HTTP {status}",  # said shows it once
            status=status,
            retry_after=_retry_after(retry_after),
        )

    async def _post(
        self, data: bytes, url: str, *, max_tokens: int | None, n: int
    ) -> tuple[int, bytes, str | None]:
        """POST the encoded body ``data`` of a request for at most ``max_tokens`` output tokens
        in ``n`` choices; (status, the answer read within its bound, Retry-After)."""
        session = self._get_session()
        cap = max_tokens or UNBOUNDED_TOKENS
        limit = body_limit(len(data), cap, n)
        try:
            async with session.post(url, data=data) as resp:
                answer = await _read_bounded(resp, limit, cap)
                return resp.status, answer, resp.headers.get("Retry-After")
        except aiohttp.ConnectionTimeoutError as exc:
            raise self._error(
                ConnectionLostError, f"cannot connect to {self.shown}: connect timed out"
            ) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise self._error(
                RequestTimeoutError,
                f"no whole answer from {self.shown} within {self.read_timeout:g} s "
                f"({exc or 'timeout'})",
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            raise self._error(
                ConnectionLostError, f"cannot connect to {self.shown}: {exc.os_error}"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            # resets, disconnects, payloads cut short
            raise self._error(
                ConnectionLostError,
                f"connection to {self.shown} lost: {type(exc).__name__}: {exc}",
            ) from exc

    def _url(self, request: Request) -> str:
        return self.chat_url if request.call == "chat" else self.completions_url

    async def _send(self, request: Request) -> tuple[int, bytes, str | None]:
        """Build ``request``'s body, encode and POST it to its call's URL."""
        data = self._encode(request_body(request))
        return await self._post(
            data, self._url(request), max_tokens=request.max_tokens, n=request.n
        )

    async def send_json(self, request: Request) -> dict[str, Any]:
        """Send ``request`` (a chat, or a ``/v1/completions`` prompt of token ids: the
        prefill-only requests of ``hidden-states --engine vllm``); return the decoded answer
        object (for fields the Turns do not carry) or raise a ``ServerError`` leaf."""
        return self._decode_json(*await self._send(request))

    async def chat_json(self, body: dict[str, Any], *, max_tokens: int | None) -> dict[str, Any]:
        """Send a chat-completions body built elsewhere, as it is (``acceptance``: bodies with
        fields of its own, sent to servers of several models, one choice each); ``max_tokens``
        is the limit it carries (the answer's size bound). The decoded answer object or a
        ``ServerError`` leaf, mapped as for ``chat``."""
        sent = await self._post(self._encode(body), self.chat_url, max_tokens=max_tokens, n=1)
        return self._decode_json(*sent)

    def _decode_json(self, status: int, data: bytes, retry_after: str | None) -> dict[str, Any]:
        self._raise_for_status(status, data, retry_after)
        try:
            answer = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise self._error(MalformedAnswerError, f"not JSON: {exc}", status=status) from exc
        if not isinstance(answer, dict):
            raise self._error(MalformedAnswerError, "the answer is not a JSON object")
        return answer

    async def chat(self, request: Request) -> list[Turn]:
        """Send one chat request; return its Turns or raise a ``ServerError`` leaf.

        A choice that the server aborted (``finish_reason: abort``) raises
        ``RetryableServerError``.
        """
        asked = request.token_ids
        if asked and self.token_ids_supported is False:
            request = request.without_token_ids()
            asked = False
        data = self._encode(request_body(request))
        status, answer, retry_after = await self._post(
            data, self.chat_url, max_tokens=request.max_tokens, n=request.n
        )
        if status == 400 and asked and self.token_ids_supported is not True:
            text = answer.decode("utf-8", "replace")
            if any(f in text for f in TOKEN_ID_FIELDS):
                self.token_ids_supported = False
                request = request.without_token_ids()
                asked = False
                data = self._encode(request_body(request))
                status, answer, retry_after = await self._post(
                    data, self.chat_url, max_tokens=request.max_tokens, n=request.n
                )
        self._raise_for_status(status, answer, retry_after)
        try:
            turns = decode_chat_response(answer)
        except MalformedAnswerError as exc:
            raise self._error(MalformedAnswerError, exc.message[:500], status=status) from exc
        fault = answer_fault(
            turns, max_tokens=request.max_tokens, request_bytes=len(data), n=request.n
        )
        if fault is not None:
            raise self._error(ImpossibleAnswerError, f"an impossible answer: {fault}")
        if asked and self.token_ids_supported is None:
            self.token_ids_supported = all(t.output_token_ids is not None for t in turns)
        if any(t.finish_reason == "abort" for t in turns):
            raise RetryableServerError("the server aborted the request")
        return turns
