"""On-disk formats: Arrow schemas of our parquet files, the JSON files beside them, and their
format versions.

Every parquet file we write carries ``draftdata.format`` = ``<kind>/<version>`` in its schema
metadata, and every reader calls ``check_format`` first. Heterogeneous JSON values (tool specs,
tool calls, ``meta``, ``sampling``) are stored as JSON strings so the files stay loadable by
Hugging Face ``datasets`` and any parquet reader; everything else is typed columns.

Every JSON file a stage writes beside its data (a run's manifest, prepare's report, merge's
config and report, tokenize's config and summary, a pilot's forecast) is a ``JsonFile`` here:
its one name and its format, whose value its ``"format"`` key carries, and ``load``, the one
checked way to read it (a file of another format is a FormatVersionError, one line).

This module converts between records and Arrow tables and checks the JSON files' shape; it does
not know where files live.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import pyarrow as pa

from draftdata.errors import FormatVersionError, InputError
from draftdata.records import Completion, Failure, Message, Sample, Turn, Usage

FORMAT_KEY = b"draftdata.format"
COMPLETION_FORMAT = "completion/3"
# Older versions a reader of the current one accepts: completion/2 lacks ``server_thinking``
# (the mode of an answer is then not recorded); completion/1 also lacks ``stop_reason`` and
# ``conversation_rule`` (its turns follow conversation rule 1).
READABLE_FORMATS: dict[str, tuple[str, ...]] = {COMPLETION_FORMAT: ("completion/2", "completion/1")}
FAILURE_FORMAT = "failure/1"
SAMPLE_FORMAT = "sample/1"

_json = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()
_Record = TypeVar("_Record", bound=msgspec.Struct)


# -- the JSON files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonFile:
    """One kind of JSON file draftdata writes: its ``name`` in its folder or prefix, the
    ``format`` its ``"format"`` key carries, and what it is and who writes it (for the one-line
    errors); ``indent`` and ``ascii`` are how ``dump`` lays it out."""

    name: str
    format: str
    what: str
    writer: str
    indent: int = 1
    ascii: bool = False

    def load(self, raw: bytes, where: str) -> dict[str, Any]:
        """The file's JSON object, read from ``raw`` (at ``where``): InputError when it is not
        a JSON object, FormatVersionError when it carries another format."""
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON ({exc}); {self._hint()}") from exc
        if not isinstance(doc, dict):
            raise InputError(f"{where}: expected a JSON object; {self._hint()}")
        found = doc.get("format")
        if found != self.format:
            raise FormatVersionError(
                f"{where}: format {found!r}, this draftdata reads {self.format} ({self.what}); "
                f"{self._hint()}"
            )
        return doc

    def read(self, raw: bytes, where: str, kind: type[_Record]) -> _Record:
        """The file as its typed record ``kind`` (a msgspec Struct): ``load``'s checks, then
        InputError (one line) when its fields do not read as ``kind``'s."""
        doc = self.load(raw, where)
        try:
            return msgspec.convert(doc, kind)
        except msgspec.ValidationError as exc:
            raise InputError(f"{where}: {exc}; {self._hint()}") from exc

    def dump(self, record: msgspec.Struct) -> bytes:
        """The bytes of ``record`` as this file holds it: its fields in their declared order,
        one a line (JSON indented by ``indent``; UTF-8 kept, or escaped with ``ascii``), a
        newline at the end."""
        doc = msgspec.to_builtins(record)
        return (json.dumps(doc, indent=self.indent, ensure_ascii=self.ascii) + "\n").encode()

    def _hint(self) -> str:
        return f"{self.name} is {self.what}, written by {self.writer}"


