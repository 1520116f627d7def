"""Merge inputs: open them, scan their keys (pass 1), and stream their rows again (pass 2).

Inputs are located and read by ``draftdata.stats.readers`` (the same readers ``stats`` uses,
so both count rows and domains the same way). Two families exist and one merge uses one:

- **samples**: tokenized parquet (``sample/1`` or foreign ``input_ids`` + ``loss_mask``);
  the content key is a hash of ``input_ids``; an empty domain is ``unknown``.
- **chat**: prompts JSONL, SpecForge/ShareGPT/OpenAI rows, generate runs; the content key is a
  hash of the normalised conversation (roles, whitespace-collapsed case-folded contents and
  reasoning, tool calls, tools); a row without a domain label is classified with
  ``draftdata.shared.domains.classify_domain``.

Pass 1 keeps only fixed-size keys per row, in numpy chunks (about 40 bytes a row), among them
each row's loss tokens (exact for samples; ``draftdata.shared.tokens`` for chat rows: the tokenizer
when given, else the estimate). Pass 2 reads the same files in the same order, so the n-th row
of pass 2 is the n-th row of pass 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from draftdata.errors import InputError
from draftdata.merge.plan import hash64
from draftdata.records import normalise_text
from draftdata.shared.conversation import Conversation
from draftdata.shared.domains import classify_domain
from draftdata.shared.readers.base import batches
from draftdata.shared.tokens import conversation_tokens, counter
from draftdata.stats.readers import (
    Dataset,
    iter_conversations,
    iter_sample_batches,
    open_dataset,
)
from draftdata.store.lease import refuse_live_writer
from draftdata.support.workerpool import worker_pool

Family = Literal["samples", "chat"]
UNKNOWN = "unknown"
_CHUNK = 65536
_CHAT_CHUNK = 2048
_json = msgspec.json.Encoder()
_COPY_ENDING = re.compile(r"(~+)r[0-9]+\Z")  # the ending of an upsampled copy's id


@dataclass
class Keys:
    """Pass-1 keys of every row of all inputs, in read order (numpy chunks until ``freeze``)."""

    id_hash: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    content_hash: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    domain: list[npt.NDArray[np.int32]] = field(default_factory=list)
    size: list[npt.NDArray[np.int64]] = field(default_factory=list)  # estimated output bytes
    valid: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    loss: list[npt.NDArray[np.int64]] = field(default_factory=list)  # loss tokens
    domains: dict[str, int] = field(default_factory=dict)  # domain name -> code
    # the longest run of ``~`` before an ``r<digits>`` ending of any input id: upsampled copies
    # are named with one ``~`` more (``copy_suffix``), so no copy can take a real row's id
    copy_tildes: int = 0

    def see_ids(self, ids: list[str]) -> None:
        """Note the ids' ``~...~r<digits>`` endings (``copy_tildes``)."""
        for i in ids:
            if "~" in i and (m := _COPY_ENDING.search(i)) is not None:
                self.copy_tildes = max(self.copy_tildes, len(m.group(1)))

    @property
    def copy_suffix(self) -> str:
        """What stands between a row's id and its copy number K in the id of its K-th copy
        (``~r``, unless some input id already ends ``~r<digits>``: then ``~~r``, and so on)."""
        return "~" * (self.copy_tildes + 1) + "r"

    def code(self, name: str) -> int:
        """The code of domain ``name`` (assigned in first-seen order)."""
        c = self.domains.get(name)
        if c is None:
            c = self.domains[name] = len(self.domains)
        return c

    def append(
        self,
        ids: list[int],
        contents: list[int],
        domains: list[int],
        sizes: list[int],
        loss: list[int],
        valid: list[bool] | None = None,
    ) -> None:
        """Add one chunk of rows."""
        self.id_hash.append(np.asarray(ids, dtype=np.uint64))
        self.content_hash.append(np.asarray(contents, dtype=np.uint64))
        self.domain.append(np.asarray(domains, dtype=np.int32))
        self.size.append(np.asarray(sizes, dtype=np.int64))
        self.loss.append(np.asarray(loss, dtype=np.int64))
        n = len(ids)
        self.valid.append(np.ones(n, dtype=bool) if valid is None else np.asarray(valid, bool))


