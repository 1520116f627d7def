"""Records that flow between stages: Prompt, Completion, Failure, Sample.

These are the public contracts of the pipeline (ARCHITECTURE.md: the layer everything rests
on). Prompts travel as JSONL, one object per line, where only ``id`` and ``messages`` are
required; completions, failures and samples travel as parquet (see ``formats.py`` for the
Arrow schemas and format versions).

Validation lives here: ``parse_prompt`` turns one raw JSON line into a Prompt or raises an
InputError located as ``file:line: field: what is wrong``. This module does no file I/O (reading
a prompts file, local or s3://, is ``store/prompts.py``) and imports nothing of the project but
errors: it is the contract every layer above shares.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, TypeVar

import msgspec

from draftdata.errors import InputError

ROLES = ("system", "user", "assistant", "tool")

JsonDict = dict[str, Any]


class Message(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One OpenAI-format chat message; ``reasoning_content`` only on assistant turns."""

    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[JsonDict] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class Prompt(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """A conversation to be answered by the target model."""

    id: str
    messages: list[Message]
    source: str = ""
    domain: str = ""
    tools: list[JsonDict] | None = None
    meta: JsonDict = msgspec.field(default_factory=dict)


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    """Token accounting of one request (or the sum over a completion's turns)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Turn(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One regenerated assistant turn, exactly as the target produced it."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[JsonDict] | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    usage: Usage = msgspec.field(default_factory=Usage)


class Completion(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """The target's answer to one Prompt (one of ``n`` samples when ``sample`` > 0)."""

    id: str
    sample: int = 0
    source: str = ""
    domain: str = ""
    messages: list[Message]
    tools: list[JsonDict] | None = None
    turns: list[Turn]
    usage: Usage = msgspec.field(default_factory=Usage)
    model: str = ""
    sampling: JsonDict = msgspec.field(default_factory=dict)
    endpoint: str = ""
    latency_s: float = 0.0
    attempts: int = 1
    created: float = 0.0
    # why the conversation stopped before its last request (conversation.STOP_REASONS), or None
    stop_reason: str | None = None
    # the conversation rule the turns were generated under (conversation.RULE; 1 = before it)
    conversation_rule: int = 2
    # the thinking mode the answering server applied by default to requests that left it to the
    # server (no ``enable_thinking``), as generate knew it per answer
    # (generate/answers/thinking.py); None: not known, or not needed (the request chose the mode)
    server_thinking: bool | None = None


def sample_key(id_: str, sample: int) -> str:
    """The id of sample ``sample`` of prompt ``id_`` in exports and datasets (``id#sN``)."""
    return id_ if sample == 0 else f"{id_}#s{sample}"


# Derived ids: a prompt's sample ``id#s<N>`` (sample_key) and a turn's ``<id or sample>#<T>``
# (tokenize's per-turn samples, export's per-turn rows) always end in one of these suffixes.
_DERIVED_SUFFIX = re.compile(r"#s?[0-9]+\Z")
DERIVED_ID = "derived_id"


def derived_id_fault(id_: str) -> str | None:
    """Why ``id_`` may not be a prompt's id (None when it may): it ends like a derived id
    (``#<digits>`` or ``#s<digits>``), so a sample or turn of another prompt could carry the
    same id. Ids without such an ending can never equal a derived id, and two derived ids of
    different prompts never meet (the suffixes read back uniquely)."""
    m = _DERIVED_SUFFIX.search(id_)
    if m is None:
        return None
    return (
        f"{DERIVED_ID}: id {id_!r} ends in {m.group()!r}, the form of the ids tokenize and "
        "export derive for a prompt's turns and samples (id#<turn>, id#s<sample>), so it could "
        f"collide with one; rename it (e.g. {id_[: m.start()] + '-' + m.group()[1:]!r})"
    )


FATAL_REASONS = frozenset({"context_length", "invalid_request"})


class Failure(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """A prompt that could not be completed, with its reason class."""

    id: str
    sample: int = 0
    stage: str = "generate"
    reason: str
    message: str = ""
    attempts: int = 0
    source: str = ""
    domain: str = ""
    endpoint: str = ""
    created: float = 0.0

    @property
    def fatal(self) -> bool:
        """Fatal failures are not retried on resume unless the user asks."""
        return self.reason in FATAL_REASONS


class Sample(msgspec.Struct, kw_only=True, frozen=True):
    """One tokenized training sample; ``loss_mask`` is 1 on target-produced tokens."""

    id: str
    source: str = ""
    domain: str = ""
    input_ids: list[int]
    loss_mask: list[int]
    num_tokens: int
    num_loss_tokens: int
    truncated: bool = False


# ---------------------------------------------------------------------------------------------
# Validation


def normalise_text(text: str) -> str:
    """Whitespace-collapsed, case-folded text: the basis of content hashes and exact dedup."""
    return " ".join(text.split()).casefold()


def content_hash(messages: list[Message], tools: list[JsonDict] | None = None) -> str:
    """A stable id for a conversation: sha1 over roles and normalised contents (and tools)."""
    h = hashlib.sha1()
    for m in messages:
        h.update(m.role.encode())
        h.update(b"\x00")
        h.update(normalise_text(m.content or "").encode())
        h.update(b"\x01")
        if m.tool_calls:
            h.update(msgspec.json.encode(m.tool_calls))
    if tools:
        h.update(msgspec.json.encode(tools))
    return h.hexdigest()[:20]


def validate_messages(messages: list[Message], *, prompt: bool = True) -> None:
    """Check roles, contents and turn structure; raise ValueError('field: what') on the first fault.

    ``prompt=True`` also requires a user turn and forbids a trailing assistant turn with nothing
    after it being the only thing there.
    """
    if not messages:
        raise ValueError("messages: empty conversation")
    has_user = False
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise ValueError(f"{where}.role: {m.role!r} is not one of {'/'.join(ROLES)}")
        if m.content is not None and not isinstance(m.content, str):
            raise ValueError(f"{where}.content: expected a string")
        if m.role == "user":
            has_user = True
            if not (m.content or "").strip():
                raise ValueError(f"{where}.content: empty user message")
        if m.role == "assistant" and not (m.content or "").strip() and not m.tool_calls:
            raise ValueError(f"{where}.content: assistant message with no content or tool calls")
        if m.role == "tool" and m.content is None:
            raise ValueError(f"{where}.content: tool message without content")
    if prompt and not has_user:
        raise ValueError("messages: no user turn")
    if (fault := tool_order_fault(messages)) is not None:
        raise ValueError(fault)


def tool_order_fault(messages: list[Message]) -> str | None:
    """Why a ``tool`` message answers no tool call (``messages[i]: ...``), else None.

    A tool message must follow an assistant message with ``tool_calls`` (other tool messages
    may stand between: one answer per call); when both the message's ``tool_call_id`` and the
    calls' ids are given, the id must be one of those calls'. The OpenAI API refuses other
    conversations, and a chat template renders them as nonsense. Shared by ``parse_prompt``
    (generate, stats, merge) and prepare's ``check_prompt``.
    """
    calls: list[JsonDict] | None = None  # the tool calls the current run of tool messages answers
    for i, m in enumerate(messages):
        if m.role != "tool":
            calls = m.tool_calls if m.role == "assistant" else None
            continue
        if not calls:
            return f"messages[{i}]: tool message without a preceding assistant tool call"
        ids = {c.get("id") for c in calls if isinstance(c, dict) and c.get("id")}
        if m.tool_call_id and ids and m.tool_call_id not in ids:
            return f"messages[{i}].tool_call_id: {m.tool_call_id!r} answers no preceding tool call"
    return None


_prompt_decoder = msgspec.json.Decoder(Prompt)

BOM = b"\xef\xbb\xbf"  # the UTF-8 byte-order mark many Windows tools write first
MAX_JSON_DEPTH = 100  # nesting levels a record may have; deeper is a reject, not a crash
MAX_LINE_BYTES = 64 << 20  # a longer prompt line is a reject, read in bounded memory
_DEEP = f"nesting deeper than {MAX_JSON_DEPTH} levels"


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON ``value`` nests deeper than ``limit`` (walked without recursion,
    so the check itself cannot overflow the stack)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif isinstance(v, msgspec.Struct):
            v = [getattr(v, f) for f in v.__struct_fields__]
        elif not isinstance(v, list | tuple):
            continue
        if depth >= limit:
            return True
        stack.extend((x, depth + 1) for x in v)
    return False


def may_be_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """A cheap pre-check: only a line with more than ``limit`` brackets can nest that deep."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{") > limit
    return raw.count(b"[") + raw.count(b"{") > limit


def decode_json_line(raw: bytes | str) -> Any:
    """One JSON value of a user's JSONL line, any leading BOM skipped; ValueError (with what is
    wrong) for invalid JSON, invalid UTF-8 or nesting deeper than MAX_JSON_DEPTH."""
    raw = raw[1:] if isinstance(raw, str) and raw.startswith("\ufeff") else raw
    raw = raw[3:] if isinstance(raw, bytes) and raw.startswith(BOM) else raw
    try:
        value = _any_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise ValueError(_DEEP) from exc
    if may_be_deep(raw) and too_deep(value):
        raise ValueError(_DEEP)
    return value


_STRUCTURE = re.compile(rb'["\[\]{},]')  # what moves the splitter outside strings
_IN_STRING = re.compile(rb'["\\]')  # what moves it inside one
_BACKSLASH, _QUOTE, _COMMA = b"\\"[0], b'"'[0], b","[0]


class JsonArraySplitter:
    """Cuts a top-level JSON array, fed in chunks, into the raw bytes of its elements.

    Only strings and bracket depth are tracked, nothing is decoded, so an element that is bad
    JSON, bad UTF-8, a lone surrogate escape or nested beyond any decoder's depth is still one
    element: the caller decodes each with ``decode_json_line`` and rejects the bad one alone,
    instead of losing the rest of the array. ``feed`` returns the elements a chunk completed;
    ``close`` the cut last one of a truncated array. An element longer than ``max_element``
    bytes comes out as None (its bytes are dropped as they are scanned, so memory stays
    bounded). Two commas in a row make an empty element (bad JSON); a trailing comma does not.
    """

    def __init__(self, max_element: int = MAX_LINE_BYTES) -> None:
        self.max_element = max_element
        self._buf = b""
        self._start = 0  # where the current element begins in _buf
        self._pos = 0  # where scanning resumes in _buf
        self._depth = 0
        self._in_string = False
        self._oversize = False
        self._opened = False
        self.closed = False  # the array's closing bracket was seen
        self.rest = b""  # what followed the closing bracket in its chunk

    def feed(self, chunk: bytes) -> list[bytes | None]:
        """The elements ``chunk`` completes; ValueError when the data does not open an array."""
        if self.closed:
            return []
        self._buf = self._buf[self._start :] + chunk
        self._pos -= self._start
        self._start = 0
        if not self._opened:
            body = self._buf.lstrip()
            if not body:
                self._buf, self._pos = b"", 0
                return []
            if body[0] != b"["[0]:
                raise ValueError("not a JSON array")
            self._opened = True
            self._buf = body[1:]
        out: list[bytes | None] = []
        while True:
            m = (_IN_STRING if self._in_string else _STRUCTURE).search(self._buf, self._pos)
            if m is None:
                self._pos = max(self._pos, len(self._buf))  # past an escape cut at the end
                if len(self._buf) - self._start > self.max_element:
                    self._oversize = True
                    drop = min(self._pos, len(self._buf))
                    self._buf, self._pos, self._start = self._buf[drop:], self._pos - drop, 0
                return out
            c, self._pos = self._buf[m.start()], m.end()
            if self._in_string:
                if c == _BACKSLASH:
                    self._pos += 1  # the escaped character, a quote included
                else:
                    self._in_string = False
            elif c == _QUOTE:
                self._in_string = True
            elif c in b"[{":
                self._depth += 1
            elif c in b"]}" and self._depth > 0:
                self._depth -= 1
            elif c in b"]}" or (c == _COMMA and self._depth == 0):
                raw = self._buf[self._start : m.start()].strip()
                if self._oversize:
                    out.append(None)
                elif raw or c == _COMMA:
                    out.append(raw)
                self._oversize = False
                self._start = self._pos
                if c != _COMMA:
                    self.closed = True
                    self.rest = self._buf[self._pos :]
                    self._buf = b""
                    return out

    @property
    def pending(self) -> bytes:
        """The bytes fed but not yet part of a whole element: the start of the next element
        (or of the closing bracket), at the array's top level."""
        return self._buf[self._start :]

    def close(self) -> list[bytes | None]:
        """The cut last element of an array the data ended inside (none when it was closed)."""
        if self.closed or not self._opened:
            return []
        self.closed = True
        raw = self._buf[self._start :].strip()
        return [None] if self._oversize else [raw] if raw else []


_Text = TypeVar("_Text", bytes, str)


def strip_bom(raw: _Text) -> _Text:
    """``raw`` without a leading UTF-8 byte-order mark."""
    if isinstance(raw, str):
        return raw[1:] if raw.startswith("\ufeff") else raw
    return raw[3:] if raw.startswith(BOM) else raw


_any_decoder = msgspec.json.Decoder()


def _msgspec_field(err: msgspec.ValidationError) -> str:
    # msgspec says e.g. "Expected `str`, got `int` - at `$.messages[0].content`"
    text = str(err)
    if " - at `$." in text:
        what, _, path = text.partition(" - at `$.")
        return f"{path.rstrip('`')}: {what}"
    return text


def parse_prompt(raw: bytes | str, where: str = "<input>") -> Prompt:
    """Decode and validate one prompt JSON object; errors read ``where: field: what is wrong``.

    Any line raises InputError or returns: invalid JSON or UTF-8, a wrong shape, nesting deeper
    than MAX_JSON_DEPTH (a leading byte-order mark is skipped)."""
    raw = raw[1:] if isinstance(raw, str) and raw.startswith("\ufeff") else raw
    raw = raw[3:] if isinstance(raw, bytes) and raw.startswith(BOM) else raw
    if len(raw) > MAX_LINE_BYTES:
        raise InputError(f"{where}: line longer than {MAX_LINE_BYTES >> 20} MiB")
    try:
        prompt = _prompt_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InputError(f"{where}: {_msgspec_field(exc)}") from exc
    except msgspec.DecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise InputError(f"{where}: {_DEEP}") from exc
    if may_be_deep(raw) and too_deep(prompt):
        raise InputError(f"{where}: {_DEEP}")
    if not prompt.id:
        raise InputError(f"{where}: id: empty id")
    try:
        validate_messages(prompt.messages)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from exc
    return prompt


def encode_prompt(prompt: Prompt) -> bytes:
    """One JSONL line (without the newline) for a Prompt."""
    return msgspec.json.encode(prompt)


class _IdOnly(msgspec.Struct):
    id: str = ""


_id_decoder = msgspec.json.Decoder(_IdOnly)


def prompt_id(line: bytes) -> str:
    """The ``id`` of one prompts-JSONL line, decoding nothing else ("" when the line is not a
    JSON object or has no string id; the full parse reports why)."""
    try:
        return _id_decoder.decode(strip_bom(line)).id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ""
