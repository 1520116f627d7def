"""``tokenize(config)``: a run's completions -> tokenized sample shards + ``summary.json``.

Reads ``<run>/completions/part-*.parquet`` shard by shard, in record batches of
``config.batch_rows`` completions (memory is one batch per worker, whatever the run's size),
sends each batch through ``batch.tokenize_table`` and writes each batch's samples as one
create-only parquet shard ``<out>/<input shard stem>-b<batch>.parquet`` through the store
(local or ``s3://``). Conversation files (an existing training set: SpecForge, ShareGPT or
OpenAI rows) go the same way file by file, each row a view of a completion
(``conversations.py``), so both sets are tokenized by one rule. The names and bytes depend
only on the inputs and settings, so a killed run reruns cleanly (identical shards are accepted
as done) and a rerun with other settings into the same ``--out`` is refused before any work.

``--workers N`` > 1 tokenizes input shards in N spawned processes (each loads the tokenizer
once; the Rust tokenizer's threads are shared out between them); with 1 the tokenizer's own
threads do the parallel part. The summary (token totals per domain, drop reasons, verified /
mismatched counts and the first mismatches) is written last as ``<out>/summary.json``; before
the first shard ``<out>/tokenize_config.json`` (the settings) marks the output as a tokenize
output, so readers refuse it until the summary is there.

It does not render or encode by itself (``encode.py``) and does not print (``summary.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from draftdata.errors import AlreadyExistsError, ConfigError, InputError
from draftdata.shared.formats import (
    COMPLETION_FORMAT,
    RUN_MANIFEST,
    TOKENIZE_CONFIG,
    TOKENIZE_SUMMARY,
    check_format,
)
from draftdata.stats.models import run_models
from draftdata.stats.readers import DATA_EXT, Kind, open_dataset
from draftdata.store.base import Store, normalise_url
from draftdata.store.doneset import DoneSet, hash_pairs
from draftdata.store.lease import refuse_live_writer
from draftdata.store.opener import open_store
from draftdata.store.protect import check_not_protected
from draftdata.store.quarantine import read_error
from draftdata.store.read import COMPLETIONS_PREFIX, parquet_file, read_shards_parallel, shard_keys
from draftdata.store.settings import recorded_settings
from draftdata.store.write import write_parquet_shard
from draftdata.support.workerpool import interrupts, worker_pool
from draftdata.tokenize import conversations
from draftdata.tokenize.config import TokenizeConfig, TokenizeSummary
from draftdata.tokenize.encode import (
    COMPLETION_COLUMNS,
    Counters,
    TokenizeContext,
    tokenize_table,
    tokenize_views,
)


def output_key(shard_key: str, batch: int) -> str:
    """The output shard name of batch ``batch`` of completions shard ``shard_key``."""
    stem = shard_key.rsplit("/", 1)[-1].removesuffix(".parquet")
    return f"{stem}-b{batch:04d}.parquet"


def iter_shard_batches(store: Store, key: str, rows: int) -> Iterator[pa.Table]:
    """The completions of one shard in tables of at most ``rows`` rows (format checked)."""
    where = store.key_url(key)
    pf = parquet_file(store, key)
    check_format(pf.schema_arrow, COMPLETION_FORMAT, where)
    columns = [c for c in COMPLETION_COLUMNS if c in pf.schema_arrow.names]
    try:
        for batch in pf.iter_batches(batch_size=rows, columns=columns):
            yield pa.Table.from_batches([batch])
    except (OSError, pa.ArrowException) as exc:
        raise read_error(store, key, exc) from exc


def tokenize_shard(
    ctx: TokenizeContext,
    run: Store,
    out: Store,
    key: str,
    rows: int,
    kind: str = "run",
    skip: Sequence[int] = (),
) -> tuple[Counters, list[str]]:
    """Tokenize one completions shard (``kind`` run), or one conversation file (``kind``
    conversations or prompts), into output shards; returns its counters and keys.

    ``skip``: indexes of a shard's rows that are duplicates (``duplicate_rows``), left out and
    counted as ``duplicates`` (completions, not samples: never part of the dropped share)."""
    counters = Counters()
    written: list[str] = []
    for i, (samples, c) in enumerate(_input_batches(ctx, run, key, rows, kind, skip)):
        counters.merge(c)
        stop_if_foreign(counters, ctx.tokenizer_path, run.key_url(key))
        if samples.num_rows == 0:
            continue
        name = output_key(key, i) if kind == "run" else conversations.output_key(key, i)
        try:
            write_parquet_shard(out, name, samples)
        except AlreadyExistsError as exc:
            raise AlreadyExistsError(
                f"{out.key_url(name)} exists with other samples (tokenized with other "
                "settings or inputs); choose another --out"
            ) from exc
        written.append(name)
    return counters, written


def _input_batches(
    ctx: TokenizeContext, store: Store, key: str, rows: int, kind: str, skip: Sequence[int] = ()
) -> Iterator[tuple[pa.Table, Counters]]:
    if kind == "run":
        dropped = np.asarray(sorted(skip), dtype=np.int64)
        start = 0
        for table in iter_shard_batches(store, key, rows):
            gone = 0
            if len(dropped):
                keep = ~np.isin(np.arange(start, start + table.num_rows), dropped)
                start += table.num_rows
                gone = int((~keep).sum())
                if gone:
                    table = table.filter(pa.array(keep))
            samples, c = tokenize_table(table, ctx)
            if gone:
                c.add("duplicates", gone)  # completions, like export's duplicates_dropped
            yield samples, c
        return
    if kind not in conversations.CHAT_KINDS:
        raise ConfigError(f"tokenize: input kind {kind!r}; expected run, conversations or prompts")
    chat_kind: Kind = "prompts" if kind == "prompts" else "conversations"
    for views, extra in conversations.iter_view_batches(store, key, chat_kind, rows):
        samples, c = tokenize_views(views, ctx)
        c.counts.update(extra)
        yield samples, c


# -- worker processes ------------------------------------------------------------------------------

_worker: dict[str, Any] = {}


def _init_worker(config: TokenizeConfig, threads: int) -> None:
    # Before the tokenizers library starts its thread pool in this process.
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    _worker["ctx"] = TokenizeContext.from_config(config)
    _worker["run"], _, _worker["kind"] = locate_input(config.run)
    _worker["out"] = open_store(config.out_url, protect=config.protect)
    _worker["rows"] = config.batch_rows


def _work(key: str, skip: list[int]) -> tuple[Counters, list[str]]:
    w = _worker
    return tokenize_shard(w["ctx"], w["run"], w["out"], key, w["rows"], w["kind"], skip)


def duplicate_rows(run: Store, keys: list[str]) -> dict[str, list[int]]:
    """Row indexes, per shard, of the completions whose (id, sample) an earlier row holds (in
    shard order: a copied shard). Export and stats keep the first copy of a pair; tokenize
    leaves the others out too. Reads only the id and sample columns."""
    seen = DoneSet()
    skip: dict[str, list[int]] = {}
    tables = read_shards_parallel(run, keys, COMPLETION_FORMAT, ["id", "sample"])
    for key, table in zip(keys, tables, strict=True):
        ids = table.column("id").to_pylist()
        samples = [int(s or 0) for s in table.column("sample").to_pylist()]
        first = seen.first_seen(hash_pairs(ids, samples))
        if not first.all():
            skip[key] = np.flatnonzero(~first).tolist()
    return skip


# -- the stage -------------------------------------------------------------------------------------


def history_policy(config: TokenizeConfig, run: Store) -> bool:
    """Whether to keep reasoning history: the config's choice, else the run manifest's."""
    if config.keep_reasoning_history is not None:
        return config.keep_reasoning_history
    settings = recorded_settings(run)
    return settings.keep_reasoning_history if settings is not None else False


def check_out(config: TokenizeConfig) -> None:
    """Refuse an output prefix that would write into the run's own files (ConfigError) or
    overlaps a ``--protect`` prefix (ProtectedPrefixError)."""
    check_not_protected(config.out_url, config.protect, what="tokenize output", describe=True)
    run, out = normalise_url(config.run), normalise_url(config.out_url)
    completions = f"{run}/{COMPLETIONS_PREFIX.rstrip('/')}"
    for other in (run, completions):
        if out == other or other.startswith(out + "/"):
            raise ConfigError(
                f"--out {config.out_url}: would write into the run's own files; use a "
                f"separate prefix such as {run}/tokenized"
            )
    if out.startswith(completions + "/"):
        raise ConfigError(f"--out {config.out_url}: inside the run's completions/; choose another")
    is_file = os.path.isfile(run) if "://" not in run else run.endswith(DATA_EXT)
    if config.input in conversations.CHAT_KINDS and not is_file and out.startswith(run + "/"):
        raise ConfigError(
            f"--out {config.out_url}: inside the conversations folder {config.run} (its samples "
            f"would be read as the folder's rows next time); use e.g. {run}-tokenized"
        )


def _fingerprint(paths: list[Path]) -> str | None:
    # sha256 over the files that exist (a tokenizer folder's json files, a template file)
    h = hashlib.sha256()
    found = False
    for path in paths:
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
            found = True
    return h.hexdigest()[:16] if found else None


def settings_of(config: TokenizeConfig, keep_reasoning_history: bool) -> dict[str, Any]:
    """The settings recorded in summary.json (what changes the samples), with fingerprints of
    the tokenizer and template files, so a changed tokenizer at the same path is noticed."""
    folder = Path(config.tokenizer)
    files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    template = [Path(config.chat_template)] if config.chat_template else []
    kind = {"input": config.input} if config.input not in (None, "run") else {}
    return kind | {
        "run": normalise_url(config.run),
        "tokenizer": config.tokenizer,
        "tokenizer_sha256": _fingerprint([folder / f for f in files]),
        "chat_template": config.chat_template,
        "chat_template_sha256": _fingerprint(template),
        "max_length": config.max_length,
        "long": config.long,
        "verify": config.verify,
        "keep_reasoning_history": keep_reasoning_history,
        "batch_rows": config.batch_rows,
    }


def summary_bytes(summary: TokenizeSummary, shards: list[str]) -> bytes:
    """summary.json: the summary without wall time, plus the shard list (deterministic)."""
    doc = {
        "format": TOKENIZE_SUMMARY.format,
        "out": summary.out,
        "settings": summary.settings,
        "shards": shards,
        "counts": summary.counts,
        "domains": msgspec.to_builtins(summary.domains),
        "mismatches": summary.mismatches,
        "models": summary.models,
    }
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def read_summary(out: str | Store) -> dict[str, Any]:
    """The ``summary.json`` of a tokenized output, checked (``formats.TOKENIZE_SUMMARY``; a
    DraftdataError if absent or unreadable)."""
    store = out if isinstance(out, Store) else open_store(out)
    key = TOKENIZE_SUMMARY.name
    return TOKENIZE_SUMMARY.load(store.read(key), store.key_url(key))


def previous_summary(out: Store, settings: dict[str, Any]) -> TokenizeSummary | None:
    """The finished output's summary if its settings match; ConfigError if they differ."""
    if not out.exists(TOKENIZE_SUMMARY.name):
        return None
    doc = read_summary(out)
    before = dict(doc.get("settings") or {})
    if before.pop("inputs", None) != settings["inputs"] and before == {
        k: v for k, v in settings.items() if k != "inputs"
    }:
        raise ConfigError(
            f"{out.url} holds samples of an earlier state of the run (its completion shards "
            "changed since); tokenize into a new --out"
        )
    if doc.get("settings") != settings:
        raise ConfigError(
            f"{out.url} already holds samples tokenized with other settings "
            f"({out.key_url(TOKENIZE_SUMMARY.name)}); choose another --out"
        )
    return msgspec.convert(
        {k: doc[k] for k in ("out", "counts", "domains", "mismatches", "settings")}
        | {"shards": len(doc.get("shards", [])), "models": doc.get("models") or []},
        TokenizeSummary,
    )


