"""The one conversation rule: a prompt plus generated turns -> a conversation.

generate, export, stats, merge and tokenize all go through this module, so the requests generate
sends, the conversations export writes and the contexts tokenize trains on cannot disagree.

**Requests.** ``TurnPlan(messages)`` cuts a prompt's messages into the requests generate sends,
one generated turn each:

- the prompt's own assistant messages are never sent: each is replaced by the target's answer
  to the messages before it, or dropped when nothing stands before it to answer (a leading
  assistant, the second of two consecutive assistants);
- every user message and every group of tool results gets its own answer, in order, even with
  no original assistant message after it: ``[u1, u2]`` is two requests (``[u1]``, then the
  target's answer and ``[u2]``); consecutive tool results (parallel calls) are one group;
- system messages travel with the request they stand in (a system between an answered message
  and the next one goes with the next); system messages after the last answered message are
  the plan's ``tail``, kept in the assembled conversation after the last turn.

So ``[system, assistant, user]`` is one request ``[system, user]``, answered after ``user``;
``[user, assistant, assistant, user]`` is ``[user]``, answer, ``[user]``, answer; an agent
trajectory ``[user, assistant(call f), tool, assistant]`` is ``[user]``, the target's turn,
``[tool]``, the target's turn.

**History.** Request k is sent as: request 0's messages, the target's turn 0, request 1's
messages, ..., request k's messages (``TurnPlan.context``). A turn goes back into the history as
an assistant message with ``content`` "" when it had none (templates do string tests on it),
its tool calls, and its reasoning only with ``keep_reasoning``. Tool results that answer the
target's previous turn carry the id of the target's matching call (``tool_call_id``), not the
id of the original call, so the history the target sees is consistent.

**Stop rule.** A conversation stops at the first turn that breaks it (``TurnPlan.stop_reason``):
the turn was cut by the token limit (``length``), the next request opens with tool results but
the target called no tool (``no_tool_call``) or other tools than the ones the results answer
(``tool_mismatch``), or the target called a tool and the next request has no result for it
(``unanswered_tool_call``). One more stop is not about the turn but about the next request: its
history (the prompt and the turns so far) leaves no room in the endpoint's context, or the
server refuses it as too long (``context``); generate decides that one, since only it knows the
context. The turns generated so far are kept; the Completion records the reason.

**Rules.** Completions written before this module (format ``completion/1``) were generated under
rule 1 (``RULE_LEGACY``): requests split only at the prompt's assistant messages, the original
tool results sent as they were, no stops. ``TurnPlan(messages, rule=1)`` rebuilds exactly that, so
old runs tokenize and export as they were generated.

**The type.** ``Conversation`` is the one chat-shaped row every stage passes around: prepare's
adapters build one from each source row, stats and merge from each dataset row (and from a
Completion, through ``assemble``), tokenize tokenizes them.

The module is pure (no I/O); it depends on nothing of the project but ``records``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from draftdata.records import Completion, JsonDict, Message, Turn

RULE_LEGACY = 1  # completion/1 shards: split at the prompt's assistant messages only
RULE = 2  # the current rule (module docstring)
RULES = (RULE_LEGACY, RULE)

# Why a conversation stopped before its last request (``Completion.stop_reason``).
STOP_LENGTH = "length"
STOP_NO_TOOL_CALL = "no_tool_call"
STOP_TOOL_MISMATCH = "tool_mismatch"
STOP_UNANSWERED_CALL = "unanswered_tool_call"
STOP_CONTEXT = "context"  # the next request does not fit the context (generate decides)
STOP_REASONS = (
    STOP_LENGTH,
    STOP_NO_TOOL_CALL,
    STOP_TOOL_MISMATCH,
    STOP_UNANSWERED_CALL,
    STOP_CONTEXT,
)

_ANSWERED = ("user", "tool")


class TurnLike(Protocol):
    """A generated turn: ``records.Turn`` and tokenize's ``TurnText`` both fit."""

    @property
    def content(self) -> str | None: ...

    @property
    def reasoning(self) -> str | None: ...

    @property
    def tool_calls(self) -> list[JsonDict] | None: ...

    @property
    def finish_reason(self) -> str | None: ...


T = TypeVar("T", bound=TurnLike)