@dataclass
class InputInfo:
    """One input as read: where, its role, its rows and rows per domain, bad rows skipped."""

    role: str
    path: str
    dataset: Dataset
    rows: int = 0
    by_domain: Counter[str] = field(default_factory=Counter)
    bad: int = 0
    first_row: int = 0  # global index of its first row
    scanned: int = 0  # rows it holds in the global index (bad tokenized rows included)
    dropped: dict[str, int] = field(default_factory=dict)  # duplicates found in this input


def family_of(ds: Dataset) -> Family:
    """``samples`` for tokenized datasets, ``chat`` for every conversation-shaped kind."""
    return "samples" if ds.kind == "tokenized" else "chat"


def open_inputs(inputs: list[tuple[str, str]]) -> tuple[list[InputInfo], Family]:
    """Open every (role, location); InputError if they mix tokenized and chat-shaped data."""
    infos = [InputInfo(role, path, open_dataset(path)) for role, path in inputs]
    families = {family_of(i.dataset) for i in infos}
    if len(families) > 1:
        kinds = ", ".join(f"{i.path} ({i.dataset.kind})" for i in infos)
        raise InputError(
            f"merge: inputs mix tokenized samples and chat rows ({kinds}); merge tokenized "
            "with tokenized (tokenize the chat data first) or chat with chat"
        )
    for i in infos:
        if i.dataset.is_run:  # a moving run is not merged as if it were whole
            refuse_live_writer(i.dataset.store, "merge")
        if i.dataset.kind == "run" and not i.dataset.keys:
            raise InputError(f"{i.path}: the run has no committed completions yet")
    return infos, families.pop()


# ---------------------------------------------------------------------------------------------
# Content keys


def conversation_hash(conv: Conversation) -> int:
    """64-bit hash of a normalised conversation: roles, contents, reasoning, tool calls, tools."""
    h = hashlib.blake2b(digest_size=8)
    for m in conv.messages:
        h.update(m.role.encode())
        h.update(b"\x00")
        h.update(normalise_text(m.content or "").encode())
        h.update(b"\x01")
        if m.reasoning_content:
            h.update(normalise_text(m.reasoning_content).encode())
        h.update(b"\x01")
        if m.tool_calls:
            h.update(_json.encode(m.tool_calls))
        h.update(b"\x02")
    if conv.tools:
        h.update(_json.encode(conv.tools))
    return int.from_bytes(h.digest(), "little")


def _token_lists(col: pa.ChunkedArray | pa.Array) -> pa.ListArray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.type != pa.list_(pa.int32()):
        arr = pc.cast(arr, pa.list_(pa.int32()))
    return arr


def _digests(pieces: Iterator[bytes | memoryview]) -> npt.NDArray[np.uint64]:
    # 8-byte BLAKE2b digests of many pieces, read back as one little-endian uint64 array
    b2 = hashlib.blake2b
    joined = b"".join([b2(p, digest_size=8).digest() for p in pieces])
    return np.frombuffer(joined, dtype="<u8").astype(np.uint64)