def tokenize(config: TokenizeConfig) -> TokenizeSummary:
    """Tokenize the run of ``config`` into ``config.out_url`` and return what happened.

    A finished output with the same settings and inputs is returned as it is (nothing redone);
    other settings into the same output are refused (ConfigError) before any work.
    """
    started = time.perf_counter()
    job = plan(config)
    if job.previous is not None:
        job.previous.wall_s = time.perf_counter() - started
        check_verified(job.previous, config)
        check_trainable(job.previous)
        return job.previous

    config = job.config
    ctx = start(job)
    kind = config.input or "run"
    if config.workers == 1:
        results: Iterable[tuple[Counters, list[str]]] = (
            tokenize_shard(
                ctx, job.run, job.out, key, config.batch_rows, kind, job.skip.get(key, [])
            )
            for key in job.keys
        )
        # a signal ends it as it ends a pool (Interrupted: the CLI's one line, 128 + signal)
        with interrupts():
            summary = finish(job, results)
    else:
        summary = finish(job, _parallel(config, job.keys, job.skip))
    summary.wall_s = time.perf_counter() - started
    check_verified(summary, config)
    check_trainable(summary)
    return summary


# served-id samples checked, none verified: enough to say the servers ran another tokenizer
FOREIGN_AFTER = 8


