"""The real dispatcher over random prompt shapes: what it sends is what tokenize and export see.

A scripted in-process server answers request k of a conversation with a drawn turn (text, a
tool call, a cut answer). For every prompt shape, the message lists the dispatcher actually sent
must equal ``conversation.expand``'s per-turn contexts of the committed completion (what
tokenize renders and the trainer exports use), it must send no request past the turn that broke
the conversation, and the completion must say why it stopped.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.generate.fakes import FakeClient, endpoint, run_dispatch
from tests.unit.test_conversation import prompts, turns_for

from draftdata.generate.config import GenerateConfig
from draftdata.generate.engine.client import request_body
from draftdata.generate.engine.request import Request
from draftdata.records import Message, Turn, tool_order_fault
from draftdata.shared.conversation import TurnPlan, expand


class ScriptedClient(FakeClient):
    """Answers request k of the conversation (k = target turns already in the history) with
    ``script[k]``."""

    def __init__(self, script: list[Turn]) -> None:
        super().__init__()
        self.script = script

    async def chat(self, request: Request) -> list[Turn]:
        self.bodies.append(request_body(request))
        k = sum(m.role == "assistant" for m in request.messages)
        return [self.script[k]]


def valid_prompt(msgs: list[Message]) -> list[Message]:
    """``msgs`` as generate accepts them (``records.tool_order_fault``): a tool message without
    an assistant tool call before it is dropped, and one answers the first id of that call."""
    out: list[Message] = []
    calls: list[Any] | None = None
    for m in msgs:
        if m.role != "tool":
            calls = m.tool_calls if m.role == "assistant" else None
            out.append(m)
        elif calls:
            out.append(msgspec.structs.replace(m, tool_call_id=calls[0]["id"]))
    return out


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=prompts(), keep=st.booleans())
def test_what_generate_sends_is_what_tokenize_and_export_see(
    data: st.DataObject, shape: list[Message], keep: bool
) -> None:
    msgs = valid_prompt(shape)
    assert tool_order_fault(msgs) is None
    turn_plan = TurnPlan(msgs)
    script = data.draw(turns_for(len(turn_plan)))
    client = ScriptedClient(script)
    config = GenerateConfig(
        prompts="x", endpoints=["x"], out="x", hedge=False, keep_reasoning_history=keep
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        row = {"id": "p", "messages": msgspec.to_builtins(msgs)}
        path.write_text(json.dumps(row) + "\n", encoding="utf-8")
        _, sink = asyncio.run(run_dispatch(config, [endpoint(0, client)], path))
    (c,) = sink.completions
    sent = [msgspec.convert(b["messages"], list[Message]) for b in client.bodies]
    assert sent == [tc.context for tc in expand(c, keep_reasoning=keep)]
    n = turn_plan.usable_turns(script)
    assert len(client.bodies) == len(c.turns) == n
    assert c.stop_reason == (turn_plan.stop_reason(n - 1, script[n - 1]) if n else None)