def _loss_tokens(table: pa.Table) -> npt.NDArray[np.int64]:
    """Loss tokens per sample row: ``num_loss_tokens``, else the sum of ``loss_mask``."""
    if "num_loss_tokens" in table.column_names:
        col = pc.fill_null(table.column("num_loss_tokens").combine_chunks(), 0)
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
    if "loss_mask" not in table.column_names:
        return np.zeros(table.num_rows, dtype=np.int64)
    mask = _token_lists(table.column("loss_mask"))
    offsets = np.asarray(mask.offsets.to_numpy(), dtype=np.int64)
    offsets -= offsets[0]  # flatten() starts at the array's first value, slices included
    values = np.asarray(mask.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    sums = np.zeros(len(offsets) - 1, dtype=np.int64)
    nz = np.diff(offsets) > 0
    if values.size and nz.any():
        sums[nz] = np.add.reduceat(values, offsets[:-1][nz])
    return sums


def _sample_chunk(table: pa.Table, keys: Keys) -> Counter[str]:
    n = table.num_rows
    id_col = pc.fill_null(table.column("id").combine_chunks().cast(pa.string()), "")
    ids: list[str] = id_col.to_pylist()
    lists = _token_lists(table.column("input_ids"))
    offsets = np.asarray(lists.offsets.to_numpy(), dtype=np.int64)
    values = lists.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    raw = memoryview(values.tobytes())
    valid = ~lists.is_null().to_numpy(zero_copy_only=False)
    valid &= pc.binary_length(id_col).to_numpy(zero_copy_only=False) > 0
    starts, ends = (4 * offsets[:-1]).tolist(), (4 * offsets[1:]).tolist()
    keys.see_ids(ids)
    id_h = _digests(s.encode() for s in ids)
    c_h = _digests(raw[a:b] for a, b in zip(starts, ends, strict=True))
    id_h[~valid] = 0
    c_h[~valid] = 0
    labels = pc.fill_null(table.column("domain").combine_chunks().cast(pa.string()), "")
    encoded = labels.dictionary_encode()
    names = [v or UNKNOWN for v in encoded.dictionary.to_pylist()]
    to_code = np.asarray([keys.code(v) for v in names], dtype=np.int32)
    index = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    codes = to_code[index] if n else np.zeros(0, np.int32)
    sizes = 5 * np.diff(offsets) + 64 + pc.binary_length(id_col).to_numpy(zero_copy_only=False)
    keys.loss.append(_loss_tokens(table))
    keys.id_hash.append(id_h)
    keys.content_hash.append(c_h)
    keys.domain.append(codes.astype(np.int32))
    keys.size.append(sizes.astype(np.int64))
    keys.valid.append(valid.astype(bool))
    found = np.bincount(index[valid], minlength=len(names))
    seen: Counter[str] = Counter()
    for i, name in enumerate(names):
        if found[i]:
            seen[name] += int(found[i])
    return seen


def _classifier() -> Callable[..., str]:

    return classify_domain


def resolved_domain(conv: Conversation, classify: Callable[..., str]) -> str:
    """A conversation's domain: its label, else the classifier's answer."""
    return conv.domain or classify(conv.messages, conv.tools)


ChatKeys = tuple[list[str], list[int], list[int], list[int]]


def chat_keys(convs: list[Conversation], tokenizer: str | None = None) -> ChatKeys:
    """(domain, content hash, size estimate, loss tokens) of each conversation: the costly part
    of pass 1 (the classifier, the token count), done in chunks so it can run in worker
    processes. ``tokenizer``: a folder whose tokenizer counts the tokens (else estimated)."""

    classify = _classifier()
    _, loss = conversation_tokens([(c.messages, c.tools) for c in convs], counter(tokenizer))
    return (
        [resolved_domain(c, classify) for c in convs],
        [conversation_hash(c) for c in convs],
        [c.char_counts()[0] + 64 * len(c.messages) + 128 for c in convs],
        loss.tolist(),
    )


_conversations = msgspec.msgpack.Decoder(list[Conversation])


def _chat_keys_packed(blob: bytes, tokenizer: str | None) -> ChatKeys:
    # worker entry point: conversations travel as msgpack (faster than pickling structs)
    return chat_keys(_conversations.decode(blob), tokenizer)


class Workers:
    """An optional pool of ``n`` spawned processes for ``chat_keys``; ``n <= 1`` runs inline.

    Chunks are submitted with at most ``2 n`` in flight and consumed in submission order, so
    results (and memory) do not depend on the number of workers. The processes end with this
    one, whatever signal ends it (``draftdata.support.workerpool``).
    """

    def __init__(self, n: int, tokenizer: str | None = None) -> None:
        self.n = n
        self.tokenizer = tokenizer
        self._pool: ProcessPoolExecutor | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pool = None
        self._stack.__exit__(*exc)

    def map(
        self, chunks: Iterator[list[Conversation]]
    ) -> Iterator[tuple[list[Conversation], ChatKeys]]:
        """(chunk, chat_keys(chunk)) for every chunk, in order."""
        if self.n <= 1:
            for chunk in chunks:
                yield chunk, chat_keys(chunk, self.tokenizer)
            return
        if self._pool is None:
            self._pool = self._stack.enter_context(worker_pool(self.n))
        window: deque[tuple[list[Conversation], Future[ChatKeys]]] = deque()
        for chunk in chunks:
            blob = msgspec.msgpack.encode(chunk)
            window.append((chunk, self._pool.submit(_chat_keys_packed, blob, self.tokenizer)))
            if len(window) >= 2 * self.n:
                done, fut = window.popleft()
                yield done, fut.result()
        while window:
            done, fut = window.popleft()
            yield done, fut.result()


def scan(
    info: InputInfo,
    family: Family,
    keys: Keys,
    on_bad: Callable[[str, str], None],
    progress: Callable[[str, int], None] | None = None,
    workers: Workers | None = None,
) -> None:
    """Pass 1 over one input: append its rows' keys to ``keys`` and count its domains.

    Chat rows are classified and hashed by ``workers`` (inline when None).
    """
    info.first_row = sum(len(a) for a in keys.id_hash)
    if family == "samples":
        cols = ["id", "domain", "input_ids", "num_loss_tokens"]
        n = 0
        for where, table in iter_sample_batches(
            info.dataset, columns=cols, batch_rows=_CHUNK, instead={"num_loss_tokens": "loss_mask"}
        ):
            if "id" not in table.column_names or "input_ids" not in table.column_names:
                raise InputError(f"{where}: tokenized rows need 'id' and 'input_ids' columns")
            if "domain" not in table.column_names:
                table = table.append_column("domain", pa.array([""] * table.num_rows))
            seen = _sample_chunk(table, keys)
            info.by_domain.update(seen)
            missing = table.num_rows - sum(seen.values())
            info.bad += missing
            if missing:
                on_bad(where, f"{missing} row(s) without an id or input_ids")
            n += table.num_rows
            if progress:
                progress(info.path, n)
        info.rows = sum(info.by_domain.values())
        info.scanned = n
        return

    def bad(where: str, reason: str) -> None:
        info.bad += 1
        on_bad(where, reason)

    pool = workers or Workers(1)
    chunks = batches(iter_conversations(info.dataset, bad), _CHAT_CHUNK)
    for chunk, (domains, contents, sizes, loss) in pool.map(chunks):
        info.by_domain.update(domains)
        keys.see_ids([c.id for c in chunk])
        keys.append(
            [hash64(c.id.encode()) for c in chunk],
            contents,
            [keys.code(d) for d in domains],
            sizes,
            loss,
        )
        if progress:
            progress(info.path, sum(info.by_domain.values()))
    info.rows = info.scanned = sum(info.by_domain.values())


# ---------------------------------------------------------------------------------------------
# Pass 2


def iter_sample_tables(info: InputInfo, batch_rows: int = _CHUNK) -> Iterator[pa.Table]:
    """Pass 2 over a tokenized input: ``SAMPLE_SCHEMA`` tables of ``batch_rows``, in order."""
    for _, table in iter_sample_batches(info.dataset, batch_rows=batch_rows):
        yield table


def iter_chat_rows(info: InputInfo) -> Iterator[Conversation]:
    """Pass 2 over a chat input: its conversations in read order (bad rows skipped again)."""

    def ignore(where: str, reason: str) -> None:
        return None

    yield from iter_conversations(info.dataset, ignore)