def stop_if_foreign(counters: Counters, tokenizer: str, where: str) -> None:
    """InputError (one line) as soon as ``FOREIGN_AFTER`` served-id samples of one input
    shard were checked and none matched ``--tokenizer``'s rendering: the servers ran another
    tokenizer (or template), and the rest of the pass could only drop every sample (a pass of
    30 s to say what the first batch shows). Nothing of that batch is written."""
    bad = counters.counts.get("mismatched", 0)
    if bad < FOREIGN_AFTER or counters.counts.get("verified", 0):
        return
    first = " ".join(counters.mismatches[0].split()) if counters.mismatches else ""
    example = f" (e.g. {first})" if first else ""
    if len(example) > 240:
        example = example[:238] + "…)"
    raise InputError(
        f"tokenize: the first {bad} samples' server token ids of {where} all differ from "
        f"--tokenizer {tokenizer}'s rendering{example}; stopped: the servers most likely ran "
        "another tokenizer than this one; tokenize with the served model's tokenizer into a "
        "new --out, or generate with --token-ids off"
    )


def check_verified(summary: TokenizeSummary, config: TokenizeConfig) -> None:
    """InputError (one line) when most served-id samples of the run failed verification.

    Such samples were dropped (``dropped.unverified_ids``), never written; when they are the
    majority the cause is the run, not the samples: the servers tokenized with another
    tokenizer (or template) than ``--tokenizer``. ``summary.json`` is written first.
    """
    bad = summary.count("mismatched")
    checked = summary.count("verified") + bad
    if checked and 2 * bad > checked:
        raise InputError(
            f"tokenize: {bad} of {checked} samples' server token ids do not match --tokenizer "
            f"{config.tokenizer} and were dropped ({summary.out}/{TOKENIZE_SUMMARY.name}): the "
            "servers most likely ran another tokenizer than this one; tokenize with the served "
            "model's tokenizer into a new --out, or generate with --token-ids off"
        )


