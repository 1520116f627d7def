"""``draftdata tokenize --ray``: tokenize a run's completion shards (or a chat dataset's
conversation files, one row per file) as a Ray Data job.

The dataset is the run's list of completion shards, one row (and one block) per shard, so
each shard is read once, whole, through the run store (format-checked; local or S3, with the
store's own client settings). ``map_batches`` runs ``_tokenize_keys`` as Ray tasks: each task
builds (once per worker process) the tokenizer context and sends its shard through the
single-process stage's ``tokenize_shard``, which calls the batch API ``tokenize_table`` per
``batch_rows`` completions and writes each batch's samples create-only under the same name
the single-process stage uses. The driver merges the counters in shard order and writes the
same ``summary.json``: a Ray run and a single-process run of the same inputs and settings
produce the same shard names, bytes and summary, and either can finish what the other began
(identical bytes count as done; other settings are refused before any work).

This module does not tokenize by itself (``tokenize.encode`` does) and defines no format.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from collections import Counter
from typing import Any

import msgspec
import pyarrow as pa

from draftdata.distributed import cluster
from draftdata.errors import InputError
from draftdata.store.base import normalise_url
from draftdata.store.opener import open_store
from draftdata.tokenize import stage
from draftdata.tokenize.config import DomainTotals, TokenizeConfig, TokenizeSummary
from draftdata.tokenize.encode import Counters, TokenizeContext
from draftdata.tokenize.stage import locate_input, tokenize_shard


class RayTokenizeOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the Ray Data job runs (everything else is the TokenizeConfig)."""

    address: str | None = None  # None: $RAY_ADDRESS, this machine's cluster, or a local one
    concurrency: int | None = None  # tasks at once (None: as many as the cluster's CPUs allow)
    cpus_per_task: float = 1.0
    forward_env: list[str] = msgspec.field(default_factory=list)


class RayTokenizeResult(msgspec.Struct, kw_only=True):
    """The stage's summary plus what the Ray job did (tasks run; 0 when already done)."""

    summary: TokenizeSummary
    inputs: int
    tasks: int
    wall_s: float = 0.0


# -- the task (runs in a Ray worker) ---------------------------------------------------------

# settings JSON -> (context, input store, out store, input kind): one tokenizer load per worker
# process.
_WORKER_STATE: dict[str, tuple[Any, Any, Any, str]] = {}


def _worker_state(config_json: str) -> tuple[Any, Any, Any, str]:
    state = _WORKER_STATE.get(config_json)
    if state is None:
        config = msgspec.json.decode(config_json, type=TokenizeConfig)
        ctx = TokenizeContext.from_config(config)
        out = open_store(config.out_url, protect=config.protect)
        store, _, kind = locate_input(config.run)
        state = (ctx, store, out, kind)
        _WORKER_STATE.clear()  # one run at a time per worker: drop the previous tokenizer
        _WORKER_STATE[config_json] = state
    return state


def _tokenize_keys(batch: Any, config_json: str, rows: int) -> Any:
    """map_batches body: tokenize the shards named in ``batch`` (a pyarrow table with
    ``index`` and ``key``); returns their counters (JSON) and written shard names."""

    ctx, run, out, kind = _worker_state(config_json)
    indexes, counters, written = [], [], []
    skips = batch.column("skip").to_pylist()  # JSON lists of duplicate rows (the stage's)
    for index, key, skip in zip(
        batch.column("index").to_pylist(), batch.column("key").to_pylist(), skips, strict=True
    ):
        c, names = tokenize_shard(ctx, run, out, key, rows, kind, json.loads(skip))
        indexes.append(index)
        counters.append(json.dumps(c.to_dict()))
        written.append(names)
    return pa.table(
        {
            "index": pa.array(indexes, pa.int64()),
            "counters": pa.array(counters, pa.string()),
            "written": pa.array(written, pa.list_(pa.string())),
        }
    )


def _counters(doc: dict[str, Any]) -> Counters:

    return Counters(
        counts=Counter(doc["counts"]),
        domains={k: msgspec.convert(v, DomainTotals) for k, v in doc["domains"].items()},
        mismatches=list(doc["mismatches"]),
    )


# -- the driver ------------------------------------------------------------------------------