RUN_MANIFEST = JsonFile(  # what makes a prefix a generate run (store/manifest.py)
    "manifest.json", "draftdata.run/1", "a run's manifest", "draftdata generate"
)
PREPARE_REPORT = JsonFile(
    "prepare_report.json", "draftdata.prepare_report/1", "prepare's report", "draftdata prepare"
)
MERGE_CONFIG = JsonFile(  # written first: without the report, the merge is unfinished
    "merge_config.json", "draftdata.merge-config", "merge's settings", "draftdata merge"
)
MERGE_REPORT = JsonFile(  # the typed record: store/merge_report.py
    "merge_report.json",
    "draftdata.merge-report",
    "merge's report",
    "draftdata merge",
    indent=2,
    ascii=True,
)
TOKENIZE_CONFIG = JsonFile(  # written first: without the summary, the tokenize is unfinished
    "tokenize_config.json",
    "draftdata.tokenize-summary/1",
    "tokenize's settings",
    "draftdata tokenize",
)
TOKENIZE_SUMMARY = JsonFile(
    "summary.json", "draftdata.tokenize-summary/1", "tokenize's summary", "draftdata tokenize"
)
HIDDEN_MANIFEST = JsonFile(  # what makes a prefix a hidden-state set; written before any pass
    "hidden_manifest.json",
    "draftdata.hidden-manifest/1",
    "a hidden-state set's manifest",
    "draftdata hidden-states",
)
HIDDEN_SUMMARY = JsonFile(  # one per finished command: hidden_summary.json, hidden_summary-2.json
    "hidden_summary.json",
    "draftdata.hidden-summary/1",
    "a hidden-state set's summary",
    "draftdata hidden-states",
)
FORECAST = JsonFile(  # forecast.json, then forecast-2.json, ... (store/forecast.py)
    "forecast.json", "draftdata.forecast/1", "a pilot's forecast", "draftdata generate --pilot"
)
HIDDEN_INDEX = "hidden_index.parquet"  # row, id, file, counts: which file holds which sample
HIDDEN_INDEX_FORMAT = "hidden-index/1"
# prepare's other files beside its report: the prompt shards and the rejected lines
PREPARE_SHARDS = "prompts-*.jsonl"  # prompts-00000.jsonl, ... (``prepare_shard``)
PREPARE_REJECTS = "rejects.jsonl"
PREPARE_REPORT_MD = "prepare_report.md"


def prepare_shard(n: int) -> str:
    """The name of prepare's ``n``-th prompt shard."""
    return f"prompts-{n:05d}.jsonl"


