"""The column-wise completions table equals the row-wise one, and shards read back unchanged.

``formats.completions_table`` builds its Arrow columns directly (no per-row dicts) for speed;
the reference is ``pa.Table.from_pylist`` of ``completion_row`` rows, which is what it replaced.
Random completions (any number of messages and turns, None in every optional field, empty and
None token-id lists, tool calls, unicode) must give equal tables, and a shard written with the
chosen dictionary columns must read back to the same completions.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.records import Completion, Message, Turn, Usage
from draftdata.shared.formats import (
    COMPLETION_FORMAT,
    COMPLETION_SCHEMA,
    DICTIONARY_COLUMNS,
    completion_row,
    completions_table,
    dictionary_columns,
    iter_completions,
)
from draftdata.store.write import parquet_bytes

_text = st.text(max_size=12)
_opt_text = st.none() | _text
_ids = st.none() | st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6)
_count = st.integers(0, 2**40)
_usage = st.builds(Usage, prompt_tokens=_count, completion_tokens=_count, cached_tokens=_count)
_calls = st.none() | st.lists(
    st.fixed_dictionaries({"id": _text, "function": st.fixed_dictionaries({"name": _text})}),
    max_size=2,
)
_message = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=_opt_text,
    reasoning_content=_opt_text,
    tool_calls=_calls,
    tool_call_id=_opt_text,
    name=_opt_text,
)
_turn = st.builds(
    Turn,
    content=_opt_text,
    reasoning=_opt_text,
    tool_calls=_calls,
    finish_reason=st.none() | st.sampled_from(["stop", "length", "tool_calls"]),
    prompt_token_ids=_ids,
    output_token_ids=_ids,
    usage=_usage,
)
_completion = st.builds(
    Completion,
    id=_text,
    sample=st.integers(0, 2**31 - 1),
    source=_text,
    domain=_text,
    messages=st.lists(_message, max_size=3),
    tools=st.none() | st.lists(st.fixed_dictionaries({"type": _text}), max_size=2),
    turns=st.lists(_turn, max_size=3),
    usage=_usage,
    model=_text,
    sampling=st.dictionaries(
        _text, st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 9), max_size=3
    ),
    endpoint=_text,
    latency_s=st.floats(allow_nan=False),
    attempts=st.integers(1, 99),  # a stored 0 reads back as 1 (format rule)
    created=st.floats(allow_nan=False),
    stop_reason=_opt_text,
    conversation_rule=st.integers(1, 3),
)


def _by_rows(comps: list[Completion]) -> pa.Table:
    return pa.Table.from_pylist([completion_row(c) for c in comps], schema=COMPLETION_SCHEMA)


@settings(max_examples=60, deadline=None)
@given(st.lists(_completion, max_size=6))
def test_columnwise_table_equals_rowwise(comps: list[Completion]) -> None:
    table = completions_table(comps)
    assert table.schema.equals(COMPLETION_SCHEMA, check_metadata=True)
    assert table.equals(_by_rows(comps), check_metadata=True)
    # every column is one chunk of the right length (parquet writes one row group)
    assert all(col.num_chunks == 1 and len(col) == len(comps) for col in table.columns)


@settings(max_examples=25, deadline=None)
@given(st.lists(_completion, min_size=1, max_size=5))
def test_shard_round_trip_with_dictionary_columns(comps: list[Completion]) -> None:
    data = parquet_bytes(completions_table(comps))
    back = pq.read_table(io.BytesIO(data))
    assert back.equals(_by_rows(comps), check_metadata=False)
    assert list(iter_completions(back)) == comps


def test_dictionary_columns_are_columns_of_the_completion_file() -> None:
    table = completions_table([Completion(id="a", messages=[], turns=[])])
    meta = pq.ParquetFile(io.BytesIO(parquet_bytes(table))).metadata.row_group(0)
    paths = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    listed = DICTIONARY_COLUMNS[COMPLETION_FORMAT]
    assert set(listed) <= set(paths)  # a renamed column would silently lose its dictionary
    assert dictionary_columns(table.schema) == listed
    assert "RLE_DICTIONARY" in paths["model"].encodings
    assert "RLE_DICTIONARY" not in paths["id"].encodings
    assert dictionary_columns(pa.schema([("x", pa.int32())])) is True


_reasons = st.lists(
    st.none() | st.lists(st.none() | st.sampled_from(["stop", "length", "tool_calls"]), max_size=4),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_reasons, min_size=1, max_size=3))
def test_finish_reasons_read_without_converting_turns(chunks: list[list[Any]]) -> None:
    from draftdata.shared.formats import TURN_TYPE
    from draftdata.store.read import turn_finish_reasons

    kind = pa.list_(TURN_TYPE)
    rows = [
        [
            [None if r is None else {"finish_reason": r, "output_token_ids": [1, 2]} for r in turns]
            if turns is not None
            else None
            for turns in chunk
        ]
        for chunk in chunks
    ]
    col = pa.chunked_array([pa.array(chunk, kind) for chunk in rows], kind)
    expected = [
        [t.get("finish_reason") if t is not None else None for t in turns or []]
        for turns in col.to_pylist()
    ]
    assert turn_finish_reasons(col) == expected