@dataclass(frozen=True, slots=True)
class Request:
    """One request generate sends: the prompt messages it adds to the history, by index.

    ``results`` are the indices (among ``new``) of the tool messages that answer the previous
    turn's calls; ``calls`` the function name each of them answers, taken from the original
    call (None when the prompt does not say). ``replaces`` is the index of the prompt's
    assistant message the answer takes the place of (None where the prompt had none).
    """

    new: tuple[int, ...]
    results: tuple[int, ...] = ()
    calls: tuple[str | None, ...] = ()
    replaces: int | None = None


@dataclass(frozen=True, slots=True)
class TurnContext(Generic[T]):
    """One generated turn with the context exactly as the target saw it when generating it.

    ``context`` is the message list of request ``index``; ``message`` is the turn as an assistant
    message with its reasoning (what the target wrote); ``turn`` the turn itself.
    """

    index: int
    context: list[Message]
    message: Message
    turn: T


class Conversation(msgspec.Struct, kw_only=True, frozen=True):
    """One chat-shaped row of any dataset or source: its messages (OpenAI form), tools, and
    where it comes from. ``id`` is "" while the row has none (prepare derives one from the
    content); ``domain`` is "" when the row carries no label; ``meta`` holds a source's own
    fields kept for tracing (prepare's adapters fill it)."""

    id: str = ""
    messages: list[Message]
    source: str = ""
    domain: str = ""
    tools: list[JsonDict] | None = None
    meta: JsonDict = msgspec.field(default_factory=dict)

    @property
    def has_reasoning(self) -> bool:
        """Whether an assistant turn carries reasoning (a field or an inline <think> block)."""
        for m in self.messages:
            if m.role != "assistant":
                continue
            if m.reasoning_content or "<think>" in (m.content or ""):
                return True
        return False

    def char_counts(self) -> tuple[int, int]:
        """(characters of all contents and reasoning, characters of assistant output)."""
        total = out = 0
        for m in self.messages:
            n = len(m.content or "") + len(m.reasoning_content or "")
            total += n
            if m.role == "assistant":
                out += n
        return total, out


def turn_message(turn: TurnLike, *, keep_reasoning: bool = True) -> Message:
    """The target's turn as an assistant message (``content`` "" when it had none)."""
    return Message(
        role="assistant",
        content=turn.content if turn.content is not None else "",
        reasoning_content=turn.reasoning if keep_reasoning else None,
        tool_calls=turn.tool_calls,
    )


def _call_name(call: Any) -> str | None:
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def _call_id(call: Any) -> str | None:
    value = call.get("id") if isinstance(call, dict) else None
    return value if isinstance(value, str) and value else None


def match_calls(
    calls: Sequence[str | None], target_calls: list[JsonDict] | None
) -> list[int] | None:
    """For each expected call name (None: any), the index of a distinct target call with that
    name, in order; None when the target's calls are not exactly the expected ones."""
    target = list(target_calls or [])
    if len(target) != len(calls):
        return None
    free = list(range(len(target)))
    out: list[int] = []
    # Named results first take their own call; unnamed ones take what is left, in order.
    picked: dict[int, int] = {}
    for r, name in enumerate(calls):
        if name is None:
            continue
        hit = next((j for j in free if _call_name(target[j]) == name), None)
        if hit is None:
            return None
        free.remove(hit)
        picked[r] = hit
    for r, name in enumerate(calls):
        out.append(picked[r] if name is not None else free.pop(0))
    return out


