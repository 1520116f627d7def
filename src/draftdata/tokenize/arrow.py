"""Arrow tables in and out of the tokenize stage: completion rows -> views, samples -> a table.

``views_from_table`` decodes a completions table into ``plan.CompletionView``s without turning
token ids into Python ints (they stay numpy views of the Arrow buffers); ``samples_table``
builds the output table (``formats.SAMPLE_SCHEMA``) from numpy arrays in one concatenation.
No I/O here.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from draftdata.shared.formats import SAMPLE_SCHEMA
from draftdata.tokenize.plan import CompletionView, IdArray
from draftdata.tokenize.template import TurnText

_dec = msgspec.json.Decoder()


def _json_or_none(value: str | None) -> Any:
    return None if value is None else _dec.decode(value)


def _np_lists(arr: pa.ListArray) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], Any]:
    # (flat values, offsets, validity) of a list<int32> array, without Python ints.
    arr = arr.cast(pa.list_(pa.int32())) if arr.type != pa.list_(pa.int32()) else arr
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    return values, offsets, valid


def _prompt_tokens(turns: pa.StructArray) -> list[int | None]:
    # each turn's usage.prompt_tokens (None where the row has none), parents' nulls honoured
    if turns.type.get_field_index("usage") < 0:
        return []
    usage = turns.field("usage")
    if usage.type.get_field_index("prompt_tokens") < 0:
        return []
    index = usage.type.get_field_index("prompt_tokens")
    return list(usage.flatten()[index].to_pylist())


def views_from_table(table: pa.Table) -> list[CompletionView]:
    """CompletionViews of the rows of a completions table (token ids stay numpy views)."""
    n = table.num_rows
    if n == 0:
        return []
    cols = {name: table.column(name) for name in table.column_names}
    ids = cols["id"].to_pylist()
    samples = cols["sample"].to_pylist() if "sample" in cols else [0] * n
    sources = cols["source"].to_pylist() if "source" in cols else [""] * n
    domains = cols["domain"].to_pylist() if "domain" in cols else [""] * n
    messages = cols["messages"].to_pylist()
    tools = cols["tools"].to_pylist() if "tools" in cols else [None] * n
    sampling = cols["sampling"].to_pylist() if "sampling" in cols else [None] * n
    # completion/1 shards have no rule column: their turns follow conversation rule 1
    rules = cols["conversation_rule"].to_pylist() if "conversation_rule" in cols else [1] * n
    # before completion/3 the mode of an answer was not recorded
    modes = cols["server_thinking"].to_pylist() if "server_thinking" in cols else [None] * n
    turns_col = cols["turns"].combine_chunks()
    turn_offsets = turns_col.offsets.to_numpy()
    structs = turns_col.values
    text = {
        name: structs.field(name).to_pylist()
        for name in ("content", "reasoning", "tool_calls", "finish_reason")
    }
    counted = _prompt_tokens(structs)
    p_vals, p_off, p_ok = _np_lists(structs.field("prompt_token_ids"))
    o_vals, o_off, o_ok = _np_lists(structs.field("output_token_ids"))
    out: list[CompletionView] = []
    for i in range(n):
        lo, hi = int(turn_offsets[i]), int(turn_offsets[i + 1])
        turns = [
            TurnText(
                text["content"][j],
                text["reasoning"][j],
                _json_or_none(text["tool_calls"][j]),
                text["finish_reason"][j],
            )
            for j in range(lo, hi)
        ]
        token_ids: list[tuple[IdArray, IdArray]] | None = None
        if hi > lo and all(p_ok[j] and o_ok[j] for j in range(lo, hi)):
            token_ids = [
                (p_vals[p_off[j] : p_off[j + 1]], o_vals[o_off[j] : o_off[j + 1]])
                for j in range(lo, hi)
            ]
        msgs = [
            {
                "role": m["role"],
                "content": m.get("content"),
                "reasoning_content": m.get("reasoning_content"),
                "tool_calls": _json_or_none(m.get("tool_calls")),
                "tool_call_id": m.get("tool_call_id"),
                "name": m.get("name"),
            }
            for m in messages[i] or []
        ]
        params = _json_or_none(sampling[i]) or {}
        kwargs = params.get("chat_template_kwargs") if isinstance(params, dict) else None
        out.append(
            CompletionView(
                id=ids[i],
                sample=samples[i] or 0,
                source=sources[i] or "",
                domain=domains[i] or "",
                messages=msgs,
                tools=_json_or_none(tools[i]),
                turns=turns,
                template_kwargs=dict(kwargs) if isinstance(kwargs, dict) else {},
                rule=rules[i] or 1,
                token_ids=token_ids,
                served=True,
                server_thinking=modes[i],
                prompt_tokens=[int(counted[j] or 0) for j in range(lo, hi)] if counted else [],
            )
        )
    return out


def _list_array(arrays: list[Any], dtype: Any, np_dtype: Any) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = (
        np.concatenate(arrays).astype(np_dtype, copy=False) if arrays else np.array([], np_dtype)
    )
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, dtype))


def samples_table(
    rows: list[tuple[str, str, str, bool]],
    ids: list[IdArray],
    masks: list[npt.NDArray[np.int8]],
) -> pa.Table:
    """The samples table (``formats.SAMPLE_SCHEMA``) from per-sample rows, ids and masks."""
    num_tokens = [len(a) for a in ids]
    num_loss = [int(m.sum()) for m in masks]
    arrays = [
        pa.array([r[0] for r in rows], pa.string()),
        pa.array([r[1] for r in rows], pa.string()),
        pa.array([r[2] for r in rows], pa.string()),
        _list_array(ids, pa.int32(), np.int32),
        _list_array(masks, pa.int8(), np.int8),
        pa.array(num_tokens, pa.int32()),
        pa.array(num_loss, pa.int32()),
        pa.array([r[3] for r in rows], pa.bool_()),
    ]
    return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)
