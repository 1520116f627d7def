"""JSON text: a file of JSON lines, or one JSON array of rows, told apart by content.

A file whose first non-blank byte is ``[`` holds one array, unless its first line is a whole
JSON value with more lines after it (JSON lines whose first row is an array); anything else is
JSON lines, whatever the file's name says. Both are streamed, so memory holds one block of the
file, never the file:

- lines are read one at a time, each at most ``MAX_LINE_BYTES`` (a longer one is a ``too_long``
  reject and the rest of it is skipped unread);
- an array is read ``BLOCK`` bytes at a time. A block's whole elements are cut at the last
  ``},`` in it and decoded together by msgspec (C speed) when ``[`` + those bytes + ``]`` is a
  valid array: it can only be when the cut lies between two top-level elements, outside any
  string. Where it is not (a bad element, a cut inside a string, rows that are not objects),
  the rest of the array goes through ``records.JsonArraySplitter``, which tracks strings and
  bracket depth alone, so one bad element (bad JSON or UTF-8, a lone surrogate, too deep) is
  one reject, the elements after it are still read, and data after the closing bracket is one
  reject too, never silently dropped.

Each row's bytes are then decoded on their own by the caller's ``Parse``, a line and an array
element alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Any

import msgspec

from draftdata.errors import InputError, RowError
from draftdata.records import MAX_LINE_BYTES, JsonArraySplitter, decode_json_line
from draftdata.shared.readers.base import BAD_JSON, TOO_LONG, FileReader, RowFile, T, open_bytes

BLOCK = 1 << 20  # bytes of an array read at a time
MAX_ELEMENT = 256 << 20  # a longer array element is a reject, its bytes dropped as they are read
_PROBE = 1 << 20  # bytes of a first line read to tell JSON lines from a JSON array

_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def read_lines(fh: IO[bytes], on_bytes: Callable[[bytes], object] | None = None) -> Iterator[bytes]:
    """The lines of ``fh``, each read in at most MAX_LINE_BYTES + 1 bytes: a longer line yields
    only its first MAX_LINE_BYTES + 1 bytes (without its newline) and the rest is skipped, so
    one huge line cannot exhaust memory. ``on_bytes`` sees every byte read, in order (to hash
    a file while reading it)."""
    while line := fh.readline(MAX_LINE_BYTES + 1):
        if on_bytes is not None:
            on_bytes(line)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while rest := fh.readline(1 << 20):
                if on_bytes is not None:
                    on_bytes(rest)
                if rest.endswith(b"\n"):
                    break
        yield line


def _too_long(line: bytes) -> bool:
    return len(line) > MAX_LINE_BYTES and not line.endswith(b"\n")


def _json_lines_after_all(first: bytes, fh: IO[bytes]) -> bool:
    """Whether a file opening with ``[`` is JSON lines after all: its first line is a whole
    JSON value (an array row, a bad row) and more data follows it."""
    if not first.endswith(b"\n") or not fh.peek(4096)[:4096].strip():  # type: ignore[attr-defined]
        return False
    try:
        decode_json_line(first)
    except ValueError:
        return False
    return True


def json_rows(fh: IO[bytes], where: str) -> Iterator[tuple[str, bytes | RowError]]:
    """(where, raw bytes or RowError) of each row of JSON text ``fh`` (see the module)."""
    start = 1
    if fh.peek(64)[:64].lstrip().startswith(b"["):  # type: ignore[attr-defined]
        first = fh.readline(_PROBE)
        if not _json_lines_after_all(first, fh):
            yield from array_rows(fh, where, first)
            return
        start = 2
        yield f"{where}:1", first
    for lineno, line in enumerate(read_lines(fh), start=start):
        if _too_long(line):
            yield f"{where}:{lineno}", RowError(TOO_LONG, f"longer than {MAX_LINE_BYTES >> 20} MiB")
        elif line.strip():
            yield f"{where}:{lineno}", line


def _cuts(buf: bytearray) -> Iterator[tuple[int, int]]:
    """(end of a ``}``, the comma after it) for each ``}`` followed by a comma (blanks
    between allowed) in ``buf``, the last first."""
    end = len(buf)
    while (close := buf.rfind(b"}", 0, end)) != -1:
        after = close + 1
        while after < len(buf) and buf[after] in b" \t\r\n":
            after += 1
        if after < len(buf) and buf[after] == _COMMA:
            yield close + 1, after
        end = close


_COMMA = b","[0]
_TRIES = 8  # cuts tried in one block before the splitter cuts it


def _whole_elements(buf: bytearray) -> tuple[list[msgspec.Raw], int] | None:
    """The whole elements at the start of ``buf`` (which starts at a top-level element) and
    where the rest begins, when a cut near its end decodes as an array; else None."""
    for tried, (end, comma) in enumerate(_cuts(buf)):
        if tried == _TRIES:
            return None
        try:
            return _raw_list.decode(b"[" + buf[:end] + b"]"), comma + 1
        except (msgspec.DecodeError, RecursionError):
            continue  # a cut inside a string or an element, or a bad element before it
    return None


def _opened(fh: IO[bytes], where: str, head: bytes) -> bytearray:
    """What follows the array's opening bracket in ``head`` (then ``fh``)."""
    data = head.lstrip()
    while not data and (more := fh.read(BLOCK)):
        data = more.lstrip()
    if not data.startswith(b"["):
        raise InputError(f"{where}: expected a JSON array or JSON lines")
    return bytearray(data[1:])