MESSAGE_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("tool_calls", pa.string()),  # JSON list or null
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)
USAGE_TYPE = pa.struct(
    [
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
    ]
)
TURN_TYPE = pa.struct(
    [
        ("content", pa.string()),
        ("reasoning", pa.string()),
        ("tool_calls", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("output_token_ids", pa.list_(pa.int32())),
        ("usage", USAGE_TYPE),
    ]
)


def _schema(fields: list[tuple[str, pa.DataType]], kind: str) -> pa.Schema:
    return pa.schema(fields, metadata={FORMAT_KEY: kind.encode()})


COMPLETION_SCHEMA = _schema(
    [
        ("id", pa.string()),
        ("sample", pa.int32()),
        ("source", pa.string()),
        ("domain", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("tools", pa.string()),
        ("turns", pa.list_(TURN_TYPE)),
        ("usage", USAGE_TYPE),
        ("model", pa.string()),
        ("sampling", pa.string()),
        ("endpoint", pa.string()),
        ("latency_s", pa.float64()),
        ("attempts", pa.int32()),
        ("created", pa.float64()),
        ("stop_reason", pa.string()),
        ("conversation_rule", pa.int32()),
        ("server_thinking", pa.bool_()),
    ],
    COMPLETION_FORMAT,
)

FAILURE_SCHEMA = _schema(
    [
        ("id", pa.string()),
        ("sample", pa.int32()),
        ("stage", pa.string()),
        ("reason", pa.string()),
        ("message", pa.string()),
        ("attempts", pa.int32()),
        ("source", pa.string()),
        ("domain", pa.string()),
        ("endpoint", pa.string()),
        ("created", pa.float64()),
    ],
    FAILURE_FORMAT,
)

SAMPLE_SCHEMA = _schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("domain", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("truncated", pa.bool_()),
    ],
    SAMPLE_FORMAT,
)


# Columns worth a parquet dictionary (few distinct values per shard). The others (ids, texts,
# token ids, timings) are written plain: dictionary-encoding them costs more CPU than the whole
# rest of the write and makes the zstd-compressed file larger, not smaller.
DICTIONARY_COLUMNS: dict[str, list[str]] = {
    COMPLETION_FORMAT: [
        "source",
        "domain",
        "messages.list.element.role",
        "turns.list.element.finish_reason",
        "model",
        "sampling",
        "endpoint",
        "stop_reason",
    ],
}


def dictionary_columns(schema: pa.Schema) -> list[str] | bool:
    """Parquet ``use_dictionary`` for a table of ``schema``: the listed columns of its format,
    else every column (the parquet writer's default)."""
    meta = schema.metadata or {}
    return DICTIONARY_COLUMNS.get(meta.get(FORMAT_KEY, b"").decode(), True)


HIDDEN_INDEX_SCHEMA = _schema(
    [
        ("row", pa.int64()),  # the file's number: its position in the plan
        ("id", pa.string()),
        ("file", pa.string()),  # the key of its file under the set's prefix
        ("source", pa.string()),
        ("domain", pa.string()),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("truncated", pa.bool_()),  # cut to --max-length here (or by tokenize)
    ],
    HIDDEN_INDEX_FORMAT,
)


def check_format(schema: pa.Schema, expected: str, where: str) -> None:
    """Raise FormatVersionError unless ``schema`` carries the ``expected`` kind/version (or an
    older version the reader of ``expected`` still reads, ``READABLE_FORMATS``)."""
    meta = schema.metadata or {}
    found = meta.get(FORMAT_KEY, b"").decode() or None
    if found != expected and found not in READABLE_FORMATS.get(expected, ()):
        kind = expected.split("/")[0]
        if found and found.split("/")[0] == kind:
            raise FormatVersionError(
                f"{where}: written as {found}, this draftdata reads {expected}; "
                "use the draftdata version that wrote it"
            )
        raise FormatVersionError(
            f"{where}: not a draftdata {kind} file (format {found or 'missing'}, "
            f"expected {expected})"
        )


def _j(value: Any) -> str | None:
    return None if value is None else _json.encode(value).decode()


def _unj(value: str | None) -> Any:
    return None if value is None else _dec.decode(value)


def _message_row(m: Message) -> dict[str, Any]:
    return {
        "role": m.role,
        "content": m.content,
        "reasoning_content": m.reasoning_content,
        "tool_calls": _j(m.tool_calls),
        "tool_call_id": m.tool_call_id,
        "name": m.name,
    }


def _usage_row(u: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "cached_tokens": u.cached_tokens,
    }


def completion_row(c: Completion) -> dict[str, Any]:
    """The Arrow row (a plain dict) of one Completion."""
    return {
        "id": c.id,
        "sample": c.sample,
        "source": c.source,
        "domain": c.domain,
        "messages": [_message_row(m) for m in c.messages],
        "tools": _j(c.tools),
        "turns": [
            {
                "content": t.content,
                "reasoning": t.reasoning,
                "tool_calls": _j(t.tool_calls),
                "finish_reason": t.finish_reason,
                "prompt_token_ids": t.prompt_token_ids,
                "output_token_ids": t.output_token_ids,
                "usage": _usage_row(t.usage),
            }
            for t in c.turns
        ],
        "usage": _usage_row(c.usage),
        "model": c.model,
        "sampling": _j(c.sampling),
        "endpoint": c.endpoint,
        "latency_s": c.latency_s,
        "attempts": c.attempts,
        "created": c.created,
        "stop_reason": c.stop_reason,
        "conversation_rule": c.conversation_rule,
        "server_thinking": c.server_thinking,
    }


def _message(d: dict[str, Any]) -> Message:
    return Message(
        role=d["role"],
        content=d.get("content"),
        reasoning_content=d.get("reasoning_content"),
        tool_calls=_unj(d.get("tool_calls")),
        tool_call_id=d.get("tool_call_id"),
        name=d.get("name"),
    )


def _usage(d: dict[str, Any] | None) -> Usage:
    if not d:
        return Usage()
    return Usage(
        prompt_tokens=d.get("prompt_tokens") or 0,
        completion_tokens=d.get("completion_tokens") or 0,
        cached_tokens=d.get("cached_tokens") or 0,
    )


def turn_from_row(t: dict[str, Any]) -> Turn:
    """One element of a completions shard's ``turns`` column (as ``to_pylist`` gives it)."""
    return Turn(
        content=t.get("content"),
        reasoning=t.get("reasoning"),
        tool_calls=_unj(t.get("tool_calls")),
        finish_reason=t.get("finish_reason"),
        prompt_token_ids=t.get("prompt_token_ids"),
        output_token_ids=t.get("output_token_ids"),
        usage=_usage(t.get("usage")),
    )


def completion_from_row(d: dict[str, Any]) -> Completion:
    """Inverse of ``completion_row``."""
    return Completion(
        id=d["id"],
        sample=d.get("sample") or 0,
        source=d.get("source") or "",
        domain=d.get("domain") or "",
        messages=[_message(m) for m in d.get("messages") or []],
        tools=_unj(d.get("tools")),
        turns=[turn_from_row(t) for t in d.get("turns") or []],
        usage=_usage(d.get("usage")),
        model=d.get("model") or "",
        sampling=_unj(d.get("sampling")) or {},
        endpoint=d.get("endpoint") or "",
        latency_s=d.get("latency_s") or 0.0,
        attempts=d.get("attempts") or 1,
        created=d.get("created") or 0.0,
        stop_reason=d.get("stop_reason"),
        # a completion/1 row has no rule: its turns were generated under rule 1
        conversation_rule=d.get("conversation_rule") or 1,
        server_thinking=d.get("server_thinking"),  # absent before completion/3: not known
    )


def failure_row(f: Failure) -> dict[str, Any]:
    """The Arrow row of one Failure."""
    return {
        "id": f.id,
        "sample": f.sample,
        "stage": f.stage,
        "reason": f.reason,
        "message": f.message,
        "attempts": f.attempts,
        "source": f.source,
        "domain": f.domain,
        "endpoint": f.endpoint,
        "created": f.created,
    }


def failure_from_row(d: dict[str, Any]) -> Failure:
    """Inverse of ``failure_row``."""
    return Failure(
        id=d["id"],
        sample=d.get("sample") or 0,
        stage=d.get("stage") or "generate",
        reason=d["reason"],
        message=d.get("message") or "",
        attempts=d.get("attempts") or 0,
        source=d.get("source") or "",
        domain=d.get("domain") or "",
        endpoint=d.get("endpoint") or "",
        created=d.get("created") or 0.0,
    )


def sample_row(s: Sample) -> dict[str, Any]:
    """The Arrow row of one Sample."""
    return msgspec.structs.asdict(s)


def _offsets(lengths: Iterable[int]) -> pa.Array:
    out = [0]
    total = 0
    for n in lengths:
        total += n
        out.append(total)
    return pa.array(out, pa.int32())


def _usage_array(usages: list[Usage]) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [
            pa.array([u.prompt_tokens for u in usages], pa.int64()),
            pa.array([u.completion_tokens for u in usages], pa.int64()),
            pa.array([u.cached_tokens for u in usages], pa.int64()),
        ],
        fields=list(USAGE_TYPE),
    )


