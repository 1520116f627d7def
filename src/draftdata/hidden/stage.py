"""``hidden_states(config)``: tokenized samples -> the target's hidden states, in named phases.

    check      the model's config, the layers, the format, the output (nothing read yet)
    plan       one pass over the samples: rows, lengths, the dataset's identity (plan.py)
    bill       the bytes it will write, printed before any forward pass; --max-bytes refuses
    claim      the set's lease (one writer), its manifest (same settings or refuse), the
               index (which file holds which sample id) and speculators' dataset
    run        the rows not yet in the store (the pilot's only, with --pilot), read again in
               windows, sorted by length, batched under --batch-tokens, on one worker per
               device; every file committed create-only as it is encoded (commit.py)
    verify     --verify N samples recomputed one at a time and compared (verify.py)
    finish     the summary (written as hidden_summary*.json once every sample is done)

Killed at any moment, the same command resumes: the manifest and index are there, the done-set
is the listing of sample files, and only the missing files are made. The engine is behind
``backend.py``; ``opener`` (tests, benchmarks) replaces the engine's opener.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from draftdata.errors import ConfigError, InputError, VerificationError
from draftdata.generate.prompts.partition import parse_partition
from draftdata.hidden.backend import BackendSpec, ModelFacts, Opener, engine_named, read_model_facts
from draftdata.hidden.bill import check_budget, eta_line, human_bytes, make_bill
from draftdata.hidden.config import (
    DatasetIdentity,
    HiddenConfig,
    HiddenSettings,
    HiddenSummary,
    LayerCheck,
    ModelIdentity,
    Verification,
)
from draftdata.hidden.layers import Capture, parse_layers
from draftdata.hidden.plan import (
    Plan,
    batches,
    iter_rows,
    make_plan,
    open_input,
    rows_of_pilot,
    windows,
)
from draftdata.hidden.progress import Progress
from draftdata.hidden.run import BatchResult, Workers, WorkerSpec
from draftdata.hidden.setfiles import check_prefix, open_manifest, write_index, write_summary
from draftdata.hidden.verify import choose_rows, summarise, tolerance
from draftdata.hidden.writer import HIDDEN_FOLDER, SampleRow, Writer
from draftdata.hidden.writers import writer_for
from draftdata.store.base import Store, refuse_protected
from draftdata.store.lease import Lease, acquire, scope_of
from draftdata.store.opener import open_store
from draftdata.support.workerpool import interrupts

Log = Callable[[str], None]
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SPECULATORS_DONE = "state.json"  # speculators' dataset is whole once this is there


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def model_identity(model: str, facts: ModelFacts) -> ModelIdentity:
    """The target as the settings record it (config sha256, weight files and sizes)."""
    folder = Path(model)
    raw = (folder / "config.json").read_bytes()
    weights = {
        p.name: p.stat().st_size
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    }
    return ModelIdentity(
        name=folder.resolve().name,
        config_sha256="sha256:" + hashlib.sha256(raw).hexdigest(),
        weights=weights,
        model_type=facts.model_type,
        num_layers=facts.num_layers,
        hidden_size=facts.hidden_size,
    )


def _layer_names(capture: Capture, num_layers: int) -> list[str]:
    return [str(i) for i in capture.aux] + [f"{num_layers} ({capture.last})"]


class _Candidates:
    """The samples verification may pick, kept while they stream past (bounded): the ``n``
    most padded and a uniform reservoir of ``n`` others."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.padded: list[tuple[float, int, SampleRow]] = []  # min-heap on padding share
        self.reservoir: list[SampleRow] = []
        self.seen = 0
        self.rng = random.Random(0)
        self.padding: dict[int, float] = {}

    def offer(self, sample: SampleRow, padding: float) -> None:
        if self.n <= 0:
            return
        item = (padding, -sample.row, sample)
        if len(self.padded) < self.n:
            heapq.heappush(self.padded, item)
        elif item[:2] > self.padded[0][:2]:
            heapq.heapreplace(self.padded, item)
        self.seen += 1
        if len(self.reservoir) < self.n:
            self.reservoir.append(sample)
        else:
            j = self.rng.randrange(self.seen)
            if j < self.n:
                self.reservoir[j] = sample

    def samples(self) -> dict[int, tuple[SampleRow, float]]:
        found = {s.row: (s, p) for p, _, s in self.padded}
        for s in self.reservoir:
            found.setdefault(s.row, (s, 0.0))
        return found