def check_trainable(summary: TokenizeSummary) -> None:
    """InputError (one line) when a chat dataset gave no sample because none of its rows has
    an assistant turn: prompts, not a training set (``summary.json`` is written first)."""
    rows = summary.count("completions")
    if summary.count("samples") or not rows or summary.count("dropped.no_turns") < rows:
        return
    run = summary.settings.get("run", "")
    raise InputError(
        f"tokenize: none of the {rows:,} rows of {run} has an assistant turn to train on (they "
        f"are prompts); generate the answers first: draftdata generate --prompts {run} ..."
    )


class TokenizeJob(msgspec.Struct, kw_only=True):
    """What ``plan`` settled before any work: the resolved config, stores, inputs, settings."""

    config: TokenizeConfig  # keep_reasoning_history resolved
    run: Store
    out: Store
    keys: list[str]
    settings: dict[str, Any]
    previous: TokenizeSummary | None  # a finished output with the same settings
    skip: dict[str, list[int]]  # shard -> indexes of duplicate rows (``duplicate_rows``)
    models: list[str] = msgspec.field(default_factory=list)  # the run's (stats/models.py)


def locate_input(url: str) -> tuple[Store, list[str], str]:
    """(store, data keys, kind) of what ``url`` holds: a run's completion shards (``run``), or
    the files of a chat dataset (``conversations``, ``prompts``: ``conversations.py``).

    InputError in one line for a location that does not exist, a run without shards, tokenized
    samples (nothing to tokenize), or a file of which no row can be read.
    """
    if "://" not in url and not os.path.exists(url):
        raise InputError(
            f"tokenize: {url} does not exist; give a run (generate's --out) or conversations"
        )
    if "://" in url or os.path.isdir(url):
        store = open_store(url)
        keys = shard_keys(store, COMPLETIONS_PREFIX)
        if keys:
            return store, keys, "run"
        if store.exists(RUN_MANIFEST.name) or not store.list(""):
            raise InputError(
                f"{store.key_url(COMPLETIONS_PREFIX)}: no completion shards to tokenize"
            )
    ds = open_dataset(url)
    if ds.kind == "tokenized":
        raise InputError(
            f"tokenize: {url} holds tokenized samples already; merge them as they are, or give "
            "the run or conversations they came from"
        )
    if ds.kind == "run":
        if not ds.keys:
            raise InputError(f"{url}: no completion shards to tokenize")
        return ds.store, list(ds.keys), "run"
    conversations.check_readable(ds)
    return ds.store, list(ds.keys), ds.kind