def run(config: TokenizeConfig, opts: RayTokenizeOptions | None = None) -> RayTokenizeResult:
    """Tokenize the run of ``config`` on Ray Data into ``config.out_url``.

    The same checks as the single-process stage happen first, on the driver (output prefix,
    the previous summary's settings); a finished output with the same settings is returned
    as it is. Raises the stage's DraftdataError of the first shard that fails.
    """

    opts = opts or RayTokenizeOptions()
    ray = cluster.require_ray()
    started = time.perf_counter()
    job = stage.plan(config)
    keys = job.keys
    if job.previous is not None:
        job.previous.wall_s = time.perf_counter() - started
        stage.check_verified(job.previous, config)
        stage.check_trainable(job.previous)
        return RayTokenizeResult(summary=job.previous, inputs=len(keys), tasks=0, wall_s=0.0)
    stage.start(job)  # the tokenizer loads here first; then the output is claimed

    forward = tuple(dict.fromkeys([*cluster.DEFAULT_FORWARD_ENV, *opts.forward_env]))
    started_ray = cluster.connect(opts.address, forward_env=forward)
    try:
        cluster.check_fits("tokenize --ray", cpus=opts.cpus_per_task)
        results = _run_job(ray, _for_workers(job.config), keys, job.skip, opts)
    finally:
        if started_ray:
            ray.shutdown()

    ordered = (results[index] for index in range(len(keys)))  # shard order, as the stage's
    summary = stage.finish(job, ((_counters(json.loads(c)), names) for c, names in ordered))
    summary.wall_s = time.perf_counter() - started
    stage.check_verified(summary, config)
    stage.check_trainable(summary)
    return RayTokenizeResult(
        summary=summary, inputs=len(keys), tasks=len(keys), wall_s=summary.wall_s
    )


def _for_workers(config: TokenizeConfig) -> TokenizeConfig:
    """``config`` with local paths absolute (workers run in other directories); the
    summary's settings keep the paths as given, as the single-process stage records them."""

    def local(path: str | None) -> str | None:
        return os.path.abspath(path) if path and os.path.exists(path) else path

    return msgspec.structs.replace(
        config,
        run=normalise_url(config.run),
        out=normalise_url(config.out_url),
        tokenizer=local(config.tokenizer) or config.tokenizer,
        chat_template=local(config.chat_template),
    )


def _run_job(
    ray: Any,
    config: TokenizeConfig,
    keys: list[str],
    skip: dict[str, list[int]],
    opts: RayTokenizeOptions,
) -> dict[int, tuple[str, list[str]]]:
    """The Ray Data job: shard keys (and their duplicate rows) -> map_batches(tokenize) ->
    (counters, names) per index."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    items = [
        {"index": i, "key": k, "skip": json.dumps(skip.get(k, []))} for i, k in enumerate(keys)
    ]
    ds = ray.data.from_items(items, override_num_blocks=len(keys))
    mapped = ds.map_batches(
        _tokenize_keys,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={
            "config_json": msgspec.json.encode(config).decode(),
            "rows": config.batch_rows,
        },
        num_cpus=opts.cpus_per_task,
        **_task_pool(ray, opts.concurrency),
    )
    results: dict[int, tuple[str, list[str]]] = {}
    for row in mapped.iter_rows():
        results[int(row["index"])] = (str(row["counters"]), list(row["written"]))
    missing = len(keys) - len(results)
    if missing:
        raise InputError(f"tokenize --ray: {missing} completion shard(s) returned no result")
    return results


def _task_pool(ray: Any, size: int | None) -> dict[str, Any]:
    """map_batches' argument for "at most ``size`` tasks": ``compute`` (Ray >= 2.51), else
    the older ``concurrency``."""
    if size is None:
        return {}

    strategy = getattr(ray.data, "TaskPoolStrategy", None)
    if strategy is not None and "size" in inspect.signature(strategy).parameters:
        return {"compute": strategy(size=size)}
    return {"concurrency": size}


def summary_lines(result: RayTokenizeResult) -> list[str]:
    """The Ray part of the final summary (the stage's own lines follow it)."""
    s = result.summary
    if not result.tasks:
        return [f"ray tokenize: {s.out} already holds these samples ({s.shards} shards)"]
    return [
        f"ray tokenize: {result.inputs} completion shard(s) in {result.tasks} Ray Data task(s) "
        f"-> {s.shards} sample shard(s) in {result.wall_s:.1f} s"
    ]