_ID_LIST = pa.list_(pa.int32())


def _id_lists(lists: list[list[int] | None]) -> pa.Array:
    """A list<int32> array of token-id lists (None allowed), built from one flat value array
    (much cheaper than converting nested Python lists)."""
    flat: list[int] = []
    offsets = [0]
    nulls = False
    for ids in lists:
        if ids is None:
            nulls = True
        else:
            flat.extend(ids)
        offsets.append(len(flat))
    values = pa.array(flat, pa.int32())
    mask = pa.array([ids is None for ids in lists], pa.bool_()) if nulls else None
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, type=_ID_LIST, mask=mask)


def _column(values: list[Any], kind: pa.DataType) -> pa.Array:
    return pa.array(values, kind)


def completions_table(items: Iterable[Completion]) -> pa.Table:
    """An Arrow table (with format metadata) of completions.

    Built column by column (the same table as ``pa.Table.from_pylist`` of ``completion_row``
    rows, at a fraction of the cost: no per-row dicts, token ids converted as one flat array).
    """
    comps = list(items)
    msgs = [m for c in comps for m in c.messages]
    turns = [t for c in comps for t in c.turns]
    string = pa.string()
    messages = pa.StructArray.from_arrays(
        [
            _column([m.role for m in msgs], string),
            _column([m.content for m in msgs], string),
            _column([m.reasoning_content for m in msgs], string),
            _column([_j(m.tool_calls) for m in msgs], string),
            _column([m.tool_call_id for m in msgs], string),
            _column([m.name for m in msgs], string),
        ],
        fields=list(MESSAGE_TYPE),
    )
    turn_values = pa.StructArray.from_arrays(
        [
            _column([t.content for t in turns], string),
            _column([t.reasoning for t in turns], string),
            _column([_j(t.tool_calls) for t in turns], string),
            _column([t.finish_reason for t in turns], string),
            _id_lists([t.prompt_token_ids for t in turns]),
            _id_lists([t.output_token_ids for t in turns]),
            _usage_array([t.usage for t in turns]),
        ],
        fields=list(TURN_TYPE),
    )
    columns = [
        _column([c.id for c in comps], string),
        _column([c.sample for c in comps], pa.int32()),
        _column([c.source for c in comps], string),
        _column([c.domain for c in comps], string),
        pa.ListArray.from_arrays(
            _offsets(len(c.messages) for c in comps), messages, type=pa.list_(MESSAGE_TYPE)
        ),
        _column([_j(c.tools) for c in comps], string),
        pa.ListArray.from_arrays(
            _offsets(len(c.turns) for c in comps), turn_values, type=pa.list_(TURN_TYPE)
        ),
        _usage_array([c.usage for c in comps]),
        _column([c.model for c in comps], string),
        _column([_j(c.sampling) for c in comps], string),
        _column([c.endpoint for c in comps], string),
        _column([c.latency_s for c in comps], pa.float64()),
        _column([c.attempts for c in comps], pa.int32()),
        _column([c.created for c in comps], pa.float64()),
        _column([c.stop_reason for c in comps], string),
        _column([c.conversation_rule for c in comps], pa.int32()),
        _column([c.server_thinking for c in comps], pa.bool_()),
    ]
    return pa.Table.from_arrays(columns, schema=COMPLETION_SCHEMA)


def failures_table(items: Iterable[Failure]) -> pa.Table:
    """An Arrow table (with format metadata) of failures."""
    return pa.Table.from_pylist([failure_row(f) for f in items], schema=FAILURE_SCHEMA)


def samples_table(items: Iterable[Sample]) -> pa.Table:
    """An Arrow table (with format metadata) of tokenized samples."""
    return pa.Table.from_pylist([sample_row(s) for s in items], schema=SAMPLE_SCHEMA)


def iter_completions(table: pa.Table) -> Iterator[Completion]:
    """Completions of a table read from a completions shard (call ``check_format`` first)."""
    for row in table.to_pylist():
        yield completion_from_row(row)


def iter_failures(table: pa.Table) -> Iterator[Failure]:
    """Failures of a table read from a failures shard."""
    for row in table.to_pylist():
        yield failure_from_row(row)
