"""Read a run's metrics snapshots (``metrics/<writer>-<seq>.json``) whatever their exact shape.

The engine writes a snapshot every ``metrics_interval`` seconds and a final one; each holds the
writer id, a time, and the running summary (``GenerateSummary.to_dict()``: completed, failed,
output_tokens, wall_s, endpoints, ...) and/or per-endpoint rows (url, completed, output_tokens,
tokens_per_s). This module accepts the variants: endpoints as a list of rows with ``url`` or as a
``{url: row}`` mapping, at the top level or under ``summary``; ``failed`` as a count or a
``{reason: count}`` mapping; the time as epoch seconds or ISO-8601 under ``time``/``ts``/
``timestamp``/``written``/``created``, else elapsed seconds. Anything unrecognised is skipped, so
a run without (usable) metrics gives an empty series, never an error.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

_TIME_KEYS = ("time", "ts", "timestamp", "written", "written_at", "now", "created")
_ELAPSED_KEYS = ("elapsed_s", "elapsed", "wall_s")


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _count(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_count(v) for v in value.values())
    n = _num(value) if not isinstance(value, str) else None
    return int(n or 0)


def summary_of(snap: dict[str, Any]) -> dict[str, Any]:
    """The running summary of a snapshot (``summary`` if present, else the snapshot itself)."""
    s = snap.get("summary")
    return s if isinstance(s, dict) else snap


def snapshot_time(snap: dict[str, Any]) -> float | None:
    """Epoch seconds of a snapshot, if it says."""
    for k in _TIME_KEYS:
        t = _num(snap.get(k))
        if t is not None:
            return t
    return None


def snapshot_elapsed(snap: dict[str, Any]) -> float | None:
    """Seconds since the writer started, if the snapshot says."""
    for where in (snap, summary_of(snap)):
        for k in _ELAPSED_KEYS:
            v = where.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return float(v)
    return None


def snapshot_endpoints(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{url: row}`` of a snapshot's per-endpoint figures (``{}`` when it has none)."""
    for where in (snap, summary_of(snap)):
        eps = where.get("endpoints")
        if isinstance(eps, dict):
            return {str(u): r for u, r in eps.items() if isinstance(r, dict)}
        if isinstance(eps, list):
            out: dict[str, dict[str, Any]] = {}
            for r in eps:
                if isinstance(r, dict):
                    url = r.get("url") or r.get("endpoint")
                    if url:
                        out[str(url)] = r
            if out:
                return out
    return {}


def writer_of(snap: dict[str, Any]) -> str:
    """The writer id of a snapshot (its key's stem when the body does not say)."""
    w = snap.get("writer")
    if isinstance(w, str) and w:
        return w
    key = str(snap.get("key", ""))
    stem = key.rsplit("/", 1)[-1].removesuffix(".json")
    return stem.rsplit("-", 1)[0] if "-" in stem else stem


def by_writer(snapshots: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each writer's snapshots in order (key order, which is the writer's sequence)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in snapshots:
        out[writer_of(s)].append(s)
    return dict(sorted(out.items()))


def latest(snapshots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest snapshot of each writer."""
    return [snaps[-1] for snaps in by_writer(snapshots).values() if snaps]


def headline(snapshots: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Completed, failed, output tokens (summed over writers' newest snapshots), wall time (the
    longest writer's: writers run side by side), output tokens/s and per-endpoint totals; None
    when no snapshot carries a summary."""
    newest = latest(snapshots)
    if not newest:
        return None
    out: dict[str, Any] = {"completed": 0, "failed": 0, "output_tokens": 0, "wall_s": 0.0}
    endpoints: dict[str, dict[str, int]] = {}
    useful = False
    for snap in newest:
        s = summary_of(snap)
        if any(k in s for k in ("completed", "output_tokens")):
            useful = True
        out["completed"] += _count(s.get("completed"))
        out["failed"] += _count(s.get("failed"))
        out["output_tokens"] += _count(s.get("output_tokens"))
        out["wall_s"] = max(out["wall_s"], snapshot_elapsed(snap) or 0.0)
        for url, e in snapshot_endpoints(snap).items():
            acc = endpoints.setdefault(url, {"completed": 0, "output_tokens": 0, "errors": 0})
            for k in acc:
                acc[k] += _count(e.get(k))
    if not useful:
        return None
    out["wall_s"] = round(out["wall_s"], 3)
    out["output_tokens_per_s"] = (
        round(out["output_tokens"] / out["wall_s"], 2) if out["wall_s"] else None
    )
    out["endpoints"] = dict(sorted(endpoints.items()))
    out["writers"] = len(newest)
    return out


def throughput_series(snapshots: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Output tokens/s over time per endpoint: ``{label: [(seconds since start, tok/s), ...]}``.

    Rates come from the difference of an endpoint's cumulative ``output_tokens`` between a
    writer's consecutive snapshots (or the snapshot's own ``tokens_per_s`` for the first one).
    Times are seconds since the earliest snapshot of the run when snapshots carry clock times,
    else each writer's elapsed seconds. With several writers the label names the writer too.
    """
    writers = by_writer(snapshots)
    starts = []
    for snaps in writers.values():
        for s in snaps:
            t, e = snapshot_time(s), snapshot_elapsed(s)
            if t is not None:
                starts.append(t - (e or 0.0))
    origin = min(starts) if starts else None
    series: dict[str, list[tuple[float, float]]] = {}
    for writer, snaps in writers.items():
        prev: dict[str, tuple[float, float]] = {}
        for s in snaps:
            t = snapshot_time(s)
            x = (t - origin) if (t is not None and origin is not None) else snapshot_elapsed(s)
            if x is None:
                continue
            for url, row in snapshot_endpoints(s).items():
                label = url if len(writers) == 1 else f"{url} [{writer}]"
                tokens = _num(row.get("output_tokens"))
                rate: float | None = None
                if tokens is not None and url in prev and x > prev[url][0]:
                    rate = (tokens - prev[url][1]) / (x - prev[url][0])
                elif _num(row.get("tokens_per_s")) is not None:
                    rate = _num(row.get("tokens_per_s"))
                elif tokens is not None and url not in prev and x > 0:
                    rate = tokens / x if snapshot_elapsed(s) else None
                if tokens is not None:
                    prev[url] = (x, tokens)
                if rate is not None:
                    series.setdefault(label, []).append((round(x, 3), max(0.0, round(rate, 3))))
    return dict(sorted(series.items()))
