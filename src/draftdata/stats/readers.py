"""Find out what a dataset location holds, and stream its rows, for ``stats`` and ``merge``.

``open_dataset(url)`` takes a local path or ``s3://`` URL (a file or a directory/prefix) and
returns a ``Dataset``: its kind and the data files to read, in a fixed order. Kinds:

- ``run``: a generate run (``manifest.json`` + ``completions/part-*.parquet``), or a folder of
  bare completion shards;
- ``prompts``: prepare's output (``prompts-*.jsonl`` next to ``prepare_report.json``; its
  ``rejects.jsonl`` is skipped), a ``prompts/`` folder of JSONL, or any JSONL of Prompt records;
- ``tokenized``: parquet with ``sample/1`` metadata (tokenize's output, merged tokenized sets) or
  foreign parquet with ``input_ids`` / ``loss_mask`` columns;
- ``conversations``: SpecForge / ShareGPT / OpenAI-messages rows as JSONL, a JSON array, or
  parquet (including merge's ``conversation/1`` output).

Rows are read through ``draftdata.shared.readers`` (the reader stack prepare reads its sources
with): lazily, JSONL line by line, JSON arrays element by element, parquet batch by batch. A
malformed row goes to ``on_bad(where, reason)`` (``file:line: what``) and is skipped; it never
stops the read (invalid JSON or UTF-8, any shape, any nesting depth; a leading byte-order mark
is skipped). This module computes nothing; ``compute.py`` and ``merge/`` do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from draftdata.errors import DraftdataError, EmptyInputError, InputError, RowError
from draftdata.records import Completion, decode_json_line, parse_prompt
from draftdata.shared.conversation import Conversation
from draftdata.shared.formats import (
    COMPLETION_FORMAT,
    FORMAT_KEY,
    MERGE_CONFIG,
    MERGE_REPORT,
    PREPARE_REPORT,
    RUN_MANIFEST,
    SAMPLE_FORMAT,
    SAMPLE_SCHEMA,
    TOKENIZE_CONFIG,
    TOKENIZE_SUMMARY,
    JsonFile,
    check_format,
    completion_from_row,
)
from draftdata.shared.readers.base import OnReject, RowFile, decoded
from draftdata.shared.readers.files import holds_nothing
from draftdata.shared.readers.jsontext import JsonReader
from draftdata.shared.readers.parquet import ParquetReader, open_parquet
from draftdata.shared.speculation import ACCEPTANCE_FILE, Acceptance, read_acceptance
from draftdata.shared.speculation import FORMAT as ACCEPTANCE_FORMAT
from draftdata.stats.conversations import (
    CONVERSATION_FORMAT,
    completion_to_conversation,
    row_to_conversation,
)
from draftdata.store.base import Store
from draftdata.store.opener import open_store
from draftdata.store.quarantine import quarantined_in
from draftdata.store.read import read_shard

Kind = Literal["run", "prompts", "tokenized", "conversations"]
OnBad = Callable[[str, str], None]

DATA_EXT = (".parquet", ".jsonl", ".jsonl.gz", ".json", ".json.gz")
# JSON files that describe a dataset rather than hold its rows.
_NOT_DATA = ("report", "summary", "manifest", "stats", "metrics", "config")


@dataclass(frozen=True)
class Dataset:
    """A located dataset: its kind, the store it lives in, and its data files in read order."""

    url: str
    kind: Kind
    store: Store
    keys: tuple[str, ...]
    is_run: bool = False  # the store is a run root (manifest, failures, metrics readable)

    @property
    def samples(self) -> bool:
        """True for tokenized samples, False for conversation-shaped rows."""
        return self.kind == "tokenized"

    def where(self, key: str) -> str:
        """The full URL of one data file, for messages."""
        return self.store.key_url(key)


def _raise(where: str, reason: str) -> None:
    raise InputError(f"{where}: {reason}")


def _is_data(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    if name.startswith((".", "_")) or any(p.startswith(".") for p in key.split("/")):
        return False
    if not name.endswith(DATA_EXT):
        return False
    return not (name.endswith((".json", ".json.gz")) and any(w in name for w in _NOT_DATA))


def _split_location(url: str) -> tuple[Store, tuple[str, ...] | None]:
    """(store of the directory, (file key,)) for a file; (store, None) for a directory."""
    if url.startswith("s3://"):
        name = url.rstrip("/").rsplit("/", 1)[-1]
        if name.endswith(DATA_EXT) and "/" in url[5:].rstrip("/"):
            parent = url.rstrip("/").rsplit("/", 1)[0]
            store = open_store(parent)
            if store.exists(name):
                return store, (name,)
        store = open_store(url)
        if not store.list(""):
            raise InputError(f"{url}: no such dataset (nothing under this prefix)")
        return store, None
    path = os.path.realpath(os.path.expanduser(url))
    if os.path.isfile(path):
        return open_store(os.path.dirname(path)), (os.path.basename(path),)
    if os.path.isdir(path):
        return open_store(path), None
    raise InputError(f"{url}: no such file or directory")


def row_file(store: Store, key: str) -> RowFile:
    """The data file ``key`` of ``store``, for the readers."""
    path = store.local_path(key)
    if path is not None:
        return RowFile(store.key_url(key), RowFile.local(path).open, path)
    return RowFile(store.key_url(key), lambda: store.open_input(key))


def _parquet(store: Store, key: str) -> pq.ParquetFile:
    return open_parquet(row_file(store, key))


def _parquet_kind(store: Store, key: str) -> Kind:
    schema = _parquet(store, key).schema_arrow
    fmt = (schema.metadata or {}).get(FORMAT_KEY, b"").decode()
    where = store.key_url(key)
    if fmt.startswith("sample/"):
        check_format(schema, SAMPLE_FORMAT, where)
        return "tokenized"
    if fmt.startswith("completion/"):
        check_format(schema, COMPLETION_FORMAT, where)
        return "run"
    if fmt.startswith("conversation/"):
        check_format(schema, CONVERSATION_FORMAT, where)
        return "conversations"
    if fmt:
        raise InputError(f"{where}: a draftdata {fmt} file, not a dataset; point at its run")
    names = set(schema.names)
    if {"input_ids", "loss_mask"} <= names:
        return "tokenized"
    if names & {"conversations", "messages"}:
        return "conversations"
    raise InputError(
        f"{where}: unknown dataset columns {sorted(names)}; expected input_ids+loss_mask "
        "(tokenized) or conversations/messages (chat rows)"
    )


def _json_kind(store: Store, key: str) -> Kind:
    for where, raw in _json_raw(store, key):
        try:
            parse_prompt(raw, where)
            return "prompts"
        except InputError:
            pass
        try:
            row_to_conversation(decode_json_line(raw))
            return "conversations"
        except ValueError:
            continue
    return "conversations"


def open_dataset(url: str) -> Dataset:
    """Locate the dataset at ``url`` and detect its kind (see the module docstring).

    InputError when nothing readable is there, or when its files hold different kinds;
    EmptyInputError when its data files hold nothing at all (``readers.files.holds_nothing``:
    every command that reads a dataset refuses an empty one here, in the same line).
    """
    store, file_keys = _split_location(url)
    is_run = False
    if file_keys is not None:
        keys = file_keys
    else:
        listing = store.list("")
        if RUN_MANIFEST.name in listing:
            is_run = True
            aside = quarantined_in(listing)  # shards set aside by `draftdata run check`
            keys = tuple(
                k
                for k in listing
                if k.startswith("completions/") and _is_data(k) and k not in aside
            )
            if not keys:
                return Dataset(url, "run", store, (), is_run=True)
        elif MERGE_CONFIG.name in listing and MERGE_REPORT.name not in listing:
            raise InputError(
                f"{store.url}: an unfinished merge output ({MERGE_CONFIG.name} but no "
                f"{MERGE_REPORT.name}: the merge was stopped before it ended); run the same "
                "merge command again to finish it"
            )
        elif TOKENIZE_CONFIG.name in listing and TOKENIZE_SUMMARY.name not in listing:
            raise InputError(
                f"{store.url}: an unfinished tokenize output ({TOKENIZE_CONFIG.name} but no "
                f"{TOKENIZE_SUMMARY.name}: the tokenize was stopped before it ended); run the "
                "same tokenize command again to finish it"
            )
        elif MERGE_REPORT.name in listing:
            # a merge output: its parquet shards (train and eval) wherever they lie in it;
            # the JSONL export, if any, holds the same rows and is read only without parquet
            keys = tuple(k for k in listing if _is_data(k))
            parquet = tuple(k for k in keys if k.endswith(".parquet"))
            keys = parquet or keys
        elif PREPARE_REPORT.name in listing:
            # prepare's output: prompts-NNNNN.jsonl shards (rejects.jsonl is not data)
            keys = tuple(
                k
                for k in listing
                if "/" not in k and k.startswith("prompts") and k.endswith((".jsonl", ".jsonl.gz"))
            )
        elif any(k.startswith("prompts/") and k.endswith(".jsonl") for k in listing):
            keys = tuple(k for k in listing if k.startswith("prompts/") and k.endswith(".jsonl"))
        else:
            data = tuple(k for k in listing if _is_data(k))
            pq_keys = tuple(k for k in data if k.endswith(".parquet"))
            jsonl = tuple(k for k in data if ".jsonl" in k)
            keys = pq_keys or jsonl or data
        if not keys:
            raise InputError(
                f"{store.url}: no dataset files (.parquet, .jsonl, .json) found; "
                "give a run, a prompts folder, tokenized parquet or conversations"
            )
    if is_run:  # its shards are read (and their format checked) through store.read
        return Dataset(url, "run", store, keys, is_run=True)
    if all(holds_nothing(row_file(store, k)) for k in keys):  # stops at the first with rows
        # empty for every command alike, before a kind is guessed from nothing (an empty file
        # is no conversation, no prompt and no sample)
        raise EmptyInputError(url, "give a run, prompts, tokenized parquet or conversations")
    first = keys[0]
    kind = _parquet_kind(store, first) if first.endswith(".parquet") else _json_kind(store, first)
    return Dataset(url, kind, store, keys, is_run=is_run)


# ---------------------------------------------------------------------------------------------
# Chat-shaped rows (JSON text and parquet, through draftdata.shared.readers)

BAD_ROW = "bad_row"  # the reason of a row that is no conversation (on_bad gets its text)


class _Raw:
    """Rows as they are: raw JSON bytes, or the row a format decoded."""

    def json(self, raw: bytes, where: str) -> Any:
        return raw

    def row(self, row: Any, where: str) -> Any:
        return row


class _Conversations:
    """Rows -> Conversations (``row_to_conversation``); prompts through ``parse_prompt``."""

    def __init__(self, prompts: bool) -> None:
        self.prompts = prompts

    def json(self, raw: bytes, where: str) -> Conversation:
        if not self.prompts:
            return self.row(decoded(raw), where)
        try:
            p = parse_prompt(raw, where)
        except InputError as exc:
            reason = str(exc)
            raise RowError(
                BAD_ROW, reason[len(where) + 2 :] if reason.startswith(where) else reason
            ) from exc
        return Conversation(
            id=p.id, messages=p.messages, source=p.source, domain=p.domain, tools=p.tools
        )

    def row(self, row: Any, where: str) -> Conversation:
        try:
            return row_to_conversation(row)
        except ValueError as exc:
            raise RowError(BAD_ROW, str(exc)) from exc


def _reject_to(on_bad: OnBad) -> OnReject:
    def on_reject(where: str, err: RowError) -> None:
        on_bad(where, err.detail)

    return on_reject


def _json_raw(store: Store, key: str) -> Iterator[tuple[str, bytes]]:
    """(where, raw bytes) of each row of JSON text file ``key`` (rows that cannot even be cut
    out are left out)."""
    for _, where, raw in JsonReader([row_file(store, key)], _Raw()).rows():
        if not isinstance(raw, RowError):
            yield where, raw


def _conversations_of_json(
    store: Store, key: str, prompts: bool, on_bad: OnBad
) -> Iterator[Conversation]:
    files = [row_file(store, key)]
    yield from JsonReader(files, _Conversations(prompts), on_reject=_reject_to(on_bad))


def _conversations_of_parquet(store: Store, key: str, on_bad: OnBad) -> Iterator[Conversation]:
    files = [row_file(store, key)]
    yield from ParquetReader(
        files, _Conversations(False), batch_rows=2048, on_reject=_reject_to(on_bad)
    )


def iter_completion_tables(ds: Dataset) -> Iterator[tuple[str, pa.Table]]:
    """(shard url, Arrow table) of every completions shard of a run, in shard order."""

    for key in ds.keys:
        yield ds.where(key), read_shard(ds.store, key, COMPLETION_FORMAT)


def iter_run_completions(ds: Dataset, on_bad: OnBad = _raise) -> Iterator[Completion]:
    """Every committed Completion of a run; a row that does not decode goes to ``on_bad``."""
    for where, table in iter_completion_tables(ds):
        for n, row in enumerate(table.to_pylist()):
            try:
                yield completion_from_row(row)
            except (KeyError, TypeError, ValueError, msgspec.DecodeError) as exc:
                on_bad(f"{where}: row {n}", f"bad completion row ({exc})")


def iter_conversations(ds: Dataset, on_bad: OnBad = _raise) -> Iterator[Conversation]:
    """Every conversation-shaped row of a prompts, conversations or run dataset, in order."""
    if ds.kind == "tokenized":
        raise InputError(f"{ds.url}: tokenized samples hold token ids, not conversations")
    if ds.kind == "run":
        for c in iter_run_completions(ds, on_bad):
            yield completion_to_conversation(c)
        return
    for key in ds.keys:
        if key.endswith(".parquet"):
            _check_same_kind(ds, key)
            yield from _conversations_of_parquet(ds.store, key, on_bad)
        else:
            yield from _conversations_of_json(ds.store, key, ds.kind == "prompts", on_bad)


def _check_same_kind(ds: Dataset, key: str) -> None:
    if key != ds.keys[0] and _parquet_kind(ds.store, key) != ds.kind:
        raise InputError(
            f"{ds.where(key)}: holds {_parquet_kind(ds.store, key)} rows but "
            f"{ds.where(ds.keys[0])} holds {ds.kind}; keep one kind per dataset"
        )


# ---------------------------------------------------------------------------------------------
# Tokenized samples


def _row_sums(values: pa.Array, offsets: np.ndarray) -> np.ndarray:
    flat = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
    sums = np.zeros(len(offsets) - 1, dtype=np.int64)
    lengths = np.diff(offsets)
    nz = lengths > 0
    if flat.size and nz.any():
        sums[nz] = np.add.reduceat(flat, offsets[:-1][nz])
    return sums


def normalise_samples(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """A batch of sample rows as a ``SAMPLE_SCHEMA`` table: columns cast, missing ones filled.

    Foreign tokenized parquet may lack ``source``/``domain`` (filled with ""), ``num_tokens`` /
    ``num_loss_tokens`` (computed from the lists) or ``truncated`` (False).
    """
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    n = table.num_rows
    cols: dict[str, pa.Array | pa.ChunkedArray] = {}
    for field in SAMPLE_SCHEMA:
        if field.name in table.column_names:
            col = table.column(field.name)
            cols[field.name] = col if col.type == field.type else col.cast(field.type)
    if "id" not in cols:
        raise InputError("tokenized rows need an 'id' column")
    for name in ("source", "domain"):
        if name not in cols:
            cols[name] = pa.array([""] * n, pa.string())
    if "num_tokens" not in cols:
        cols["num_tokens"] = pc.list_value_length(cols["input_ids"]).cast(pa.int32())
    if "num_loss_tokens" not in cols:
        mask = pa.chunked_array(cols["loss_mask"]).combine_chunks()
        offsets = np.asarray(mask.offsets.to_numpy(), dtype=np.int64) - mask.offset
        sums = _row_sums(mask.values, offsets) if n else np.zeros(0, np.int64)
        cols["num_loss_tokens"] = pa.array(sums.astype(np.int32))
    if "truncated" not in cols:
        cols["truncated"] = pa.array([False] * n, pa.bool_())
    return pa.table([cols[f.name] for f in SAMPLE_SCHEMA], schema=SAMPLE_SCHEMA)


def _sample_files(ds: Dataset) -> Iterator[tuple[str, pq.ParquetFile]]:
    """(file url, opened parquet file) of each shard of a tokenized dataset, in file order."""
    if ds.kind != "tokenized":
        raise InputError(f"{ds.url}: holds {ds.kind}, not tokenized samples")
    for key in ds.keys:
        _check_same_kind(ds, key)
        yield ds.where(key), _parquet(ds.store, key)


def iter_sample_batches(
    ds: Dataset,
    columns: list[str] | None = None,
    batch_rows: int = 65536,
    instead: dict[str, str] | None = None,
) -> Iterator[tuple[str, pa.Table]]:
    """(file url, table) batches of a tokenized dataset, in file order, ``SAMPLE_SCHEMA`` typed.

    With ``columns`` only those columns are read (cheap on S3) and returned as read;
    ``instead`` maps a column to the one to read in files that lack it (e.g.
    ``{"num_loss_tokens": "loss_mask"}``).
    """
    for where, pf in _sample_files(ds):
        names = pf.schema_arrow.names
        wanted = list(columns or names)
        for col, other in (instead or {}).items():
            if col in wanted and col not in names and other not in wanted:
                wanted.append(other)
        present = [c for c in wanted if c in names]
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=present):
                if columns is None:
                    yield where, normalise_samples(batch)
                else:
                    yield where, pa.Table.from_batches([batch])
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{where}: cannot read parquet ({exc})") from exc


SUMMARY_COLUMNS = ("domain", "source", "num_tokens", "num_loss_tokens", "truncated")


def iter_sample_summaries(ds: Dataset, batch_rows: int = 65536) -> Iterator[tuple[str, pa.Table]]:
    """(file url, table of ``SUMMARY_COLUMNS``) batches of a tokenized dataset.

    Where a file has the summary columns only those are read (the token lists never leave the
    file); otherwise the lists are read in small batches and the counts derived from them, so
    memory stays bounded either way.
    """
    for where, pf in _sample_files(ds):
        names = set(pf.schema_arrow.names)
        have_counts = {"num_tokens", "num_loss_tokens"} <= names
        cols = [c for c in SUMMARY_COLUMNS if c in names]
        if not have_counts:
            cols = sorted({*cols, "id", "input_ids", "loss_mask"} & names)
        size = batch_rows if have_counts else max(1, min(batch_rows, 1024))
        try:
            for batch in pf.iter_batches(batch_size=size, columns=cols):
                table = pa.Table.from_batches([batch])
                if not have_counts or len(cols) < len(SUMMARY_COLUMNS):
                    if "id" not in table.column_names:
                        table = table.append_column("id", pa.array([""] * table.num_rows))
                    for name in ("input_ids", "loss_mask"):
                        if name not in table.column_names:
                            empty = pa.array([[]] * table.num_rows, pa.list_(pa.int32()))
                            table = table.append_column(name, empty)
                    table = normalise_samples(table).select(list(SUMMARY_COLUMNS))
                yield where, table
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{where}: cannot read parquet ({exc})") from exc


class _Labelled(msgspec.Struct):
    domain: Any = None


_label_decoder = msgspec.json.Decoder(_Labelled)


def iter_domain_labels(ds: Dataset) -> Iterator[str]:
    """The domain label of every row ("" for none), reading no more than the labels where the
    format allows: the ``domain`` column of parquet files, only the ``domain`` key of JSON rows.
    Rows that do not decode give ""; ``iter_conversations`` reports them."""
    for key in ds.keys:
        if key.endswith(".parquet"):
            pf = _parquet(ds.store, key)
            if "domain" not in pf.schema_arrow.names:
                continue
            try:
                for batch in pf.iter_batches(batch_size=65536, columns=["domain"]):
                    for label in batch.column(0).to_pylist():
                        yield label if isinstance(label, str) else ""
            except (OSError, pa.ArrowException) as exc:
                raise InputError(f"{ds.where(key)}: cannot read parquet ({exc})") from exc
            continue
        for _, raw in _json_raw(ds.store, key):
            try:
                label = _label_decoder.decode(raw).domain
            except (msgspec.DecodeError, ValueError):
                label = None
            yield label if isinstance(label, str) else ""


def read_json_file(store: Store, file: JsonFile, key: str | None = None) -> dict[str, Any] | None:
    """``file`` at ``key`` (default: its name) through its checked loader (``formats.py``);
    None when it is absent or is not that file (damaged, another format, another program's
    JSON): what reads it here only adds it to a figure or a listing."""
    key = file.name if key is None else key
    try:
        if not store.exists(key):
            return None
        return file.load(store.read(key), store.key_url(key))
    except DraftdataError:
        return None


def refuse_unreadable(
    url: str, rows: int, rejected: int, example: str = "", *, empty_ok: bool = False
) -> None:
    """InputError (one line) for a dataset of which nothing could be read: every row rejected
    (a config file, a log, a JSON of another kind given where a dataset goes), or no row at all
    (EmptyInputError; ``open_dataset`` refuses an empty file before; ``empty_ok`` lets a run
    through: one that committed no completion still has its failures to show). ``stats``,
    ``report``, ``merge`` and ``tokenize`` refuse such an input alike."""
    if rows:
        return
    if not rejected:
        if empty_ok:
            return
        raise EmptyInputError(url, "give a run, prompts, tokenized parquet or conversations")
    what = "a YAML file, not a dataset; " if url.rstrip("/").endswith((".yaml", ".yml")) else ""
    raise InputError(
        f"{url}: {what}no readable rows ({rejected:,} rejected"
        + (f", e.g. {example}" if example else "")
        + "); give a run, prompts, tokenized parquet or conversations (JSONL, JSON or parquet)"
    )


def acceptance_json(url: str) -> Acceptance | None:
    """The acceptance measurement at ``url`` (a JSON file of format ``draftdata.acceptance/1``,
    or a folder holding ``acceptance.json``; local or ``s3://``), or None when it is not one."""
    if url.endswith(".json"):
        parent, _, key = url.rstrip("/").rpartition("/")
        root = parent or "."
    else:
        root, key = url, ACCEPTANCE_FILE
    try:
        store = open_store(root)
        if not store.exists(key):
            return None
        raw = store.read(key)
    except (DraftdataError, OSError):
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not (isinstance(doc, dict) and doc.get("format") == ACCEPTANCE_FORMAT):
        return None
    return read_acceptance(raw, url)
