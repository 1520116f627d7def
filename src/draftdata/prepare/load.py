"""Reading source rows lazily: local files and globs, s3:// URLs and Hugging Face hub ids.

``iter_rows(source)`` yields ``(row_index, row)`` where ``row`` is a decoded dict (or whatever
the line held) or a ``RowError`` (located ``file:line``) for a line that is not JSON / not text /
nested deeper than ``records.MAX_JSON_DEPTH``, so one bad line never stops a run; a UTF-8
byte-order mark at the start of a file is skipped. Memory stays bounded:

- JSONL (local or s3://) is read line by line, each line decoded on its own. We do this rather
  than hand JSONL to ``datasets``' json builder because that builder casts a whole chunk to one
  Arrow schema, so a single bad or oddly typed line fails the chunk instead of one row.
- Parquet (local or s3://) is read file by file with pyarrow, ``PARQUET_BATCH`` rows decoded at
  a time. (``datasets``' parquet streaming decodes a whole row group as one batch: a file
  written as one row group, pyarrow's default up to 1M rows, then sat in memory whole, and
  its per-row formatting cost ~9x pyarrow's ``to_pylist``.) Hub datasets go through
  ``datasets.load_dataset(..., streaming=True)``.
- A ``.json`` file holding one array (MetaMathQA ships so) is decoded into raw items first (its
  size in memory), then each item is decoded on its own; when the array does not decode as a
  whole, its elements are split by strings and bracket depth alone, so one bad element (bad
  JSON or UTF-8, a lone surrogate escape, too deep) is one RowError, not the whole file.

A source that cannot be opened at all raises InputError naming it. Nothing here adapts rows.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from draftdata.errors import InputError, RowError
from draftdata.prepare.config import SourceConfig
from draftdata.prepare.validate import BAD_JSON, UNDECODABLE_TEXT
from draftdata.records import BOM, JsonArraySplitter, decode_json_line, strip_bom

_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def _format_of(path: str, given: str | None) -> str:
    if given is not None:
        return given
    name = path.lower().removesuffix(".gz").removesuffix(".zst")
    for fmt in ("jsonl", "json", "parquet"):
        if name.endswith("." + fmt):
            return fmt
    if name.endswith(".ndjson"):
        return "jsonl"
    raise InputError(
        f"{path}: cannot tell the format from the name; set format: jsonl|json|parquet"
    )


def expand(source: SourceConfig) -> list[str]:
    """The concrete files of a path source: a glob is expanded and sorted; s3:// included."""
    assert source.path is not None
    path = source.path
    if path.startswith("s3://"):
        if not any(c in path for c in "*?["):
            return [path]
        try:
            import fsspec

            fs = fsspec.filesystem("s3")
            files = sorted("s3://" + p for p in fs.glob(path))
        except Exception as exc:  # any s3fs/botocore failure: the source is unreadable
            raise InputError(f"source {source.name}: cannot list {path} ({exc})") from exc
    elif any(c in path for c in "*?["):
        files = sorted(globlib.glob(path, recursive=True))
    else:
        if not Path(path).exists():
            raise InputError(f"source {source.name}: {path}: no such file")
        files = [path]
    if not files:
        raise InputError(f"source {source.name}: {path}: the pattern matches no file")
    return files


def _open(path: str) -> Any:
    if path.startswith("s3://") or path.endswith((".gz", ".zst")):
        import fsspec

        return fsspec.open(path, "rb", compression="infer").open()
    return Path(path).open("rb")


def _row(raw: bytes | msgspec.Raw, where: str) -> Any:
    """One decoded row, or a RowError saying where and why (no line can raise)."""
    try:
        return decode_json_line(bytes(raw))
    except ValueError as exc:
        reason = UNDECODABLE_TEXT if "UTF-8" in str(exc) else BAD_JSON
        return RowError(reason, f"{where}: {exc}")


def _jsonl(path: str) -> Iterator[Any]:
    with _open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if lineno == 1 and line.startswith(BOM):
                line = line[len(BOM) :]
            if line.strip():
                yield _row(line, f"{path}:{lineno}")


