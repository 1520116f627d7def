"""merge's pass 2: the chosen rows of each input into the shuffle's buckets, and a trainer's
JSONL beside the shards.

``route_samples`` (tokenized inputs, in batches of about 32 MiB) and ``route_chat``
(conversations, buffered per bucket) read an input again and append every row the plan chose,
with its copies renamed (``ID~rK``), to its split's bucket with its order key
(``shuffle.py`` sorts and writes them). ``jsonl_writer`` turns each parquet shard into the
trainer format's JSONL, counting the rows that format cannot hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from draftdata.merge.inputs import (
    InputInfo,
    iter_chat_rows,
    iter_sample_tables,
)
from draftdata.merge.jsonl import jsonl_key
from draftdata.merge.jsonl import left_out as jsonl_left_out
from draftdata.merge.jsonl import lines as jsonl_lines
from draftdata.merge.planner import RoutePlan
from draftdata.merge.shuffle import COPY, KEY, ROW, Buckets
from draftdata.stats.conversations import conversation_row
from draftdata.store.base import Store

_FLUSH_ROWS = 1024  # rows buffered per bucket before an IPC write (chat rows)
_BATCH_BYTES = 32 << 20  # pass-2 read batches and all chat buffers together stay near this


def route_samples(info: InputInfo, plan: RoutePlan, buckets: Buckets) -> None:
    sel = plan.selection
    names = np.asarray(plan.domain_names, dtype=object)
    g = info.first_row
    # batches of about _BATCH_BYTES, whatever the sample length
    sizes = plan.size[info.first_row : info.first_row + info.scanned]
    avg = int(sizes.mean()) if len(sizes) else 1
    batch_rows = max(256, min(65536, _BATCH_BYTES // max(avg, 1)))
    for table in iter_sample_tables(info, batch_rows):
        n = table.num_rows
        lo, hi = np.searchsorted(sel.row, [g, g + n])
        g += n
        if lo == hi:
            continue
        rows, copy = sel.row[lo:hi], sel.copy[lo:hi]
        sub = table.take(pa.array(rows - (g - n)))
        domains = pa.array(names[plan.keys_domain[rows]].tolist(), pa.string())
        ids = sub.column("id")
        if (copy > 0).any():
            base = ids.to_pylist()
            ids = pa.array(
                [
                    f"{b}{plan.copy_suffix}{k}" if k else b
                    for b, k in zip(base, copy.tolist(), strict=True)
                ],
                pa.string(),
            )
        sub = sub.set_column(sub.schema.get_field_index("id"), "id", ids)
        sub = sub.set_column(sub.schema.get_field_index("domain"), "domain", domains)
        sub = sub.append_column(KEY, pa.array(sel.key[lo:hi], pa.uint64()))
        sub = sub.append_column(ROW, pa.array(rows, pa.int64()))
        sub = sub.append_column(COPY, pa.array(copy, pa.int32()))
        sub = sub.replace_schema_metadata(None)
        split, bucket = sel.split[lo:hi], plan.buckets[lo:hi]
        route = split.astype(np.int64) * (1 << 40) + bucket
        order = np.argsort(route, kind="stable")
        route = route[order]
        cuts = np.flatnonzero(np.diff(route)) + 1
        for part in np.split(np.arange(len(order)), cuts):
            r = int(route[part[0]])
            buckets.write(r >> 40, r & ((1 << 40) - 1), sub.take(pa.array(order[part])))


def route_chat(info: InputInfo, plan: RoutePlan, buckets: Buckets) -> None:
    sel = plan.selection
    schema = buckets.schema
    pending: dict[tuple[int, int], list[dict[str, Any]]] = {}
    p = int(np.searchsorted(sel.row, info.first_row))
    end = len(sel.row)
    rows, copies, splits, keys, bks = (
        sel.row.tolist(),
        sel.copy.tolist(),
        sel.split.tolist(),
        sel.key.tolist(),
        plan.buckets.tolist(),
    )
    g = info.first_row
    held = 0  # estimated bytes in all pending buffers

    def flush_all() -> None:
        for k, buf in sorted(pending.items()):
            if buf:
                buckets.write(k[0], k[1], pa.Table.from_pylist(buf, schema=schema))
        pending.clear()

    for conv in iter_chat_rows(info):
        while p < end and rows[p] == g:
            domain = plan.domain_names[int(plan.keys_domain[g])]
            row = conversation_row(conv, domain=domain)
            if copies[p]:
                row["id"] = f"{conv.id}{plan.copy_suffix}{copies[p]}"
            row[KEY], row[ROW], row[COPY] = keys[p], g, copies[p]
            k = (splits[p], bks[p])
            buf = pending.setdefault(k, [])
            buf.append(row)
            held += int(plan.size[g])
            if len(buf) >= _FLUSH_ROWS:
                buckets.write(k[0], k[1], pa.Table.from_pylist(buf, schema=schema))
                held -= sum(int(plan.size[r[ROW]]) for r in buf)
                pending[k] = []
            elif held >= _BATCH_BYTES:
                flush_all()
                held = 0
            p += 1
        g += 1
    flush_all()


def jsonl_writer(
    store: Store, keys: list[str], fmt: str, left: Counter[str]
) -> Callable[[pa.Table, str, int], None]:
    def write(shard: pa.Table, split: str, index: int) -> None:
        out = []
        for r in shard.to_pylist():
            why = jsonl_left_out(fmt, r)
            if why is None:
                out.extend(jsonl_lines(fmt, r))
            else:
                left[why] += 1
        key = jsonl_key(fmt, split, index)
        store.put_new(key, b"".join(line + b"\n" for line in out))
        keys.append(key)

    return write
