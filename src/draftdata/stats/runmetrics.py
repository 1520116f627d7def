"""Read a run's metrics snapshots (``metrics/<writer>-<seq>.json``) whatever their exact shape.

The engine writes a snapshot every ``metrics_interval`` seconds and a final one; each holds the
writer id, a time, and the running summary (``GenerateSummary.to_dict()``: completed, failed,
output_tokens, wall_s, endpoints, ...) and/or per-endpoint rows (url, completed, output_tokens,
tokens_per_s). This module accepts the variants: endpoints as a list of rows with ``url`` or as a
``{url: row}`` mapping, at the top level or under ``summary``; ``failed`` as a count or a
``{reason: count}`` mapping; the time as epoch seconds or ISO-8601 under ``time``, else elapsed
seconds. Anything unrecognised is skipped, so a run without (usable) metrics gives an empty
series, never an error. A run's segments (``segments_of``: one per writer process) and the time
they cover together (``union``) are read from the snapshots here too; ``with_commits`` adds the
stretches the committed answers show but no snapshot covers (a command killed before its first
snapshot, or after its last), bounded by their requests' first start and last answer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

_ELAPSED_KEYS = ("elapsed_s", "wall_s")  # a progress snapshot's, the final summary's
SAME_START_S = 2.0  # two snapshots of one writer whose start times differ less are one process
COMMIT_GAP_S = 1.0  # answers further apart than this with no request between: two stretches
UNLOGGED = "(no metrics snapshot)"  # the writer of a stretch only its committed answers show


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
    """Epoch seconds of a snapshot (its ``time``: epoch seconds or ISO-8601), if it says."""
    return _num(snap.get("time"))


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
    union of the writers' active stretches when the snapshots carry clock times: resumed
    commands add up, parallel writers overlap; else the longest writer's), output tokens/s and
    per-endpoint totals; None when no snapshot carries a summary."""
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
    active, _ = union(segments_of(snapshots))
    if active > 0:  # commands one after another add up; side by side they overlap
        out["wall_s"] = active
    out["wall_s"] = round(out["wall_s"], 3)
    out["output_tokens_per_s"] = (
        round(out["output_tokens"] / out["wall_s"], 2) if out["wall_s"] else None
    )
    out["endpoints"] = dict(sorted(endpoints.items()))
    out["writers"] = len(newest)
    return out


def _samples(snap: dict[str, Any], x0: float) -> list[tuple[float, dict[str, float]]]:
    """(x, {url: cumulative output tokens}) samples of one snapshot; ``x0`` is the writer's
    start on the report's time axis."""
    out: list[tuple[float, dict[str, float]]] = []
    series = snap.get("series")
    if isinstance(series, list):
        for entry in series:
            if isinstance(entry, list | tuple) and len(entry) >= 4 and isinstance(entry[3], dict):
                t = _num(entry[0]) if not isinstance(entry[0], str) else None
                per = {str(u): v for u, v in entry[3].items() if _num(v) is not None}
                if t is not None and per:
                    out.append((x0 + t, {u: float(v) for u, v in per.items()}))
    elapsed = snapshot_elapsed(snap)
    rows = snapshot_endpoints(snap)
    if elapsed is not None and rows:
        # every answer the endpoint returned (a summary row's output_tokens is only the
        # committed part), as the progress snapshots count it
        per = {u: _num(r.get("generated_tokens", r.get("output_tokens"))) for u, r in rows.items()}
        tokens = {u: v for u, v in per.items() if v is not None}
        if tokens:
            out.append((x0 + elapsed, tokens))
    return out


