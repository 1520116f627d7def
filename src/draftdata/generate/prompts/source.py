"""The prompts a run answers: which files, their identity, and a lazy, filtered reader.

``--prompts`` names a JSONL file, or a directory (``prepare``'s output: its
``prompts-*.jsonl`` shards, else every ``*.jsonl`` but ``rejects.jsonl``, in name order), local
or on S3 (``s3://BUCKET/KEY.jsonl`` or ``s3://BUCKET/PREFIX/``, read in ranged GETs).
``scan`` reads the files once without parsing prompts: a sha256 over their bytes (the prompts'
identity in the run manifest, so a resumed run cannot silently answer other prompts) and the
number of prompts in scope (``limit``, ``partition``) for the progress total. ``PromptReader``
then yields validated prompts lazily, in file order; memory does not grow with the file.

A line that does not validate is reported (file:line: what is wrong) and skipped, never fatal:
``prepare`` already validated its output, and one bad line must not stop a day-long run. No
line can end the reader: invalid JSON or UTF-8, any shape, nesting of any depth (a reject past
``records.MAX_JSON_DEPTH``); a byte-order mark at the start of a file is skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterator, Sequence
from fnmatch import fnmatch
from itertools import islice
from pathlib import Path

import msgspec

from draftdata.errors import EmptyInputError, InputError, StoreError
from draftdata.generate.prompts.partition import Partition, parse_partition
from draftdata.records import BOM, Prompt, derived_id_fault, parse_prompt, prompt_id
from draftdata.shared.readers.base import RowFile
from draftdata.shared.readers.files import holds_nothing
from draftdata.shared.readers.jsontext import read_lines
from draftdata.store.doneset import DoneSet
from draftdata.store.opener import open_store
from draftdata.store.prompts import iter_prompt_lines, open_prompt_file

PromptFile = Path | str  # a local file, or an s3://BUCKET/KEY object URL (kept a str)


def prompt_files(path: str) -> list[PromptFile]:
    """The JSONL files behind ``--prompts`` (InputError when there are none): a file or a
    directory, local or an s3:// object or prefix. EmptyInputError when they hold nothing
    (``readers.files.holds_nothing``, the decision every command shares): generate, its pilot
    and acceptance refuse an empty input here, before any request."""
    files = _find(path)
    if all(holds_nothing(_row_file(f), "jsonl") for f in files):  # stops at the first with rows
        raise EmptyInputError(f"--prompts {path}", "give a prompts JSONL (prepare's output folder)")
    return files


def _row_file(f: PromptFile) -> RowFile:
    return RowFile(str(f), lambda: open_prompt_file(f))


def _find(path: str) -> list[PromptFile]:
    if path.startswith(("http://", "https://")):
        raise InputError(f"--prompts {path}: read prompts from a file, a directory or s3://")
    if path.startswith("s3://"):
        return _s3_prompt_files(path)
    p = Path(path)
    if p.is_dir():
        files = _pick([f.name for f in p.iterdir() if f.is_file()])
        if not files:
            raise InputError(f"--prompts {path}: the directory holds no *.jsonl file")
        return [p / f for f in files]
    if not p.is_file():
        raise InputError(f"--prompts {path}: no such file or directory")
    return [p]


def _pick(names: list[str]) -> list[str]:
    """prepare's ``prompts-*.jsonl`` shards, else every ``*.jsonl`` but ``rejects.jsonl``."""
    shards = sorted(n for n in names if fnmatch(n, "prompts-*.jsonl"))
    return shards or sorted(n for n in names if n.endswith(".jsonl") and n != "rejects.jsonl")


def _s3_prompt_files(url: str) -> list[PromptFile]:

    base = url.rstrip("/")
    try:
        names = [k for k in open_store(base).list("") if "/" not in k]
        if files := _pick(names):
            return [f"{base}/{f}" for f in files]
        parent, _, name = base.rpartition("/")
        if name and not url.endswith("/") and open_store(parent).exists(name):
            return [base]
    except StoreError as exc:
        raise InputError(f"--prompts {url}: cannot list ({exc})") from exc
    raise InputError(f"--prompts {url}: no such object, and no *.jsonl under that prefix")


def _name(f: PromptFile) -> str:
    return f.name if isinstance(f, Path) else f.rpartition("/")[2]


Line = tuple[PromptFile, int, bytes]  # (file, 1-based line number, raw line)
BLOCK = 4096  # lines read, and looked up in the done-set, at a time ...
BLOCK_BYTES = 4 << 20  # ... or fewer, when they hold this many bytes (long prompts)


class Scan(msgspec.Struct, kw_only=True, frozen=True):
    """What one pass over the prompt files found."""

    sha256: str
    bytes: int
    prompts: int  # non-blank lines in all files
    in_scope: int  # of those, within limit and partition


def scan(files: list[PromptFile], *, limit: int | None, partition: Partition | None) -> Scan:
    """Hash the files and count the prompts in scope (ids only; malformed lines count)."""
    h = hashlib.sha256()
    size = lines = in_scope = 0

    def feed(chunk: bytes) -> None:  # every byte read, a huge line's skipped rest included
        nonlocal size
        h.update(chunk)
        size += len(chunk)

    for f in files:
        h.update(_name(f).encode() + b"\x00")  # the name, not the location: a copy is the same
        with open_prompt_file(f) as fh:
            for lineno, line in enumerate(read_lines(fh, on_bytes=feed), start=1):
                if not (line[3:] if lineno == 1 and line.startswith(BOM) else line).strip():
                    continue
                lines += 1
                if limit is not None and lines > limit:
                    continue
                if partition is not None and partition.count > 1:
                    pid = prompt_id(line)
                    if not pid or not partition.contains(pid):
                        continue
                in_scope += 1
    return Scan(sha256=h.hexdigest(), bytes=size, prompts=lines, in_scope=in_scope)


