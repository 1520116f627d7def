"""The row loop every reader shares, and what a reader reads: ``RowFile``.

A format's reader says only how to cut its files into raw rows (``FileReader.read_file``:
``(where, raw)`` pairs, where ``raw`` is one row's JSON bytes, an already decoded row, or a
``RowError`` for a row that cannot even be cut out). ``Reader.rows`` does the rest, the same
for every format:

- numbers the rows from 0 over all the files (rejected rows included, so a row's number never
  depends on what was wrong with the rows before it), skips the first ``skip`` and stops after
  ``limit``;
- turns each raw row into the caller's value with its ``Parse`` (``json`` for raw JSON bytes,
  ``row`` for a decoded row); a row the parse refuses is a ``RowError`` (reason code and what
  is wrong), located ``where`` (``file:line``, ``file: element 3``, ``file: row 7``);
- counts what it read (``read``) and rejected by reason (``rejected``) and calls ``progress``
  with the rows read every ``progress_every`` rows and once at the end.

``rows()`` yields rejected rows in their place (prepare writes its rejects in row order);
iterating the reader itself yields only the values and hands each rejected row to
``on_reject(where, error)``. A file that cannot be opened or read at all is an InputError
naming it; one bad row never stops the read. Memory holds one batch of rows, never a file.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Generic, Protocol, TypeVar

from draftdata.errors import InputError, RowError
from draftdata.records import BOM, decode_json_line

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# reason codes of the rows a reader rejects (prepare's REASONS holds them too)
BAD_JSON = "bad_json"
UNDECODABLE_TEXT = "undecodable_text"
TOO_LONG = "too_long"

PROGRESS_EVERY = 5_000  # rows between two progress calls

Progress = Callable[[int], None]  # rows read so far -> None
OnReject = Callable[[str, RowError], None]  # (where, the row's error) -> None


class Parse(Protocol[T_co]):
    """Raw rows -> the caller's values; a bad row raises RowError(reason, what is wrong)."""

    def json(self, raw: bytes, where: str) -> T_co:
        """One row of JSON text (a line, an array element), as its raw bytes."""
        ...

    def row(self, row: Any, where: str) -> T_co:
        """One row a format decodes itself (a parquet row, a hub row)."""
        ...


def decoded(raw: bytes) -> Any:
    """One row of JSON text decoded (``records.decode_json_line``); RowError ``bad_json``, or
    ``undecodable_text`` for bytes that are not UTF-8."""
    try:
        return decode_json_line(raw)
    except ValueError as exc:
        raise RowError(UNDECODABLE_TEXT if "UTF-8" in str(exc) else BAD_JSON, str(exc)) from exc


class Decoded:
    """The plain ``Parse``: every row as its decoded JSON value (a dict, for a good row)."""

    def json(self, raw: bytes, where: str) -> Any:
        """``decoded(raw)``."""
        return decoded(raw)

    def row(self, row: Any, where: str) -> Any:
        """The row as it is."""
        return row


@dataclass(frozen=True)
class RowFile:
    """One file to read: ``where`` names it in messages (a path or URL; its name tells the
    format and compression), ``open`` opens it for reading, ``path`` is a local path where
    there is one (parquet reads it in place)."""

    where: str
    open: Callable[[], IO[bytes]]
    path: str | None = None

    @classmethod
    def local(cls, path: str) -> RowFile:
        """A local file."""
        return cls(path, lambda: open(path, "rb"), path)


@contextlib.contextmanager
def open_bytes(file: RowFile) -> Iterator[IO[bytes]]:
    """``file`` opened for reading (``.gz`` decompressed), buffered with ``peek``, its
    byte-order mark skipped; InputError when it cannot be opened."""
    with contextlib.ExitStack() as stack:
        try:
            fh: IO[bytes] = stack.enter_context(file.open())
        except OSError as exc:
            raise InputError(f"{file.where}: cannot read ({exc.strerror or exc})") from exc
        if file.where.endswith(".gz"):
            fh = stack.enter_context(gzip.GzipFile(fileobj=fh, mode="rb"))  # type: ignore[arg-type]
        elif file.where.endswith(".zst"):
            fh = stack.enter_context(_zstd(fh, file.where))
        if not hasattr(fh, "peek"):
            fh = io.BufferedReader(fh)  # type: ignore[arg-type,type-var]
        if fh.peek(3)[:3] == BOM:  # type: ignore[attr-defined]
            fh.read(3)
        yield fh


def _zstd(fh: IO[bytes], where: str) -> IO[bytes]:
    try:
        zstandard = importlib.import_module("zstandard")  # optional: only .zst sources need it
    except ImportError:
        raise InputError(
            f"{where}: reading .zst needs the zstandard package (pip install zstandard), or "
            "decompress the file first"
        ) from None
    return zstandard.ZstdDecompressor().stream_reader(fh)  # type: ignore[no-any-return]


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), lazily."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _raise(where: str, err: RowError) -> None:
    raise InputError(f"{where}: {err.detail}")


class Reader(ABC, Generic[T]):
    """The row loop: numbering, skip, limit, parsing, rejects, counts and progress."""

    def __init__(
        self,
        parse: Parse[T],
        *,
        limit: int | None = None,
        skip: int = 0,
        progress: Progress | None = None,
        progress_every: int = PROGRESS_EVERY,
        on_reject: OnReject = _raise,
    ) -> None:
        self.parse = parse
        self.limit = limit
        self.skip = skip
        self.progress = progress
        self.progress_every = progress_every
        self.on_reject = on_reject
        self.read = 0  # rows read, rejected ones included (skipped ones not)
        self.rejected: Counter[str] = Counter()  # reason -> rows

    @abstractmethod
    def raw_rows(self) -> Iterator[tuple[str, Any]]:
        """(where, raw) of every row, in order: raw JSON bytes, a decoded row, or a RowError."""

    def rows(self) -> Iterator[tuple[int, str, T | RowError]]:
        """(row number, where, value or RowError) of every row, in order."""
        parse_json, parse_row = self.parse.json, self.parse.row
        every, progress, limit = self.progress_every, self.progress, self.limit
        index = -1
        for where, raw in self.raw_rows():
            index += 1
            if index < self.skip:
                continue
            if limit is not None and self.read >= limit:
                break
            self.read += 1
            if progress is not None and self.read % every == 0:
                progress(self.read)
            try:
                if type(raw) is bytes:
                    value: T | RowError = parse_json(raw, where)
                elif isinstance(raw, RowError):
                    raise raw
                else:
                    value = parse_row(raw, where)
            except RowError as err:
                self.rejected[err.reason] += 1
                value = err
            yield index, where, value
        if progress is not None:
            progress(self.read)

    def __iter__(self) -> Iterator[T]:
        for _, where, value in self.rows():
            if isinstance(value, RowError):
                self.on_reject(where, value)
            else:
                yield value


class FileReader(Reader[T]):
    """A reader over files, in the given order; a format says how to cut one file into rows."""

    def __init__(self, files: Sequence[RowFile], parse: Parse[T], **kw: Any) -> None:
        super().__init__(parse, **kw)
        self.files = list(files)

    @abstractmethod
    def read_file(self, file: RowFile) -> Iterator[tuple[str, Any]]:
        """(where, raw) of each row of ``file``."""

    def raw_rows(self) -> Iterator[tuple[str, Any]]:
        for file in self.files:
            try:
                yield from self.read_file(file)
            except InputError:
                raise
            except Exception as exc:  # OSError, arrow, S3: the file cannot be read on
                raise InputError(
                    f"{file.where}: cannot read ({type(exc).__name__}: {exc})"
                ) from exc