def throughput_series(
    snapshots: list[dict[str, Any]], max_points: int = 60
) -> dict[str, list[tuple[float, float]]]:
    """Output tokens/s over time per endpoint: ``{url: [(seconds since start, tok/s), ...]}``.

    Each writer's cumulative per-endpoint output tokens (the snapshots' ``series`` samples and
    endpoint rows) are differenced into intervals; the intervals of every writer are spread
    over equal time bins (about the sampling interval wide, at most ``max_points``), so
    sequential commands (a resumed run) follow each other and parallel writers on one endpoint
    add up. The time axis is seconds since the
    run's first writer started when snapshots carry clock times, else each writer's elapsed
    seconds. ``{}`` when the snapshots hold no per-endpoint token counts.
    """
    writers = by_writer(snapshots)
    bases: dict[str, float | None] = {}
    for w, snaps in writers.items():
        starts = [
            t - (snapshot_elapsed(s) or 0.0) for s in snaps if (t := snapshot_time(s)) is not None
        ]
        bases[w] = min(starts) if starts else None
    known = [b for b in bases.values() if b is not None]
    origin = min(known) if known else 0.0
    intervals: dict[str, list[tuple[float, float, float]]] = {}
    for w, snaps in writers.items():
        base = bases[w]
        x0 = 0.0 if base is None else base - origin
        samples: list[tuple[float, dict[str, float]]] = [(x0, {})]
        for snap in snaps:
            samples += _samples(snap, x0)
        samples.sort(key=lambda p: p[0])
        last: dict[str, tuple[float, float]] = {}
        for x, per in samples:
            for url, tokens in per.items():
                px, pt = last.get(url, (x0, 0.0))
                # the counts are cumulative: a reading below one already seen is stale (taken
                # earlier, timed by another clock), never a restart, so it is skipped; taking
                # it as the new base would count the tokens after it twice
                if tokens < pt or x < px:
                    continue
                if x > px:
                    intervals.setdefault(url, []).append((px, x, tokens - pt))
                last[url] = (x, tokens)
    if not intervals:
        return {}
    start = min(i[0] for iv in intervals.values() for i in iv)
    end = max(i[1] for iv in intervals.values() for i in iv)
    if end <= start:
        return {}
    # bins about as wide as the typical sampling interval (three of them on a densely sampled
    # run, which smooths out commit bursts), at most ``max_points``
    edges = {x for iv in intervals.values() for i in iv for x in i[:2]}
    gaps = sorted(i[1] - i[0] for iv in intervals.values() for i in iv)
    typical = gaps[len(gaps) // 2] * (3 if len(edges) > 30 else 1)
    nbins = max(1, min(max_points, round((end - start) / typical)))
    width = (end - start) / nbins
    out: dict[str, list[tuple[float, float]]] = {}
    for url, iv in sorted(intervals.items()):
        acc = [0.0] * nbins
        for x0, x1, dt in iv:
            for k in range(int((x0 - start) // width), min(nbins, int((x1 - start) // width) + 1)):
                lo, hi = start + k * width, start + (k + 1) * width
                overlap = min(hi, x1) - max(lo, x0)
                if overlap > 0:
                    acc[k] += dt * overlap / (x1 - x0)
        out[url] = [
            (round(start + (k + 0.5) * width, 3), round(acc[k] / width, 3)) for k in range(nbins)
        ]
    return out


# -- segments: the writer processes of a run, in time ------------------------------------------


class Segment(msgspec.Struct, kw_only=True):
    """One command's stretch of the run (epoch seconds)."""

    writer: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """The segment's length."""
        return max(0.0, self.end - self.start)


def segments_of(snapshots: list[dict[str, Any]]) -> list[Segment]:
    """One Segment per writer process, from its snapshots' clock times and elapsed seconds;
    snapshots without a clock time are skipped. Sorted by start."""
    spans: dict[str, list[Segment]] = {}
    for snap in snapshots:
        t = snapshot_time(snap)
        if t is None:
            continue
        start = t - (snapshot_elapsed(snap) or 0.0)
        mine = spans.setdefault(writer_of(snap), [])
        for s in mine:
            # the same process: the same start, or one inside its stretch (clock drift over a
            # long run); a later command with the same --writer-id starts after it ended
            if abs(s.start - start) < SAME_START_S or s.start <= start < s.end:
                s.start, s.end = min(s.start, start), max(s.end, t)
                break
        else:
            mine.append(Segment(writer=writer_of(snap), start=start, end=t))
    return sorted((s for segs in spans.values() for s in segs), key=lambda s: s.start)


def union(segments: list[Segment]) -> tuple[float, list[tuple[float, float]]]:
    """Seconds covered by ``segments`` and the gaps between them (start, end)."""
    covered = 0.0
    gaps: list[tuple[float, float]] = []
    end: float | None = None
    for s in sorted(segments, key=lambda s: s.start):
        if end is None or s.start > end:
            if end is not None:
                gaps.append((end, s.start))
            covered += s.seconds
            end = s.end
        elif s.end > end:
            covered += s.end - end
            end = s.end
    return covered, gaps


class Answers(msgspec.Struct, kw_only=True):
    """A run's committed answers in time, as arrays (one entry per answer): its request's start
    and its answer's time (epoch seconds), its output tokens, and its endpoint (an index into
    ``urls``)."""

    start: npt.NDArray[np.float64]
    end: npt.NDArray[np.float64]
    tokens: npt.NDArray[np.float64]
    endpoint: npt.NDArray[np.int64]
    urls: list[str]


def with_commits(segments: list[Segment], answers: Answers) -> list[Segment]:
    """``segments`` plus what the committed ``answers`` show beyond them: requests that overlap
    (or follow within ``COMMIT_GAP_S``) form a stretch; a stretch that overlaps a segment
    extends it (a command killed after its last snapshot), one that overlaps none is a segment
    of its own (a command killed before its first snapshot: its time bounded by its first
    request and last answer). Sorted by start."""
    out = [Segment(writer=s.writer, start=s.start, end=s.end) for s in segments]
    if len(answers.start):
        order = np.argsort(answers.start, kind="stable")
        starts, ends = answers.start[order], np.maximum.accumulate(answers.end[order])
        # a stretch begins where a request starts after every earlier one ended (plus the gap)
        new = np.flatnonzero(starts[1:] > ends[:-1] + COMMIT_GAP_S) + 1
        firsts = np.concatenate(([0], new))
        lasts = np.concatenate((new - 1, [len(starts) - 1]))
        for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True):
            lo, hi = float(starts[a]), float(ends[b])
            hit = [s for s in out if s.start <= hi and lo <= s.end]
            if not hit:
                out.append(Segment(writer=UNLOGGED, start=lo, end=hi))
                continue
            for s in hit:  # the commits of a segment after its last snapshot
                if s.writer != UNLOGGED:
                    s.start, s.end = min(s.start, lo), max(s.end, hi)
                    break
    return sorted(out, key=lambda s: s.start)


def answer_throughput(
    answers: Answers, origin: float, max_points: int = 60
) -> dict[str, list[tuple[float, float]]]:
    """Output tokens/s over time per endpoint from committed ``answers``: ``{url: [(seconds
    since origin, tok/s)]}``. Each answer's tokens are spread evenly over its request's life,
    the time they were generated in, and the bins are never narrower than the median request
    life: an endpoint counts an answer's tokens when it ends, so bins narrower than a request
    show bursts and empty stretches (several times the true rate, then 0) where the fleet
    decoded steadily. ``{}`` without answers, or when most answers carry no request life
    (latency 0: records that do not say when their request started)."""
    if not len(answers.start):
        return {}
    lo, hi = float(answers.start.min()), float(answers.end.max())
    lives = answers.end - answers.start
    life = float(np.median(lives))
    if life <= 0:
        return {}
    width = max((hi - lo) / max_points, life)
    nbins = max(1, math.ceil((hi - lo) / width))
    edges = lo + width * np.arange(nbins + 1)
    # tokens each answer made by each edge: its rate times its time before the edge
    rate = np.where(lives > 0, answers.tokens / np.maximum(lives, 1e-12), 0.0)
    out: dict[str, list[tuple[float, float]]] = {}
    for code, url in sorted(enumerate(answers.urls), key=lambda cu: cu[1]):
        mine = answers.endpoint == code
        if not mine.any():
            continue
        s, e, r = answers.start[mine], answers.end[mine], rate[mine]
        instant = answers.tokens[mine] * (lives[mine] <= 0)  # no life: all at its end
        made = np.array(
            [
                float((r * np.clip(x - s, 0.0, e - s)).sum() + instant[e <= x].sum())
                for x in edges.tolist()
            ]
        )
        made[-1] = float(answers.tokens[mine].sum())  # the last edge holds every answer
        per_bin = np.diff(made)
        out[url] = [
            (round(lo - origin + (k + 0.5) * width, 3), round(float(per_bin[k]) / width, 3))
            for k in range(nbins)
        ]
    return out
