"""Reading a source's rows: local files and globs, s3:// URLs and Hugging Face hub ids.

``iter_rows(source)`` yields ``(row_index, row)`` where ``row`` is a decoded dict (or whatever
the line held) or a ``RowError`` located ``file:line`` (or ``file: element N``) for a row that
is not JSON, not text, too long or nested deeper than ``records.MAX_JSON_DEPTH``, so one bad
row never stops a run. The reading itself is ``draftdata.shared.readers``, the one reader stack
``stats`` reads every dataset with too: JSON text (JSON lines, or one array streamed element
by element; the content decides, not the name), parquet a batch at a time, hub datasets
streamed; ``.gz`` looked through. Memory holds a block of a file, never the file.

This module turns a source's config into the files to read (a glob expanded and sorted, an
``s3://`` URL opened through fsspec), checks once that the hub answers when a source needs it,
and names the source in every error. A source that cannot be opened at all raises InputError
naming it. Nothing here adapts rows.
"""

from __future__ import annotations

import glob as globlib
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from draftdata.errors import EmptyInputError, InputError, RowError
from draftdata.prepare.config import SourceConfig
from draftdata.shared.readers.base import Decoded, Reader, RowFile
from draftdata.shared.readers.files import FilesReader, format_of, holds_nothing
from draftdata.shared.readers.hub import HubReader


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


def _file(path: str) -> RowFile:
    if path.startswith("s3://"):

        def open_s3() -> IO[bytes]:
            import fsspec

            return fsspec.open(path, "rb").open()  # type: ignore[no-any-return]

        return RowFile(path, open_s3)
    return RowFile.local(path)


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


def reader(source: SourceConfig, progress: Callable[[int], None] | None = None) -> Reader[Any]:
    """The reader of ``source``'s rows (decoded, up to ``max_rows``); ``progress(rows read)``
    every few thousand rows and at the end."""
    kw: dict[str, Any] = {"limit": source.max_rows, "progress": progress}
    if source.hub is not None:
        return HubReader(source.hub, Decoded(), config=source.hub_config, split=source.split, **kw)
    files = [_file(f) for f in expand(source)]
    for f in files:  # every file's format known before any is read
        format_of(f.where, source.format)
    if all(holds_nothing(f, source.format) for f in files):  # stops at the first with rows
        raise empty_source(source)
    return FilesReader(files, Decoded(), format=source.format, **kw)


def empty_source(source: SourceConfig) -> EmptyInputError:
    """The line of a source that holds nothing (every command's ``EmptyInputError``)."""
    return EmptyInputError(
        f"source {source.name} ({source.path or source.hub})",
        "it would give no prompts: check its path, or remove the source",
    )


def iter_rows(
    source: SourceConfig, progress: Callable[[int], None] | None = None
) -> Iterator[tuple[int, Any]]:
    """Yield ``(row index, decoded row or RowError)`` for every row of ``source``, lazily.

    Row indices count from 0 over the whole source (all files of a glob, in sorted order);
    ``max_rows`` stops after that many. Failing to open or read the source is an InputError
    naming it; a bad row inside a readable file is a RowError row whose detail starts with
    where it is (``file:line: what``). ``progress(rows read)`` is called every few thousand
    rows and at the end.
    """
    rows = reader(source, progress).rows()
    while True:
        try:
            index, where, row = next(rows)
        except StopIteration:
            return
        except InputError as exc:
            text = str(exc)
            if text.startswith("source "):
                raise
            raise InputError(f"source {source.name}: {text}") from exc
        except Exception as exc:  # datasets, botocore, fsspec: unreadable source
            raise InputError(
                f"source {source.name}: cannot read {source.path or source.hub} "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        if isinstance(row, RowError):
            row = RowError(row.reason, f"{where}: {row.detail}")
        yield index, row
