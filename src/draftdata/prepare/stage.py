"""The prepare stage: sources -> clean, deduplicated, mix-planned prompt shards and a report.

``prepare(config)`` runs two passes. Pass 1 streams every source in config order: decode ->
adapt -> cut into a prompt -> validate -> tag a domain -> dedup; rejects go to
``rejects.jsonl``, usable prompts to a per-source spool file (encoded once) with their domain
kept in memory as one byte each. Then ``mix.plan_mix`` turns the usable counts into per-source,
per-domain quotas, and pass 2 keeps a seeded random sample of each (source, domain) group and
writes the chosen prompts into ``prompts-NNNNN.jsonl`` shards *interleaved*: sources and domains
in a seeded order where every prefix of the prompt stream holds each (source, domain) group in
its planned proportion (``interleave``), so ``generate --limit N`` or a run stopped half-way is
a representative sample, not one source. Memory holds the dedup index, one byte per usable
prompt and one offset per chosen prompt, never the prompts.

Outputs in ``out``: ``prompts-00000.jsonl``... (one ``records.Prompt`` per line),
``rejects.jsonl`` (source, row, reason, detail), ``prepare_report.json`` and
``prepare_report.md``. Same inputs and seed give byte-identical files. ``plan_only`` stops after
planning and writes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

import msgspec

from draftdata.errors import ConfigError, InputError, RowError, disk_errors
from draftdata.prepare.adapters import adapt, fitting_schemas, to_prompt
from draftdata.prepare.config import PrepareConfig, SourceConfig, check, check_mix_domains
from draftdata.prepare.dedup import BATCH, Deduper, dedup_text
from draftdata.prepare.lengths import precheck as precheck_lengths
from draftdata.prepare.lengths import resolve as resolve_lengths
from draftdata.prepare.load import check_hub_reachable, empty_source, iter_rows
from draftdata.prepare.reference import load_exclusions, load_existing
from draftdata.prepare.report import encode_report, take_note, to_markdown
from draftdata.prepare.validate import DUPLICATE_ID, check_prompt
from draftdata.records import (
    DERIVED_ID,
    Message,
    Prompt,
    content_hash,
    derived_id_fault,
    encode_prompt,
)
from draftdata.shared.conversation import Conversation
from draftdata.shared.domains import classify_domain
from draftdata.shared.formats import (
    PREPARE_REJECTS,
    PREPARE_REPORT,
    PREPARE_REPORT_MD,
    PREPARE_SHARDS,
    prepare_shard,
)
from draftdata.shared.mix import Plan, Supply, plan_mix
from draftdata.store.forecast import read_forecast
from draftdata.support.gc_tuning import fewer_collections
from draftdata.support.metrics import StageStats

# (source name, rows read so far in it) -> None; called every few thousand rows (the reader's
# PROGRESS_EVERY) and at the end of each source
Progress = Callable[[str, int], None]
DEDUP_BATCH = BATCH
EVAL_DIR = "eval"  # the held-out evaluation split (``holdout``)
OUR_FILES = (
    PREPARE_SHARDS,
    PREPARE_REJECTS,
    PREPARE_REPORT.name,
    PREPARE_REPORT_MD,
    f"{EVAL_DIR}/{PREPARE_SHARDS}",
)


class PrepareResult(msgspec.Struct, kw_only=True, frozen=True):
    """What a prepare run produced: output paths, the plan, the report dict and the stats."""

    out: Path | None
    shards: list[Path]
    rejects: Path | None
    report_json: Path | None
    report_md: Path | None
    plan: Plan
    report: dict[str, Any]
    stats: StageStats


class _SourceRun:
    """Pass-1 state of one source: counters, its spool and the domain byte of each prompt."""

    def __init__(self, source: SourceConfig) -> None:
        self.source = source
        self.read = 0
        self.rejected: dict[str, int] = {}
        self.duplicates: dict[str, int] = {}
        self.domains = bytearray()
        self.spool: Path | None = None


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} exists and is not a folder")
    ours = [p for pat in OUR_FILES for p in out.glob(pat)] if out.exists() else []
    if ours and not force:
        raise ConfigError(
            f"out: {out} already holds prepare outputs ({ours[0].name}); choose another --out "
            "or pass --force to replace them"
        )
    for p in ours:
        p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_spools(out)


SPOOL_PREFIX = ".spool-"
_SPOOL_LOCK = ".lock"


def _open_spool(where: Path | None) -> tuple[Path, IO[bytes]]:
    """A new spool folder in ``where`` (None: TMPDIR) and its lock, held until the handle is
    closed: a folder whose lock nobody holds was left by a killed prepare."""
    root = Path(tempfile.mkdtemp(prefix=SPOOL_PREFIX, dir=where))
    lock = (root / _SPOOL_LOCK).open("wb")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return root, lock


def _remove_stale_spools(out: Path) -> None:
    """Remove the spool folders in ``out`` that no live prepare holds (a prepare killed with
    SIGKILL, or a power cut, leaves its spool behind: up to the size of the sources)."""
    for folder in out.glob(SPOOL_PREFIX + "*"):
        if not folder.is_dir():
            continue
        try:
            with (folder / _SPOOL_LOCK).open("rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live prepare into the same folder holds it
        except FileNotFoundError:
            pass  # killed before it took its lock
        shutil.rmtree(folder, ignore_errors=True)


def _reject(fh: BinaryIO | None, run: _SourceRun, index: int, err: RowError) -> None:
    run.rejected[err.reason] = run.rejected.get(err.reason, 0) + 1
    if fh is not None:
        line = {"source": run.source.name, "row": index, "reason": err.reason, "detail": err.detail}
        fh.write(msgspec.json.encode(line) + b"\n")


def _pass_one(
    config: PrepareConfig,
    source: SourceConfig,
    deduper: Deduper,
    domain_ids: dict[str, int],
    spool_dir: Path,
    rejects: BinaryIO | None,
    progress: Progress | None,
) -> _SourceRun:
    run = _SourceRun(source)
    mode = source.prompt_mode or config.prompt_mode
    seen_ids: set[str] = set()
    run.spool = spool_dir / f"{source.name}.jsonl"
    # Rows wait here, in row order, until DEDUP_BATCH of them are usable: the deduper checks a
    # batch at a time (far faster than row by row), and rejects are written in row order.
    pending: list[tuple[int, RowError | tuple[Conversation, list[Message]]]] = []
    texts: list[str] = []
    with run.spool.open("wb") as spool:

        def settle() -> None:
            kinds = iter(deduper.check_many(texts))
            for index, item in pending:
                if isinstance(item, RowError):
                    _reject(rejects, run, index, item)
                    continue
                kind = next(kinds)
                if kind is not None:
                    run.duplicates[kind] = run.duplicates.get(kind, 0) + 1
                    continue
                _keep(source, mode, run, seen_ids, domain_ids, spool, rejects, index, *item)
            pending.clear()
            texts.clear()

        shown = None if progress is None else (lambda n: progress(source.name, n))
        for index, row in iter_rows(source, shown):
            run.read += 1
            try:
                if isinstance(row, RowError):
                    raise row
                conv = adapt(source.schema, row, config.keep_original)
                messages = to_prompt(conv.messages, mode)
                check_prompt(messages, config.max_chars)
            except RowError as err:
                pending.append((index, err))
                continue
            pending.append((index, (conv, messages)))
            texts.append(dedup_text(messages))
            if len(texts) >= DEDUP_BATCH:
                settle()
        settle()
    if not run.read:  # a hub dataset of no rows (files that hold nothing are refused before)
        raise empty_source(source)
    if not run.domains and run.rejected:
        raise InputError(_all_rejected(config, source, run, mode))
    return run


_GUESS_ROWS = 20  # rows of a wholly rejected source re-read to find the schema that reads them


def _all_rejected(config: PrepareConfig, source: SourceConfig, run: _SourceRun, mode: str) -> str:
    """The one line for a source that yields no prompt because every row it gave was rejected
    (a wrong ``schema:`` above all): what was rejected, and the schema its first rows read as."""
    where = source.path or source.hub
    why = ", ".join(f"{k} {v:,}" for k, v in sorted(run.rejected.items(), key=lambda kv: -kv[1]))
    rows = []
    for _, row in itertools.islice(iter_rows(source), _GUESS_ROWS):
        if not isinstance(row, RowError):
            rows.append(row)
    fits = fitting_schemas(rows, mode, config.max_chars)
    if source.schema in fits:
        fix = "its schema reads its first rows: the reasons above are the rows' own"
    elif fits:
        fix = f"its rows read as schema {' or '.join(fits)}: set `schema: {fits[0]}`"
    else:
        fix = "no schema reads its first rows: check the file, `max_chars` and `prompt_mode`"
    return (
        f"source {source.name} ({where}): all {sum(run.rejected.values()):,} rows rejected under "
        f"schema {source.schema} ({why}); it would give no prompts; {fix}"
    )


def _keep(
    source: SourceConfig,
    mode: str,
    run: _SourceRun,
    seen_ids: set[str],
    domain_ids: dict[str, int],
    spool: BinaryIO,
    rejects: BinaryIO | None,
    index: int,
    conv: Conversation,
    messages: list[Message],
) -> None:
    """A usable, non-duplicate prompt: id check, domain, then onto the source's spool."""
    pid = (
        f"{source.name}/{conv.id}"
        if conv.id
        else f"{source.name}/{content_hash(messages, conv.tools)}"
    )
    if pid in seen_ids:
        _reject(rejects, run, index, RowError(DUPLICATE_ID, f"id {pid!r} seen before"))
        return
    if (fault := derived_id_fault(pid)) is not None:
        _reject(rejects, run, index, RowError(DERIVED_ID, fault.partition(": ")[2]))
        return
    seen_ids.add(pid)
    domain = source.domain
    if domain == "auto":
        domain = classify_domain(messages, conv.tools)
    meta = {**conv.meta, "row": index}
    if mode != "last_assistant":
        meta["prompt_mode"] = mode
    prompt = Prompt(
        id=pid,
        messages=messages,
        source=source.name,
        domain=domain,
        tools=conv.tools,
        meta=meta,
    )
    spool.write(encode_prompt(prompt) + b"\n")
    run.domains.append(domain_ids.setdefault(domain, len(domain_ids)))