class TurnPlan:
    """A prompt's messages cut into the requests generate sends (the module docstring's rule).

    ``requests`` holds one ``Request`` per turn to generate, ``tail`` the indices of trailing
    messages nothing answers. Build it once per prompt; every method is pure.
    """

    __slots__ = ("messages", "requests", "rule", "tail")

    def __init__(self, messages: Sequence[Message], *, rule: int = RULE) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown conversation rule {rule}; this draftdata knows {RULES}")
        self.messages = list(messages)
        self.rule = rule
        self.requests, self.tail = (
            _cut(self.messages) if rule == RULE else _cut_legacy(self.messages)
        )

    def __len__(self) -> int:
        return len(self.requests)

    def context(
        self, k: int, turns: Sequence[TurnLike], *, keep_reasoning: bool = False
    ) -> list[Message]:
        """The messages of request ``k``, given the target's turns 0..k-1 (``turns`` may hold
        more; they are ignored): each earlier request's messages followed by the target's turn."""
        if not 0 <= k < len(self.requests):
            raise IndexError(f"request {k} of {len(self.requests)}")
        if len(turns) < k:
            raise ValueError(f"request {k} needs the {k} turn(s) before it, got {len(turns)}")
        out: list[Message] = []
        for j in range(k + 1):
            out.extend(self._request_messages(j, turns[j - 1] if j else None))
            if j < k:
                out.append(turn_message(turns[j], keep_reasoning=keep_reasoning))
        return out

    def stop_reason(self, k: int, turn: TurnLike) -> str | None:
        """Why the conversation cannot go on after the target's turn ``k`` (None: it can, or
        ``k`` is the last request). Rule 1 never stops."""
        if self.rule == RULE_LEGACY or k + 1 >= len(self.requests):
            return None
        if turn.finish_reason == "length":
            return STOP_LENGTH
        nxt = self.requests[k + 1]
        if nxt.results:
            if not turn.tool_calls:
                return STOP_NO_TOOL_CALL
            if match_calls(nxt.calls, turn.tool_calls) is None:
                return STOP_TOOL_MISMATCH
        elif turn.tool_calls:
            return STOP_UNANSWERED_CALL
        return None

    def usable_turns(self, turns: Sequence[T]) -> int:
        """How many of ``turns`` form the conversation: up to the first that breaks it
        (included) and at most one per request."""
        n = min(len(turns), len(self.requests))
        for k in range(n):
            if self.stop_reason(k, turns[k]) is not None:
                return k + 1
        return n

    def assemble(self, turns: Sequence[TurnLike]) -> list[Message]:
        """The whole conversation: each request's messages followed by the target's turn (with
        its reasoning), up to the last usable turn; the ``tail`` only when every request got
        its turn."""
        n = self.usable_turns(turns)
        out: list[Message] = []
        for j in range(n):
            out.extend(self._request_messages(j, turns[j - 1] if j else None))
            out.append(turn_message(turns[j], keep_reasoning=True))
        if n == len(self.requests):
            out.extend(self.messages[i] for i in self.tail)
        return out

    def expand(self, turns: Sequence[T], *, keep_reasoning: bool = False) -> list[TurnContext[T]]:
        """For each usable turn: the context as the target saw it when generating it (earlier
        turns in the history form, reasoning only with ``keep_reasoning``), and the turn."""
        n = self.usable_turns(turns)
        out: list[TurnContext[T]] = []
        history: list[Message] = []
        for j in range(n):
            history = [*history, *self._request_messages(j, turns[j - 1] if j else None)]
            out.append(
                TurnContext(
                    index=j,
                    context=history,
                    message=turn_message(turns[j], keep_reasoning=True),
                    turn=turns[j],
                )
            )
            history = [*history, turn_message(turns[j], keep_reasoning=keep_reasoning)]
        return out

    def _request_messages(self, j: int, previous: TurnLike | None) -> list[Message]:
        req = self.requests[j]
        msgs = [self.messages[i] for i in req.new]
        if self.rule == RULE_LEGACY or previous is None or not req.results:
            return msgs
        picks = match_calls(req.calls, previous.tool_calls)
        if picks is None:
            return msgs
        calls = previous.tool_calls or []
        relink = {i: _call_id(calls[p]) for i, p in zip(req.results, picks, strict=True)}
        out = []
        for i, m in zip(req.new, msgs, strict=True):
            new_id = relink.get(i)
            if new_id is not None and new_id != m.tool_call_id:
                m = Message(
                    role=m.role,
                    content=m.content,
                    reasoning_content=m.reasoning_content,
                    tool_calls=m.tool_calls,
                    tool_call_id=new_id,
                    name=m.name,
                )
            out.append(m)
        return out