EARLY_SAMPLES = 2  # batched samples recomputed alone as soon as they are committed
_EARLY_POOL = 64  # batched samples kept until that many are committed


class _EarlyCheck:
    """The first batched samples, checked as soon as their files are committed, so a padding
    or batching fault stops the command after its first batches instead of after a multi-day
    run (the full ``--verify`` still runs at the end). Samples that ran alone (a batch of one)
    are not taken: nothing in them differs from the check."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool: dict[int, tuple[float, SampleRow]] = {}
        self.pending = n > 0

    def offer(self, batch: list[SampleRow], width: int) -> None:
        if not self.pending or len(batch) < 2 or len(self.pool) >= _EARLY_POOL:
            return
        for s in batch:
            self.pool[s.row] = (1.0 - len(s.input_ids) / width, s)

    def ready(self, committed: dict[int, int]) -> list[SampleRow]:
        """The samples to check now (the most padded of those committed), once; else []."""
        if not self.pending:
            return []
        got = [(p, s) for row, (p, s) in self.pool.items() if row in committed]
        if len(got) < self.n:
            return []
        self.pending = False
        got.sort(key=lambda ps: (-ps[0], ps[1].row))
        return [s for _, s in got[: self.n]]


def hidden_states(
    config: HiddenConfig, *, opener: Opener | None = None, log: Log | None = _stderr
) -> HiddenSummary:
    """Run the stage (see the module docstring); the summary of this command.

    ConfigError / InputError / RunMismatchError / LeaseHeldError for what the user fixes,
    VerificationError when the written states fail the verification."""
    say: Log = log if log is not None else (lambda _line: None)
    config = config.validate()
    # -- check
    open_input(config.tokenized)
    writer = writer_for(config.format, dtype=config.dtype, compress=config.compress)
    engine = engine_named(config.engine)
    facts = read_model_facts(config.model)
    capture = Capture(parse_layers(config.layers, facts.num_layers), writer.capture_last)
    max_length = config.max_length or facts.max_positions
    refuse_protected(config.out, config.protect, what="--out")
    store = open_store(config.out, protect=config.protect)
    devices = engine.devices(config.gpus)
    # -- plan
    plan = make_plan(config.tokenized, max_length)
    if plan.samples == 0:
        raise InputError(
            f"{config.tokenized}: no samples to compute ({_dropped_text(plan) or 'none read'})"
        )
    settings = HiddenSettings(
        format=config.format,
        dtype=config.dtype,
        compress=config.compress,
        aux_layers=list(capture.aux),
        last=capture.last,
        max_length=max_length,
        model=model_identity(config.model, facts),
        dataset=DatasetIdentity(
            url=config.tokenized, samples=plan.samples, tokens=plan.tokens, sha256=plan.sha256
        ),
    )
    # -- bill
    bill = make_bill(writer, plan.num_tokens, capture.count, facts.hidden_size)
    say(f"hidden-states: {bill.line()}")
    say(f"hidden-states: layers {capture.describe(facts.num_layers)}, {config.format} files")
    check_budget(bill, config.max_bytes)
    # -- claim
    check_prefix(store)
    part = parse_partition(config.partition) if config.partition is not None else None
    lease = acquire(store, scope_of(part), ttl=config.lease_ttl, wait=config.lease_wait)
    # a signal ends it in one line (Interrupted), its committed files kept: one device or many
    with interrupts():
        try:
            # one walk of the states folder: the temps a killed command left go, and what is
            # left is the done-set (the lease keeps this partition's rows ours meanwhile)
            listing, (swept, swept_bytes) = store.sweep_and_list_sizes(HIDDEN_FOLDER)
            if swept:
                say(
                    f"hidden-states: removed {swept:,} temp file(s) ({human_bytes(swept_bytes)}) "
                    "that a killed command left"
                )
            open_manifest(store, settings)
            _dataset_files(store, writer, plan)
            write_index(store, plan.index_table([writer.key(r) for r in range(plan.samples)]))
            return _run(
                config,
                store,
                lease,
                writer,
                engine.open if opener is None else opener,
                devices,
                facts,
                capture,
                plan,
                bill.sample_bytes,
                say,
                listing,
            )
        finally:
            lease.release()


def _dataset_files(store: Store, writer: Writer, plan: Plan) -> None:
    """The files a trainer reads beside the sample files (speculators' dataset), once."""
    if writer.format != "speculators" or store.exists(SPECULATORS_DONE):
        return
    with tempfile.TemporaryDirectory(prefix="draftdata-hidden-") as tmp:
        for key, path in writer.dataset_files(iter_rows(plan), Path(tmp)):
            store.put_new_file(key, path)
            path.unlink()


def _dropped_text(plan: Plan) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(plan.dropped.items()))


