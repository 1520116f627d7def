"""Export a run's completions for training: the drafter trainers' formats, OpenAI messages, parquet.

The JSONL formats and the trainer each one feeds are described in ``draftdata.shared.trainer_rows``:
``sharegpt`` / ``openai`` / ``eagle`` write one row per completion (its whole conversation;
``eagle`` leaves out, and counts, the conversations EAGLE's scripts cannot read);
``specforge`` / ``specforge-text`` / ``speculators`` / ``modelopt`` one row per generated turn
(``turns.py``; all but the first need the target's tokenizer). ``modelopt`` also writes the
chat template ModelOpt must read the rows with beside the output (``template_name``). Every
row carries ``id``, ``source`` and ``domain``.
- ``parquet``: one parquet file with columns id, sample, source, domain, model, conversations
  (list of structs; tool calls as JSON strings), tools (JSON string), which Hugging Face
  ``datasets.load_dataset("parquet", ...)`` loads.

The conversation is ``conversation.assemble``'s (the one rule generate sent the requests by):
the prompt's messages in order, each target turn right after the message it answers, up to the
turn where the conversation stopped. Reading is shard by shard; memory holds one shard and a
hash per exported pair (to drop duplicates). The output is created only if absent: a local file
via temp file + no-replace link; an ``s3://`` object via a local temp file and one conditional
upload (``If-None-Match: *``). Failures are not exported.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.errors import AlreadyExistsError, ConfigError, InputError, disk_errors
from draftdata.export.turns import TurnRows
from draftdata.records import Completion, sample_key
from draftdata.shared.conversation import assemble
from draftdata.shared.formats import iter_completions as _rows
from draftdata.shared.trainer_rows import (
    CONVERSATION_FORMATS,
    PER_TURN_FORMATS,
    conversation_row,
    eagle_problem,
)
from draftdata.store.base import Store, split_s3_url
from draftdata.store.doneset import DoneSet
from draftdata.store.lease import refuse_live_writer
from draftdata.store.manifest import MANIFEST_KEY
from draftdata.store.opener import open_store
from draftdata.store.protect import check_not_protected
from draftdata.store.read import (
    COMPLETIONS_PREFIX,
    iter_completion_tables,
    read_manifest,
    shard_keys,
)
from draftdata.store.settings import settings_of
from draftdata.support.metrics import StageStats

ExportFormat = Literal[
    "sharegpt",
    "openai",
    "parquet",
    "specforge",
    "specforge-text",
    "speculators",
    "modelopt",
    "eagle",
]
FORMATS: tuple[str, ...] = (
    "sharegpt",
    "openai",
    "parquet",
    *PER_TURN_FORMATS,
    *(f for f in CONVERSATION_FORMATS if f not in ("sharegpt", "openai", *PER_TURN_FORMATS)),
)


def template_name(name: str) -> str:
    """The name of the chat template file written beside export ``name`` (``modelopt``):
    ``train.jsonl`` -> ``train.chat_template.jinja``."""
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    return f"{stem}.chat_template.jinja"


_CONV_TYPE = pa.list_(
    pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning_content", pa.string()),
            ("tool_calls", pa.string()),
            ("tool_call_id", pa.string()),
        ]
    )
)
EXPORT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sample", pa.int32()),
        ("source", pa.string()),
        ("domain", pa.string()),
        ("model", pa.string()),
        ("conversations", _CONV_TYPE),
        ("tools", pa.string()),
    ],
    metadata={b"draftdata.format": b"export/1"},
)


def export_record(c: Completion, fmt: str, include_reasoning: bool = True) -> dict[str, Any]:
    """The JSON object of one completion in a whole-conversation format (``sharegpt``,
    ``openai``, ``modelopt`` or ``eagle``)."""
    return conversation_row(
        fmt,
        sample_key(c.id, c.sample),
        assemble(c),
        source=c.source,
        domain=c.domain,
        tools=c.tools,
        include_reasoning=include_reasoning,
    )


def _parquet_row(c: Completion, include_reasoning: bool) -> dict[str, Any]:
    conv = []
    for m in assemble(c):
        conv.append(
            {
                "role": m.role,
                "content": m.content or "",
                "reasoning_content": m.reasoning_content if include_reasoning else None,
                "tool_calls": json.dumps(m.tool_calls) if m.tool_calls else None,
                "tool_call_id": m.tool_call_id,
            }
        )
    return {
        "id": c.id,
        "sample": c.sample,
        "source": c.source,
        "domain": c.domain,
        "model": c.model,
        "conversations": conv,
        "tools": json.dumps(c.tools) if c.tools else None,
    }


def _unique_completions(run: Store, stats: StageStats) -> Iterator[list[Completion]]:
    seen = DoneSet()
    for table in iter_completion_tables(run):
        stats.add("export.shards")
        batch = []
        for c in _rows(table):
            if seen.add(c.id, c.sample):
                batch.append(c)
                cut = sum(1 for t in c.turns if t.finish_reason == "length")
                if cut:  # the summary line says what became of them, per format
                    stats.add("export.cut_turns", cut)
                    stats.add("export.cut_completions")
            else:
                stats.add("export.duplicates_dropped")
        yield batch


def _write_export(
    run: Store,
    fmt: str,
    tmp: Path,
    include_reasoning: bool,
    stats: StageStats,
    turns: TurnRows | None = None,
) -> None:
    if fmt == "parquet":
        with pq.ParquetWriter(tmp, EXPORT_SCHEMA, compression="zstd") as writer:
            for batch in _unique_completions(run, stats):
                if batch:
                    rows = [_parquet_row(c, include_reasoning) for c in batch]
                    writer.write_table(pa.Table.from_pylist(rows, schema=EXPORT_SCHEMA))
                    stats.add("export.records", len(batch))
                    stats.add("export.rows", len(rows))
        return
    with tmp.open("w", encoding="utf-8") as fh:
        for batch in _unique_completions(run, stats):
            if turns is not None:
                rows = turns.rows(batch, stats)
            else:
                rows = []
                for c in batch:
                    why = eagle_problem(assemble(c), c.tools) if fmt == "eagle" else None
                    if why is not None:
                        stats.add(f"export.left_out.{why}")
                        continue
                    rows.append(export_record(c, fmt, include_reasoning))
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False))
                fh.write("\n")
            stats.add("export.records", len(batch))
            stats.add("export.rows", len(rows))
        fh.flush()
        os.fsync(fh.fileno())


def _export_local(
    run: Store,
    fmt: str,
    path: Path,
    include_reasoning: bool,
    stats: StageStats,
    turns: TurnRows | None,
) -> None:
    if path.exists():
        raise AlreadyExistsError(f"{path}: already exists; choose a new --out (never overwritten)")
    template = _template(turns)
    side = path.parent / template_name(path.name)
    if template is not None:
        _check_template(str(side), side.read_bytes() if side.exists() else None, template)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(4)}"
    try:
        _write_export(run, fmt, tmp, include_reasoning, stats, turns)
        if template is not None and not side.exists():
            side_tmp = path.parent / f".{side.name}.tmp-{secrets.token_hex(4)}"
            try:
                side_tmp.write_bytes(template)
                os.link(side_tmp, side)
            except FileExistsError:
                _check_template(str(side), side.read_bytes(), template)
            finally:
                side_tmp.unlink(missing_ok=True)
        try:
            os.link(tmp, path)
        except FileExistsError as exc:
            raise AlreadyExistsError(f"{path}: appeared during the export; not replaced") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _export_s3(
    run: Store,
    fmt: str,
    url: str,
    include_reasoning: bool,
    stats: StageStats,
    protect: Sequence[str],
    turns: TurnRows | None,
) -> None:
    bucket, key = split_s3_url(url)
    parent, _, name = key.rpartition("/")
    if not name or url.endswith("/"):
        raise ConfigError(f"--out {url}: give an object name, e.g. {url.rstrip('/')}/train.jsonl")
    store = open_store(f"s3://{bucket}/{parent}" if parent else f"s3://{bucket}", protect=protect)
    check_not_protected(url, protect, what="export destination")
    if store.exists(name):
        raise AlreadyExistsError(f"{url}: already exists; choose a new --out (never overwritten)")
    template = _template(turns)
    side = template_name(name)
    side_url = f"{url.rsplit('/', 1)[0]}/{side}"
    if template is not None:
        _check_template(side_url, store.read(side) if store.exists(side) else None, template)
    # Staged in a local temp file (TMPDIR), then one create-only upload: a reader sees the
    # whole export or nothing, and a key that appeared meanwhile is never replaced (412).
    with tempfile.TemporaryDirectory(prefix="draftdata-export-") as tmpdir:
        tmp = Path(tmpdir) / name
        _write_export(run, fmt, tmp, include_reasoning, stats, turns)
        with stats.timed("export.upload"):
            if template is not None and not store.exists(side):
                (Path(tmpdir) / side).write_bytes(template)
                store.put_new_file(side, Path(tmpdir) / side)  # before the rows: a reader
            store.put_new_file(name, tmp)  # that sees the rows finds their template


def _template(turns: TurnRows | None) -> bytes | None:
    text = turns.chat_template if turns is not None else None
    return text.encode("utf-8") if text is not None else None


def _check_template(where: str, existing: bytes | None, template: bytes) -> None:
    # The template beside an export is written once; the same text (an earlier try of the
    # same export that failed after writing it) is kept, another is never replaced.
    if existing is not None and existing != template:
        raise AlreadyExistsError(
            f"{where}: already exists with another chat template; choose a new --out "
            "(never overwritten)"
        )


def export_run(
    run: str,
    fmt: str,
    out: str | Path,
    *,
    include_reasoning: bool = True,
    protect: Sequence[str] = (),
    tokenizer: str | None = None,
    chat_template: str | None = None,
) -> StageStats:
    """Write the run's completions to ``out`` (a local file or ``s3://bucket/key``) in ``fmt``.

    ``out`` must not exist (nothing is overwritten); it appears whole when the export ends. An
    S3 export is staged in a local temp file and uploaded create-only (``If-None-Match: *``).
    ``out`` may not equal, contain or lie inside any of ``protect``. ``tokenizer`` (a Hugging
    Face tokenizer folder) and ``chat_template`` (a template file overriding its template) are
    what ``specforge-text``, ``speculators`` and ``modelopt`` tokenize with (``modelopt`` also
    writes ``template_name(out)`` beside ``out``). Stats: ``export.records`` (completions),
    ``export.rows`` (rows written), ``export.duplicates_dropped``, ``export.cut_turns`` /
    ``export.cut_completions`` (turns cut by the token limit, and the completions holding one),
    ``export.cut_turns_skipped`` (``specforge``, ``modelopt``: no row for them),
    ``export.tokenize.dropped.<reason>`` (the token formats) and ``export.left_out.<reason>``
    (what a format cannot hold exactly). Returns the stats.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    stats = StageStats("export")
    src = open_store(run)  # opened once: manifest check and every shard read
    manifest = read_manifest(src)  # StoreError "no manifest.json; not a draftdata run" first
    refuse_live_writer(src, "export")  # a moving run is not exported as if it were whole
    if not shard_keys(src, COMPLETIONS_PREFIX):  # an empty file would be written
        raise InputError(
            f"{src.key_url(COMPLETIONS_PREFIX)}: no completion shards to export (the run "
            "committed no completion; `draftdata stats RUN` shows its failures)"
        )
    turns = None
    if fmt in PER_TURN_FORMATS:
        settings = settings_of(manifest, src.key_url(MANIFEST_KEY))
        turns = TurnRows(
            fmt,
            include_reasoning=include_reasoning,
            keep_reasoning_history=settings.keep_reasoning_history,
            tokenizer=tokenizer,
            chat_template=chat_template,
        )
    dest = str(out)
    if dest.startswith("s3://"):
        staging = tempfile.gettempdir()
        fix = "set TMPDIR to a folder with room for the whole export (it is staged there)"
        with disk_errors(f"the export's local copy in {staging}", fix):
            _export_s3(src, fmt, dest, include_reasoning, stats, protect, turns)
    else:
        check_not_protected(dest, protect, what="export destination")
        with disk_errors(dest, "choose another --out"):
            _export_local(src, fmt, Path(dest), include_reasoning, stats, turns)
    return stats