def _choose(seed: int, source: str, domain: str, n: int, k: int) -> set[int]:
    # Seeded per (source, domain) so one source's choice never depends on another's size.
    if k >= n:
        return set(range(n))
    return set(random.Random(f"{seed}:{source}:{domain}").sample(range(n), k))


class _ShardWriter:
    def __init__(self, out: Path, size: int) -> None:
        self.out, self.size = out, size
        self.paths: list[Path] = []
        self._fh: BinaryIO | None = None
        self._count = 0

    def write(self, line: bytes) -> None:
        if self._fh is None or self._count == self.size:
            self.close()
            path = self.out / prepare_shard(len(self.paths))
            self.paths.append(path)
            self._fh = path.open("wb")
            self._count = 0
        self._fh.write(line)
        self._count += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def hold_out(
    seed: int, runs: Sequence[bytearray], names: list[str], per_domain: int
) -> list[set[int]]:
    """The spool lines of each source held out as the evaluation split: per domain
    ``min(per_domain, usable // 2)`` prompts (so at least half stay to be generated), a seeded
    sample over every source's usable prompts of that domain, independent of the mix and the
    budget (the same split whatever mix is planned later). One set per source."""
    held: list[set[int]] = [set() for _ in runs]
    if per_domain <= 0:
        return held
    members: dict[int, list[tuple[int, int]]] = {}  # domain id -> (source index, spool line)
    for r, domains in enumerate(runs):
        for i, d in enumerate(domains):
            members.setdefault(d, []).append((r, i))
    for d in sorted(members, key=names.__getitem__):
        pool = members[d]
        k = min(per_domain, len(pool) // 2)
        for j in random.Random(f"{seed}:holdout:{names[d]}").sample(range(len(pool)), k):
            r, i = pool[j]
            held[r].add(i)
    return held


def _write_interleaved(
    seed: int,
    runs: list[_SourceRun],
    groups: Mapping[tuple[int, str], Sequence[int]],
    writer: _ShardWriter,
) -> dict[str, dict[str, int]]:
    """Write the spool lines at ``groups``' offsets in ``interleave`` order; count per source
    and domain."""
    taken: dict[str, dict[str, int]] = {run.source.name: {} for run in runs}
    handles = [run.spool.open("rb") for run in runs if run.spool is not None]
    try:
        for (r, domain), offset in interleave(seed, groups):
            fh = handles[r]
            fh.seek(offset)
            writer.write(fh.readline())
            counts = taken[runs[r].source.name]
            counts[domain] = counts.get(domain, 0) + 1
    finally:
        for fh in handles:
            fh.close()
        writer.close()
    return taken


def _offsets(run: _SourceRun, lines: Mapping[int, list[int]]) -> None:
    """Append the byte offset of each spool line in ``lines`` (line -> its group's list)."""
    assert run.spool is not None
    offset = 0
    with run.spool.open("rb") as fh:
        for i, line in enumerate(fh):
            if i in lines:
                lines[i].append(offset)
            offset += len(line)


def _write_eval(
    config: PrepareConfig, runs: list[_SourceRun], held: list[set[int]], names: list[str],
    out: Path,
) -> list[Path]:  # fmt: skip
    """The held-out prompts into ``out/eval/prompts-*.jsonl``, interleaved like the rest."""
    groups: dict[tuple[int, str], list[int]] = {}
    for r, run in enumerate(runs):
        keep = {i: groups.setdefault((r, names[run.domains[i]]), []) for i in sorted(held[r])}
        _offsets(run, keep)
    if not groups:
        return []
    folder = out / EVAL_DIR
    folder.mkdir(exist_ok=True)
    writer = _ShardWriter(folder, config.shard_size)
    _write_interleaved(config.seed, runs, groups, writer)
    return writer.paths


def _pass_two(
    config: PrepareConfig,
    runs: list[_SourceRun],
    plan: Plan,
    names: list[str],
    out: Path,
    held: list[set[int]],
) -> tuple[list[Path], dict[str, dict[str, int]]]:
    """Write the chosen prompts, interleaved (``interleave``), into the shards; the held-out
    lines are never among them."""
    # (source index, domain) -> byte offsets of its chosen spool lines, in spool order
    groups: dict[tuple[int, str], list[int]] = {}
    for r, run in enumerate(runs):
        name = run.source.name
        quotas = plan.per_source.get(name, {})
        positions: dict[int, list[int]] = {}  # domain id -> spool line numbers
        for i, d in enumerate(run.domains):
            if i not in held[r]:
                positions.setdefault(d, []).append(i)
        keep: dict[int, list[int]] = {}  # spool line -> its group's list (filled below)
        for d, lines in positions.items():
            chosen = _choose(config.seed, name, names[d], len(lines), quotas.get(names[d], 0))
            group = groups.setdefault((r, names[d]), [])
            for j in chosen:
                keep[lines[j]] = group
        _offsets(run, keep)
    writer = _ShardWriter(out, config.shard_size)
    taken = _write_interleaved(config.seed, runs, groups, writer)
    return writer.paths, taken


def interleave(
    seed: int, groups: Mapping[tuple[int, str], Sequence[int]]
) -> Iterator[tuple[tuple[int, str], int]]:
    """Every item of every group once, in an order where every prefix holds each group in
    proportion to its size (within two items): group g's j-th item is due at position
    ``(j + 0.5) * total / len(g)``, and items are taken by due position. The order within a
    group and among groups due at once is seeded, so a prefix is a random sample of each group
    (sources and domains mixed as planned from the first prompt, not one source after another).
    Yields (group key, item)."""
    total = sum(len(v) for v in groups.values())
    heap: list[tuple[float, int, int]] = []  # (due position, seeded group rank, group index)
    keys = sorted(groups)
    rng = random.Random(f"{seed}:interleave")
    ranks = list(range(len(keys)))
    rng.shuffle(ranks)
    order: list[list[int]] = []
    for k, key in enumerate(keys):
        items = list(groups[key])
        random.Random(f"{seed}:interleave:{key[0]}:{key[1]}").shuffle(items)
        order.append(items)
        if items:
            heap.append((0.5 * total / len(items), ranks[k], k))
    heapq.heapify(heap)
    taken = [0] * len(keys)
    while heap:
        _, rank, k = heapq.heappop(heap)
        items = order[k]
        yield keys[k], items[taken[k]]
        taken[k] += 1
        if taken[k] < len(items):
            heapq.heappush(heap, ((taken[k] + 0.5) * total / len(items), rank, k))


def _report(
    config: PrepareConfig,
    runs: list[_SourceRun],
    names: list[str],
    plan: Plan,
    shards: list[Path],
    existing_bad: int,
    excluded: int,
) -> dict[str, Any]:
    sources = []
    for run in runs:
        usable: dict[str, int] = {}
        for d in run.domains:
            usable[names[d]] = usable.get(names[d], 0) + 1
        taken = plan.per_source.get(run.source.name, {})
        sources.append(
            {
                "name": run.source.name,
                "schema": run.source.schema,
                "location": run.source.path or run.source.hub,
                "domain": run.source.domain,
                "read": run.read,
                "rejected": dict(sorted(run.rejected.items())),
                "duplicates": dict(sorted(run.duplicates.items())),
                "usable": len(run.domains),
                "usable_by_domain": dict(sorted(usable.items())),
                "taken": sum(taken.values()),
                "taken_by_domain": dict(sorted(taken.items())),
            }
        )
    return {
        "format": PREPARE_REPORT.format,
        "seed": config.seed,
        "budget": config.budget,
        "prompt_mode": config.prompt_mode,
        "mix": dict(sorted(config.mix.items())),
        "sources": sources,
        "domains": [msgspec.to_builtins(d) for d in plan.domains],
        "totals": {
            "read": sum(r.read for r in runs),
            "rejected": sum(sum(r.rejected.values()) for r in runs),
            "duplicates": sum(sum(r.duplicates.values()) for r in runs),
            "usable": sum(len(r.domains) for r in runs),
            "taken": plan.total_new,
        },
        "shortfall": plan.shortfall,
        "existing_unreadable_rows": existing_bad,
        "excluded_prompts": excluded,
        "shards": [p.name for p in shards],
    }


def prepare(
    config: PrepareConfig,
    *,
    plan_only: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> PrepareResult:
    """Run prepare on ``config`` and return the outputs, plan, report and stats.

    ``plan_only`` reads and deduplicates every source, plans, and returns without writing
    anything. ``force`` replaces earlier prepare outputs in ``config.out`` (only those files).
    ``progress(source, rows_read)`` is called every few thousand rows. A source that cannot be
    read is an InputError naming it; bad rows are rejected and counted, never raised.
    """
    with fewer_collections():  # rows die young by the million: gc_tuning.py
        return _run(config, plan_only=plan_only, force=force, progress=progress)


def _run(
    config: PrepareConfig,
    *,
    plan_only: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> PrepareResult:
    check(config)
    if config.existing is None or config.existing.path is None:
        check_mix_domains(config)  # else once the existing rows' domains are known
    if config.lengths:  # a file that is no forecast: refused before any source is read
        read_forecast(config.lengths)
    check_hub_reachable(config.sources)
    # the sources are spooled into --out (with --plan-only into TMPDIR) and read back
    where, fix = config.out, "choose another --out"
    if plan_only:
        where, fix = tempfile.gettempdir(), "set TMPDIR to a folder with more room"
    fresh = not plan_only and not Path(config.out).exists()
    try:
        with disk_errors(where, fix):
            return _prepare(config, plan_only=plan_only, force=force, progress=progress)
    except BaseException:
        if fresh:  # a refused prepare leaves no empty --out behind (rmdir: only if empty)
            with contextlib.suppress(OSError):
                Path(config.out).rmdir()
        raise


def _prepare(
    config: PrepareConfig, *, plan_only: bool, force: bool, progress: Progress | None
) -> PrepareResult:
    stats = StageStats("prepare")
    out = Path(config.out)
    if not plan_only:
        _prepare_out(out, force)
    domain_ids: dict[str, int] = {}
    runs: list[_SourceRun] = []
    spool_root, spool_lock = _open_spool(None if plan_only else out)
    try:
        deduper = Deduper(config.dedup, workdir=spool_root)
        try:
            with stats.timed("references"):
                known = load_existing(config.existing, deduper)
                existing, existing_bad = known.counts, known.bad
                check_mix_domains(config, existing)
                precheck_lengths(config, known)
                excluded = load_exclusions(config.dedup.exclude, deduper)
            rejects_path = None if plan_only else out / PREPARE_REJECTS
            with stats.timed("read"):
                rejects = rejects_path.open("wb") if rejects_path is not None else None
                try:
                    for source in config.sources:
                        runs.append(
                            _pass_one(
                                config, source, deduper, domain_ids, spool_root, rejects, progress
                            )
                        )
                except BaseException:
                    if rejects_path is not None:  # nothing of a refused prepare stays
                        rejects_path.unlink(missing_ok=True)
                    raise
                finally:
                    if rejects is not None:
                        rejects.close()
        finally:
            deduper.close()
        del deduper  # the index is not needed to plan and write: its memory goes back first
        names = sorted(domain_ids, key=domain_ids.__getitem__)
        held = hold_out(config.seed, [run.domains for run in runs], names, config.holdout)
        supplies = []
        for r, run in enumerate(runs):
            avail: dict[str, int] = {}
            for i, d in enumerate(run.domains):
                if i not in held[r]:
                    avail[names[d]] = avail.get(names[d], 0) + 1
            supplies.append(
                Supply(
                    name=run.source.name,
                    available=avail,
                    take=run.source.take,
                    max_take=run.source.max_take,
                )
            )
        domains = {d for s in supplies for d in s.available}
        by_tokens, lengths = resolve_lengths(config, known, domains)
        plan = plan_mix(
            existing,
            supplies,
            config.budget,
            config.mix,
            lengths=lengths.per_domain if lengths is not None else None,
            existing_tokens=lengths.existing_tokens if lengths is not None else None,
            by_tokens=by_tokens,
        )
        shards: list[Path] = []
        eval_shards: list[Path] = []
        if not plan_only:
            with stats.timed("write"):
                shards, _ = _pass_two(config, runs, plan, names, out, held)
                eval_shards = _write_eval(config, runs, held, names, out)
    finally:
        shutil.rmtree(spool_root, ignore_errors=True)
        spool_lock.close()
    report = _report(config, runs, names, plan, shards, existing_bad, excluded)
    # the evaluation split is usable and not taken: counted apart from the budget and mix
    report["totals"]["held_out"] = sum(len(h) for h in held)
    report["mix_by"] = plan.mix_by
    if (note := take_note(plan)) is not None:
        report["mix_note"] = note  # fixed takes hold the mix off its target
    if config.holdout:
        by_domain: dict[str, int] = {}
        for r, run in enumerate(runs):
            for i in held[r]:
                dname = names[run.domains[i]]
                by_domain[dname] = by_domain.get(dname, 0) + 1
        report["holdout"] = {
            "per_domain": config.holdout,
            "prompts": sum(by_domain.values()),
            "by_domain": dict(sorted(by_domain.items())),
            "path": f"{EVAL_DIR}/",
            "shards": [f"{EVAL_DIR}/{p.name}" for p in eval_shards],
        }
    if lengths is not None:
        report["lengths"] = {
            "source": lengths.source,
            "tokens_per_row": {d: round(v, 1) for d, v in lengths.per_domain.items()},
            "existing_measured": lengths.existing_measured,
            "notes": lengths.notes,
        }
    for key in ("read", "rejected", "duplicates", "usable", "taken"):
        stats.add(key, report["totals"][key])
    if plan_only:
        return PrepareResult(
            out=None, shards=[], rejects=None, report_json=None, report_md=None,
            plan=plan, report=report, stats=stats,
        )  # fmt: skip
    report_json, report_md = out / PREPARE_REPORT.name, out / PREPARE_REPORT_MD
    report_json.write_bytes(encode_report(report))
    report_md.write_text(to_markdown(report, plan), encoding="utf-8")
    return PrepareResult(
        out=out, shards=shards, rejects=out / PREPARE_REJECTS, report_json=report_json,
        report_md=report_md, plan=plan, report=report, stats=stats,
    )  # fmt: skip