def _run(
    config: HiddenConfig,
    store: Store,
    lease: Lease,
    writer: Writer,
    opener: Opener,
    devices: list[str],
    facts: ModelFacts,
    capture: Capture,
    plan: Plan,
    bill_bytes: int,
    say: Log,
    listing: dict[str, int],
) -> HiddenSummary:
    """The run, verify and finish phases; ``listing`` is the states folder's (key -> size)
    as the start found it."""
    from draftdata.hidden.commit import Commits

    started = time.perf_counter()
    done = Commits(store, writer).done_rows(listing)
    done_before = len(done)
    todo = set(range(plan.samples)) - set(done)
    if config.partition is not None:  # the other partitions' rows are other commands' work
        part = parse_partition(config.partition)
        todo = {r for r in todo if part.contains(plan.ids[r])}
    if config.pilot is not None:
        todo = rows_of_pilot(plan, config.pilot, todo)
    if plan.dropped:
        say(f"hidden-states: left out: {_dropped_text(plan)}")
    say(
        f"hidden-states: {len(done):,} of {plan.samples:,} samples already in {store.url}; "
        f"{len(todo):,} to compute on {', '.join(devices)}"
        + (" (pilot)" if config.pilot is not None else "")
    )
    spec = WorkerSpec(
        backend=BackendSpec(
            model=config.model,
            capture=capture,
            dtype=None if config.compute_dtype == "auto" else config.compute_dtype,
            options=dict(config.options),
        ),
        opener=opener,
        out=config.out,
        protect=tuple(config.protect),
        format=config.format,
        dtype=config.dtype,
        compress=config.compress,
        staging_bytes=max(1 << 20, config.staging_bytes // len(devices)),
        lease=(lease.scope, lease.gen),
    )
    todo_tokens = int(sum(int(plan.num_tokens[r]) for r in todo))
    candidates = _Candidates(config.verify)
    early = _EarlyCheck(min(config.verify, EARLY_SAMPLES))
    written = already = tokens_written = bytes_written = 0
    predicted_written = 0
    run_seconds = 0.0
    with Workers(spec, devices, lease) as workers:
        if (workers.facts.num_layers, workers.facts.hidden_size) != (
            facts.num_layers,
            facts.hidden_size,
        ):
            raise ConfigError(
                f"--model {config.model}: the engine loaded {workers.facts.num_layers} layers × "
                f"{workers.facts.hidden_size}, its config.json says {facts.num_layers} × "
                f"{facts.hidden_size}"
            )
        progress = Progress(len(todo), todo_tokens, show=say if config.progress else None)

        def account(results: list[BatchResult]) -> None:
            nonlocal written, already, tokens_written, bytes_written, predicted_written
            for r in results:
                new = [(row, size) for row, size, created in r.committed if created]
                already += len(r.committed) - len(new)
                t = sum(int(plan.num_tokens[row]) for row, _ in new)
                b = sum(size for _, size in new)
                written += len(new)
                tokens_written += t
                bytes_written += b
                predicted_written += sum(
                    writer.predicted_bytes(
                        int(plan.num_tokens[row]), capture.count, facts.hidden_size
                    )
                    for row, _ in new
                )
                for row, size in new:
                    done[row] = size
                progress.add(len(new), t, b)

        names = _layer_names(capture, facts.num_layers)
        tol = tolerance(config.dtype, workers.facts.dtype)

        def check(
            chosen: list[SampleRow], when: str
        ) -> tuple[Verification, list[LayerCheck] | None]:
            checks = workers.verify(chosen, fp8=config.dtype == "fp8")
            verification, fp8_error, failure = summarise(checks, names, tol)
            _show_verification(say, verification, when)
            if failure is not None:
                raise VerificationError(
                    f"{store.url}: verification failed{when}: {failure}; the engine's batched "
                    "states are wrong (padding, positions or batching), so the files this "
                    "command wrote cannot be trusted: fix the engine or its settings "
                    "(--batch-tokens 1 runs one sample at a time) and write to a new --out"
                )
            return verification, fp8_error

        t0 = time.perf_counter()
        paused = 0.0  # the early check's time is not the run's
        if todo:
            for window in windows(iter_rows(plan), todo):
                for batch in batches(window, config.batch_tokens):
                    width = max(len(s.input_ids) for s in batch)
                    for s in batch:
                        candidates.offer(s, 1.0 - len(s.input_ids) / width)
                    early.offer(batch, width)
                    workers.submit(batch)
                    account(list(workers.results()))
                    first = early.ready(done)
                    if first:
                        t1 = time.perf_counter()
                        check(first, " after the first batches")
                        paused += time.perf_counter() - t1
            workers.flush()
            account(list(workers.results()))
        run_seconds = time.perf_counter() - t0 - paused
        # -- verify
        verification = fp8_error = None
        if config.verify > 0 and done:
            pool = candidates.samples()
            pool = {r: v for r, v in pool.items() if r in done}
            if pool:
                rows = choose_rows({r: p for r, (_, p) in pool.items()}, [], config.verify)
                chosen = [pool[r][0] for r in rows]
            else:  # nothing written now: a few of the files already there
                picked = set(choose_rows({}, list(done), config.verify))
                chosen = [s for s in iter_rows(plan) if s.row in picked]
            verification, fp8_error = check(chosen, "")
    summary = HiddenSummary(
        out=store.url,
        trainer_format=config.format,
        model=config.model,
        layers=capture.describe(facts.num_layers),
        dtype=config.dtype,
        engine=config.engine,
        devices=devices,
        planned=plan.samples,
        tokens=plan.tokens,
        dropped=dict(plan.dropped),
        truncated=int(plan.truncated.sum()),
        done_before=done_before,
        written=written,
        already_there=already,
        remaining=plan.samples - len(done),
        tokens_written=tokens_written,
        bytes_written=bytes_written,
        bytes_total=sum(done.values()),
        bill_bytes=bill_bytes,
        elapsed_s=round(time.perf_counter() - started, 3),
        tokens_per_s=round(tokens_written / run_seconds, 1) if run_seconds > 0 else 0.0,
        verification=verification,
        fp8_error=fp8_error,
        compression_ratio=(
            round(bytes_written / predicted_written, 4)
            if config.compress != "none" and predicted_written
            else None
        ),
    )
    if config.pilot is not None:
        left = plan.tokens - int(sum(int(plan.num_tokens[r]) for r in done))
        summary.pilot = {
            "samples": written,
            "tokens": tokens_written,
            "tokens_per_s": summary.tokens_per_s,
            "devices": devices,
            "tokens_left": left,
            "eta_s": round(left / summary.tokens_per_s, 1) if summary.tokens_per_s > 0 else None,
        }
        say(f"hidden-states: {eta_line(summary.tokens_per_s, devices, left)}")
    if summary.complete:
        write_summary(store, summary)
    say(
        f"hidden-states: {written:,} samples written ({human_bytes(bytes_written)}), "
        f"{plan.samples - summary.remaining:,}/{plan.samples:,} done"
    )
    return summary


def _show_verification(say: Log, v: Verification, when: str) -> None:
    worst = max(v.layers, key=lambda lc: lc.rms_rel)
    say(
        f"hidden-states: verified {v.samples} samples one at a time{when}: worst layer "
        f"{worst.layer} "
        f"rms {worst.rms_rel:.3%}, max abs {worst.max_abs:.3g} (tolerance {v.tolerance:.1%} rms)"
    )