def array_rows(fh: IO[bytes], where: str, head: bytes = b"") -> Iterator[tuple[str, Any]]:
    """(where, element bytes or RowError) of each element of the array that ``head`` and then
    ``fh`` hold: whole blocks at C speed, the splitter where they do not decode (see the
    module)."""
    buf = _opened(fh, where, head)
    index = 0
    while more := fh.read(BLOCK):
        buf += more
        whole = _whole_elements(buf)
        if whole is None:
            if len(buf) <= 2 * BLOCK:
                continue  # an element longer than a block, perhaps: read on
            splitter = JsonArraySplitter(max_element=MAX_ELEMENT)
            elements = splitter.feed(b"[" + buf)
            if splitter.closed or not elements:
                break  # the array ends here, or one huge element: the splitter reads on
            for raw in elements:
                yield f"{where}: element {index}", _element(raw)
                index += 1
            buf = bytearray(splitter.pending)
            continue
        items, rest = whole
        for raw in items:
            yield f"{where}: element {index}", bytes(raw)
            index += 1
        del buf[:rest]
    yield from _split(fh, where, bytes(buf), index)


def _element(raw: bytes | None) -> bytes | RowError:
    return raw if raw is not None else RowError(TOO_LONG, f"longer than {MAX_ELEMENT >> 20} MiB")


def _split(fh: IO[bytes], where: str, head: bytes, index: int) -> Iterator[tuple[str, Any]]:
    """The elements from element ``index`` on (``head``, then the rest of ``fh``), cut by
    ``JsonArraySplitter``; data after the closing bracket is one reject."""
    splitter = JsonArraySplitter(max_element=MAX_ELEMENT)
    chunk = b"[" + head
    while not splitter.closed:
        try:
            elements = splitter.feed(chunk) if chunk else splitter.close()
        except ValueError:
            raise InputError(f"{where}: expected a JSON array or JSON lines") from None
        for raw in elements:
            yield f"{where}: element {index}", _element(raw)
            index += 1
        if not chunk:
            return
        chunk = fh.read(BLOCK)
    rest = splitter.rest
    while not rest.strip() and (more := fh.read(BLOCK)):
        rest = more
    if rest.strip():
        after = f"{where}: after element {index - 1}"
        yield after, RowError(BAD_JSON, "data after the array's closing bracket")


class JsonReader(FileReader[T]):
    """Rows of JSON text files: JSON lines or one array each (see the module)."""

    def read_file(self, file: RowFile) -> Iterator[tuple[str, Any]]:
        with open_bytes(file) as fh:
            yield from json_rows(fh, file.where)