def _json_array(path: str) -> Iterator[Any]:
    with _open(path) as fh:
        data = strip_bom(fh.read())
    try:
        items: Iterable[Any] = _raw_list.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        # Not one clean array: when it opens like one, one bad element (bad JSON or UTF-8,
        # a lone surrogate escape, too deep for the decoder) is one reject, not the file.
        splitter = JsonArraySplitter(max_element=len(data))
        try:
            items = [*splitter.feed(data), *splitter.close()]
        except ValueError:
            what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise InputError(f"{path}: not a JSON array of rows ({what})") from exc
    for i, raw in enumerate(items):
        yield _row(b"" if raw is None else raw, f"{path}: element {i}")


def _streamed(dataset: Any) -> Iterator[Any]:
    yield from dataset


PARQUET_BATCH = 1024  # rows decoded at a time from a parquet file


def _parquet(files: list[str]) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for f in files:
        local = not f.startswith("s3://") and not f.endswith((".gz", ".zst"))
        with contextlib.nullcontext(f) if local else _open(f) as source:
            for batch in pq.ParquetFile(source).iter_batches(batch_size=PARQUET_BATCH):
                yield from batch.to_pylist()


def _hub(source: SourceConfig) -> Iterator[Any]:
    from datasets import load_dataset

    for split in source.split.split("+"):  # "os+db" reads several splits in turn
        ds = load_dataset(source.hub, name=source.hub_config, split=split, streaming=True)
        yield from _streamed(ds)


HUB_PROBE_TIMEOUT_S = 5.0


def check_hub_reachable(sources: list[SourceConfig], timeout: float = HUB_PROBE_TIMEOUT_S) -> None:
    """InputError at once when some source is a hub id and the Hugging Face hub
    (``$HF_ENDPOINT``, default https://huggingface.co) does not answer, instead of minutes of
    ``datasets``' retries per source. Any HTTP answer counts as reachable; nothing is
    downloaded. Skipped with ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` set (the local cache is
    then used)."""

    hub = [s for s in sources if s.hub is not None]
    if not hub:
        return
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    # in a daemon thread: a name lookup has no timeout of its own and may hang offline
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            request = urllib.request.Request(endpoint, method="HEAD")
            urllib.request.urlopen(request, timeout=timeout).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # it answered
        except (OSError, ValueError) as exc:
            outcome.append(exc)

    worker = threading.Thread(target=probe, name="hub-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    failure = outcome[0] if outcome else TimeoutError(f"no answer in {timeout:g} s")
    if failure is not None:
        reason = getattr(failure, "reason", None) or failure
        names = ", ".join(s.name for s in hub[:3]) + (" ..." if len(hub) > 3 else "")
        raise InputError(
            f"sources {names}: the Hugging Face hub ({endpoint}) cannot be reached ({reason}); "
            "download the datasets where there is network and point each source at local files "
            "with `path:` (jsonl, json or parquet; a glob or s3:// works) instead of `hub:`, or "
            "set HF_HUB_OFFLINE=1 to read the local datasets cache"
        ) from None


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _rows(source: SourceConfig) -> Iterator[Any]:
    if source.hub is not None:
        yield from _hub(source)
        return
    files = expand(source)
    formats = {_format_of(f, source.format) for f in files}
    if formats == {"parquet"}:
        yield from _parquet(files)
        return
    for f in files:
        fmt = _format_of(f, source.format)
        if fmt == "jsonl":
            yield from _jsonl(f)
        elif fmt == "json":
            yield from _json_array(f)
        else:
            yield from _parquet([f])


def iter_rows(source: SourceConfig) -> Iterator[tuple[int, Any]]:
    """Yield ``(row index, decoded row or RowError)`` for every row of ``source``, lazily.

    Row indices count from 0 over the whole source (all files of a glob, in sorted order);
    ``max_rows`` stops after that many. Failing to open or read the source is an InputError
    naming it; a bad line inside a readable file is a RowError row.
    """
    rows = _rows(source)
    index = 0
    while source.max_rows is None or index < source.max_rows:
        try:
            row = next(rows)
        except StopIteration:
            return
        except InputError:
            raise
        except Exception as exc:  # OSError, datasets/arrow/botocore errors: unreadable source
            where = source.path or source.hub
            raise InputError(
                f"source {source.name}: cannot read {where} ({type(exc).__name__}: {exc})"
            ) from exc
        yield index, row
        index += 1