class PromptReader:
    """Validated prompts of the files in order, within ``limit`` and ``partition`` (and, with
    ``only``, among those ids: a pilot's sample, ``pilot.py``)."""

    def __init__(
        self,
        files: list[PromptFile],
        *,
        limit: int | None = None,
        partition: str | Partition | None = None,
        on_invalid: Callable[[str], None] | None = None,
        on_reject: Callable[[str, bytes], None] | None = None,
        settled: Callable[[list[str]], Sequence[int]] | None = None,
        only: Container[str] | None = None,
    ) -> None:
        self.files = files
        self.only = only  # ids to answer (a pilot's sample); others are out of scope
        self.on_reject = on_reject
        # ``settled(ids)``: for each id, how many samples of the prompt are settled when ALL are
        # (else 0). Such lines are skipped on an id-only decode, before the full parse, and the
        # done-set is asked a block of ids at a time: on resume most of a big file is settled,
        # and a per-line lookup or the full parse would be most of the cost of reading it.
        self.settled = settled
        self.settled_samples = 0
        self.limit = limit
        self.partition = parse_partition(partition) if isinstance(partition, str) else partition
        self.on_invalid = on_invalid
        self.invalid = 0
        self.duplicates = 0  # lines whose id an earlier line in scope holds (rejected)
        self.read = 0
        # the ids in scope so far (64-bit hashes: 8 bytes each), so a second line with an id
        # is rejected as ``duplicate_id`` rather than dropped without a word; settled lines
        # count too, so a resumed command rejects the same lines as the first
        self._seen = DoneSet()
        self._it = self._iter()
        self.exhausted = False

    def _blocks(self) -> Iterator[list[Line]]:
        """The non-blank lines within ``limit`` as (file, line number, raw), BLOCK at a time
        (fewer once they hold BLOCK_BYTES: the block is read ahead of dispatch too)."""
        lines: Iterator[Line] = (
            (f, lineno, line) for f in self.files for lineno, line in iter_prompt_lines(f)
        )
        if self.limit is not None:
            lines = islice(lines, self.limit)
        block: list[Line] = []
        size = 0
        for item in lines:
            block.append(item)
            size += len(item[2])
            if len(block) >= BLOCK or size >= BLOCK_BYTES:
                yield block
                block, size = [], 0
        if block:
            yield block

    def _to_parse(self, block: list[Line]) -> list[Line]:
        """``block`` without the lines that the id alone rules out: another partition's, and
        settled prompts (a line without a readable id stays, for the parse to report)."""
        part = self.partition if self.partition is not None and self.partition.count > 1 else None
        if self.settled is None and part is None and self.only is None:
            return block
        pids = [prompt_id(line) for _, _, line in block]
        skip: set[int] = set()
        if part is not None:
            skip = {i for i, pid in enumerate(pids) if pid and not part.contains(pid)}
        if self.only is not None:  # out of the sample: out of scope, like another partition
            only = self.only
            skip |= {i for i, pid in enumerate(pids) if pid not in only}
        if self.settled is not None:
            asked = [i for i, pid in enumerate(pids) if pid and i not in skip]
            for i, done in zip(asked, self.settled([pids[i] for i in asked]), strict=True):
                if done:
                    skip.add(i)
                    f, lineno, line = block[i]
                    if self._first(pids[i], f"{f}:{lineno}", line):
                        self.settled_samples += int(done)
        return [item for i, item in enumerate(block) if i not in skip] if skip else block

    def _reject(self, message: str, line: bytes) -> None:
        self.invalid += 1
        if self.on_invalid is not None:
            self.on_invalid(message)
        if self.on_reject is not None:
            self.on_reject(message, line)

    def _first(self, pid: str, where: str, line: bytes) -> bool:
        """Whether ``pid`` is met for the first time in scope; else the line is rejected."""
        if self._seen.add(pid):
            return True
        self.duplicates += 1
        self._reject(
            f"{where}: duplicate_id: id {pid!r} is held by an earlier line (each prompt id "
            "is answered once; give the prompts distinct ids)",
            line,
        )
        return False

    def _iter(self) -> Iterator[tuple[Prompt, int]]:
        for block in self._blocks():
            self.read += len(block)
            for f, lineno, line in self._to_parse(block):
                try:
                    prompt = parse_prompt(line, f"{f}:{lineno}")
                except InputError as exc:
                    self._reject(str(exc), line)
                    continue
                if (fault := derived_id_fault(prompt.id)) is not None:
                    self._reject(f"{f}:{lineno}: {fault}", line)
                    continue
                if self._first(prompt.id, f"{f}:{lineno}", line):
                    yield prompt, len(line)  # in the partition: _to_parse judged its id

    def take(self, k: int) -> list[Prompt]:
        """Up to ``k`` more prompts (fewer at the end; ``exhausted`` is then True)."""
        return [p for p, _ in self.take_sized(k)]

    def take_sized(self, k: int, max_bytes: int | None = None) -> list[tuple[Prompt, int]]:
        """Up to ``k`` more prompts with their lines' sizes in bytes, fewer once they hold
        ``max_bytes`` (at least one; fewer at the end: ``exhausted`` is then True)."""
        out: list[tuple[Prompt, int]] = []
        size = 0
        for prompt, nbytes in self._it:
            out.append((prompt, nbytes))
            size += nbytes
            if len(out) >= k or (max_bytes is not None and size >= max_bytes):
                return out
        self.exhausted = True
        return out
