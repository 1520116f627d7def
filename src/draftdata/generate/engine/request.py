"""One request to an endpoint as a typed item: what ``client.request_body`` builds the JSON body
from, last, when the request is sent.

A ``Request`` carries the messages (a chat) or a prompt of token ids (a ``/v1/completions``
call: hidden-states' prefill-only requests), the output limit, the sampling, ``n``, the
reasoning switch, whether token ids are asked for, and the extra body fields. The layers above
the transport read and replace its fields (``limits.py`` retries with a smaller
``max_tokens``, the client drops the token-id fields a server refuses); none of them reads a
body. This module builds no body and sends nothing (``client.py`` does both).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from draftdata.generate.config import Reasoning, Sampling
from draftdata.records import JsonDict, Message

TOKEN_ID_FIELDS = ("return_token_ids", "return_prompt_token_ids")  # the body's names for them

Call = Literal["chat", "completion"]  # /v1/chat/completions, /v1/completions


class Request(msgspec.Struct, kw_only=True, frozen=True):
    """One request to an endpoint, before it is a body (module docstring).

    ``chat``: ``messages`` (and ``tools``) to ``/v1/chat/completions``; ``completion``: a
    ``prompt`` of token ids to ``/v1/completions`` (hidden-states' prefill-only requests).
    ``max_tokens`` is the output limit; ``token_ids`` asks a chat answer for its token ids;
    ``extra_body`` goes into the body last and wins (``client.request_body``).
    """

    call: Call = "chat"
    model: str
    messages: list[Message] = msgspec.field(default_factory=list)
    prompt: list[int] | None = None
    tools: list[JsonDict] | None = None
    max_tokens: int
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    reasoning: Reasoning = "server"
    n: int = 1
    token_ids: bool = False
    extra_body: dict[str, Any] = msgspec.field(default_factory=dict)

    def with_max_tokens(self, limit: int) -> Request:
        """The same request with another output limit."""
        return msgspec.structs.replace(self, max_tokens=limit)

    def without_token_ids(self) -> Request:
        """The same request not asking for token ids."""
        return msgspec.structs.replace(self, token_ids=False)