def plan(config: TokenizeConfig) -> TokenizeJob:
    """The checks every tokenize driver makes first (config, inputs, --out, previous summary)."""
    config.validate()
    run, keys, kind = locate_input(config.run)
    config = msgspec.structs.replace(config, input=kind)
    check_out(config)
    if kind == "run":  # a moving run is not tokenized as if it were whole
        refuse_live_writer(run, "tokenize")
    keep = history_policy(config, run)
    config = msgspec.structs.replace(config, keep_reasoning_history=keep)
    out = open_store(config.out_url, protect=config.protect)  # every write re-checked
    settings = settings_of(config, keep) | {"inputs": keys}
    if config.server_thinking is not None:  # only when stated: older summaries compare equal
        settings["server_thinking"] = config.server_thinking
    previous = previous_summary(out, settings)
    return TokenizeJob(
        config=config,
        run=run,
        out=out,
        keys=keys,
        settings=settings,
        previous=previous,
        skip=duplicate_rows(run, keys) if previous is None and kind == "run" else {},
        models=run_models(run, keys) if previous is None and kind == "run" else [],
    )


def start(job: TokenizeJob) -> TokenizeContext:
    """Load the tokenizer and template (where a wrong ``--tokenizer`` or template fails), then
    claim the output (``claim_output``): a command that fails before its first shard leaves no
    marker behind, so the corrected command is not refused as "other settings"."""
    ctx = TokenizeContext.from_config(job.config)
    claim_output(job.out, job.settings)
    return ctx


def claim_output(out: Store, settings: dict[str, Any]) -> None:
    """Write ``tokenize_config.json`` (the settings but the inputs) before the first shard, so
    readers can tell an unfinished output (no ``summary.json`` yet) from a finished one, and a
    rerun with other settings is refused before it writes (ConfigError). A killed tokenize's
    own marker is accepted: the same settings finish it, whatever the run committed since."""
    kept = {k: v for k, v in settings.items() if k != "inputs"}
    doc = {"format": TOKENIZE_CONFIG.format, "settings": kept}
    data = (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
    try:
        out.put_new(TOKENIZE_CONFIG.name, data)
    except AlreadyExistsError as exc:
        raise ConfigError(
            f"{out.url} holds an unfinished tokenize with other settings "
            f"({out.key_url(TOKENIZE_CONFIG.name)}); rerun that one to finish it, or choose "
            "another --out"
        ) from exc


def finish(job: TokenizeJob, results: Iterable[tuple[Counters, list[str]]]) -> TokenizeSummary:
    """Merge per-shard (counters, written keys) in shard order and write ``summary.json``."""
    total = Counters()
    written: list[str] = []
    for c, names in results:
        total.merge(c)
        written.extend(names)
    summary = TokenizeSummary(
        out=job.out.url,
        shards=len(written),
        counts=dict(sorted(total.counts.items())),
        domains=dict(sorted(total.domains.items())),
        mismatches=total.mismatches,
        settings=job.settings,
        models=job.models,
    )
    job.out.put_new(TOKENIZE_SUMMARY.name, summary_bytes(summary, written))
    return summary


def _parallel(
    config: TokenizeConfig, keys: list[str], skip: dict[str, list[int]]
) -> Iterator[tuple[Counters, list[str]]]:
    # Results in key order (deterministic summary); at most 2 shards per worker in flight.

    threads = max(1, (os.cpu_count() or 1) // config.workers)
    with worker_pool(config.workers, _init_worker, (config, threads)) as pool:
        pending: list[Future[tuple[Counters, list[str]]]] = []
        queue = iter(keys)
        for key in queue:
            pending.append(pool.submit(_work, key, skip.get(key, [])))
            if len(pending) >= 2 * config.workers:
                break
        while pending:
            result = pending.pop(0).result()
            nxt = next(queue, None)
            if nxt is not None:
                pending.append(pool.submit(_work, nxt, skip.get(nxt, [])))
            yield result
