"""The trainers' JSONL that ``merge --format`` writes beside the parquet shards.

One JSONL shard per parquet shard, ``<format>/{train,eval}set-NNNNN.jsonl``, rows in the same
order, in the format ``export`` writes (``draftdata.shared.trainer_rows``):

- chat inputs: ``sharegpt`` (whole conversations), ``specforge`` (one row per assistant turn,
  the history before it with earlier turns' reasoning removed, as the target's server saw it
  when its template drops that reasoning; train with ``train_only_last_turn``), ``openai``,
  ``modelopt`` (whole conversations: ``export --format modelopt`` writes the per-turn rows
  and the generation-tagged template ModelOpt's ``answer_only_loss`` needs), ``eagle`` (a row
  EAGLE's scripts cannot read is left out, ``left_out`` says why, and counted);
- tokenized inputs: ``speculators`` (``{"id", "primary_id", "input_ids", "loss_mask"}``, which
  speculators' preprocessing passes through).

Merged rows carry no record of which turns a target generated, so ``specforge`` treats every
assistant message as one: the per-turn expansion is ``conversation.TurnPlan``'s with the rule
that cuts requests at the conversation's own assistant messages (``RULE_LEGACY``); a leading
assistant message answers nothing and is left out (SpecForge's parser drops it too). This module
turns parquet rows into lines; ``stage.py`` stores them.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from draftdata.records import Message, Turn
from draftdata.shared.conversation import RULE_LEGACY, TurnPlan, message_dict
from draftdata.shared.trainer_rows import (
    conversation_row,
    eagle_problem,
    per_turn_id,
    specforge_row,
)
from draftdata.stats.conversations import specforge_line

CHAT_FORMATS = ("sharegpt", "specforge", "openai", "modelopt", "eagle")
SAMPLE_FORMATS = ("speculators",)

_json = msgspec.json.Encoder()


def jsonl_key(fmt: str, split: str, index: int) -> str:
    """The key of a JSONL shard. ``trainset``/``evalset``, not ``train``/``eval``: Hugging Face
    ``datasets`` takes any file named ``train-*`` or under ``.../train/`` for the train split,
    and JSONL there would break ``load_dataset("parquet", data_dir=out)``."""
    return f"{fmt}/{split}set-{index:05d}.jsonl"


def _messages(row: dict[str, Any]) -> list[Message]:
    out = []
    for m in row["conversations"]:
        calls = m.get("tool_calls")
        out.append(
            Message(
                role=m["role"],
                content=m.get("content"),
                reasoning_content=m.get("reasoning_content"),
                tool_calls=json.loads(calls) if isinstance(calls, str) else calls,
                tool_call_id=m.get("tool_call_id"),
                name=m.get("name"),
            )
        )
    return out


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def _specforge_lines(row: dict[str, Any]) -> list[bytes]:
    msgs = _messages(row)
    plan = TurnPlan(msgs, rule=RULE_LEGACY)
    # the assistant message each request was answered by (a leading one answers nothing)
    turns = []
    for req in plan.requests:
        if req.replaces is None:
            break
        m = msgs[req.replaces]
        turns.append(
            Turn(content=m.content, reasoning=m.reasoning_content, tool_calls=m.tool_calls)
        )
    out = []
    for tc in plan.expand(turns, keep_reasoning=False):
        line = specforge_row(
            per_turn_id(row["id"], tc.index, len(turns)),
            [message_dict(m) for m in tc.context],
            message_dict(tc.message),
            source=row.get("source") or "",
            domain=row.get("domain") or "",
            tools=_tools(row),
        )
        out.append(_json.encode(line))
    return out


def left_out(fmt: str, row: dict[str, Any]) -> str | None:
    """Why ``row`` has no line in ``fmt`` (None: it has): ``eagle`` rows with a system
    message, tools, tool results or turns that do not alternate (``eagle_problem``)."""
    if fmt == "eagle":
        return eagle_problem(_messages(row), _tools(row))
    return None


def lines(fmt: str, row: dict[str, Any]) -> list[bytes]:
    """The JSONL lines (without newlines) of one parquet row in ``fmt``."""
    if fmt == "sharegpt":
        return [specforge_line(row)]
    if fmt == "specforge":
        return _specforge_lines(row)
    if fmt == "speculators":
        return [
            _json.encode(
                {
                    "id": row["id"],
                    "primary_id": row["id"],
                    "input_ids": row["input_ids"],
                    "loss_mask": row["loss_mask"],
                    "source": row.get("source") or "",
                    "domain": row.get("domain") or "",
                }
            )
        ]
    record = conversation_row(
        fmt,
        row["id"],
        _messages(row),
        source=row.get("source") or "",
        domain=row.get("domain") or "",
        tools=_tools(row),
    )
    return [_json.encode(record)]