@dataclass(slots=True)
class _Cutter:
    messages: list[Message]
    requests: list[Request] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # indices not yet in a request
    calls: list[JsonDict] = field(default_factory=list)  # original calls since the last answered

    def close(self, upto: int, replaces: int | None = None) -> None:
        # A request of the pending messages up to and including index ``upto``.
        new = tuple(i for i in self.pending if i <= upto)
        self.pending = [i for i in self.pending if i > upto]
        results = []
        for i in new:
            role = self.messages[i].role
            if role == "user":
                break
            if role == "tool":
                results.append(i)
        self.requests.append(
            Request(
                new=new,
                results=tuple(results),
                calls=self._names(results),
                replaces=replaces,
            )
        )

    def _names(self, results: list[int]) -> tuple[str | None, ...]:
        by_id = {cid: _call_name(c) for c in self.calls if (cid := _call_id(c)) is not None}
        positional = len(self.calls) == len(results)
        names: list[str | None] = []
        for r, i in enumerate(results):
            m = self.messages[i]
            name = by_id.get(m.tool_call_id) if m.tool_call_id else None
            if name is None and positional:
                name = _call_name(self.calls[r])
            if name is None:
                name = m.name
            names.append(name)
        return tuple(names)

    def last_answered(self) -> int | None:
        for i in reversed(self.pending):
            if self.messages[i].role in _ANSWERED:
                return i
        return None


def _cut(messages: list[Message]) -> tuple[list[Request], tuple[int, ...]]:
    n = len(messages)
    if (
        n
        and messages[-1].role == "user"
        and all(messages[i].role == "system" for i in range(n - 1))
    ):
        # system messages then one user message (most prompts): one request of them all, as
        # ``_cut_general`` cuts it, without its bookkeeping
        return [Request(new=tuple(range(n)), results=(), calls=(), replaces=None)], ()
    return _cut_general(messages)


def _cut_general(messages: list[Message]) -> tuple[list[Request], tuple[int, ...]]:
    cut = _Cutter(messages)
    for i, m in enumerate(messages):
        last = cut.last_answered()
        if m.role == "assistant":
            if last is not None:
                cut.close(upto=max(cut.pending), replaces=i)
                cut.calls = []
            cut.calls.extend(c for c in m.tool_calls or [] if isinstance(c, dict))
            continue
        if last is not None and (
            m.role == "user" or (m.role == "tool" and messages[last].role == "user")
        ):
            # An unanswered message before this one: the target answers it first, right after it.
            cut.close(upto=last)
            cut.calls = []
        cut.pending.append(i)
    last = cut.last_answered()
    if last is not None:
        cut.close(upto=max(cut.pending))
    return cut.requests, tuple(cut.pending)


def _cut_legacy(messages: list[Message]) -> tuple[list[Request], tuple[int, ...]]:
    # Rule 1, as generate sent it before this module: a request ends at each assistant message
    # (or the end) that has a user or tool message pending; trailing messages were never sent.
    requests: list[Request] = []
    pending: list[int] = []
    for i, m in enumerate(messages):
        if m.role == "assistant":
            if any(messages[p].role in _ANSWERED for p in pending):
                requests.append(Request(new=tuple(pending), replaces=i))
                pending = []
            continue
        pending.append(i)
    if any(messages[p].role in _ANSWERED for p in pending):
        requests.append(Request(new=tuple(pending)))
        pending = []
    return requests, ()


# -- completions ---------------------------------------------------------------------------------


def plan_of(c: Completion) -> TurnPlan:
    """The TurnPlan a completion was generated under (its prompt messages and rule)."""
    return TurnPlan(c.messages, rule=c.conversation_rule)


def expand(c: Completion, *, keep_reasoning: bool = False) -> list[TurnContext[Turn]]:
    """Per generated turn of a completion: the context the target saw and the turn
    (``TurnPlan.expand``; ``keep_reasoning`` is the run's ``keep_reasoning_history``)."""
    return plan_of(c).expand(c.turns, keep_reasoning=keep_reasoning)


def assemble(c: Completion) -> list[Message]:
    """The conversation of a completion: its prompt with the target's own turns in place
    (``TurnPlan.assemble``); what export, stats and merge use."""
    return plan_of(c).assemble(c.turns)


def message_dict(m: Message) -> JsonDict:
    """A message as a plain dict with every field (None where unset), the form chat templates
    render (they drop the None keys)."""
    return {
        "role": m.role,
        "content": m.content,
        "reasoning_content": m.reasoning_content,
        "tool_calls": m.tool_calls,
        "tool_call_id": m.tool_call_id,
        "name": m.name,
    }


def message_from_dict(d: JsonDict) -> Message:
    """The inverse of ``message_dict`` (missing keys are None)."""
    return Message(
        role=d["role"],
        content=d.get("content"),
        reasoning_content=d.get("reasoning_content"),
        tool_calls=d.get("tool_calls"),
        tool_call_id=d.get("tool_call_id"),
        name=d.get("name"),
    )
