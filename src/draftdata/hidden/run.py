"""The workers: one backend per device, each running forward passes, encoding and committing.

``Workers(spec, devices)`` opens one worker per device: in this process when there is one
device (the CPU, one GPU, a fleet engine), else one spawned process per device
(``workerpool.worker_pool``: a worker dies with the command, kill -9 included). A worker holds
its backend, the format's writer and its own commit uploader; it is given whole batches and
writes their files itself, so the states never cross a process boundary (a 32B target's
states are ~41 KB a token). What comes back is small: which rows were committed, their sizes,
the time spent.

- ``submit(batch)`` hands a batch to the least busy worker, at most ``DEPTH`` batches queued
  per worker (so the next batch waits while the current one computes), blocking otherwise;
  ``results()`` yields what finished since it was last called.
- ``flush()`` waits for every batch and every queued commit of every worker.
- ``verify(samples)`` recomputes each sample alone on a worker and compares it with its file
  read back from the store (``verify.py``).

A worker process checks before every commit that the command's lease was not taken over
(``LeaseWatch``: the next generation's claim is absent); the heartbeats are the command's own
(``stage.py``), so a worker of a command frozen past the lease's TTL writes nothing after a
takeover. In this process the command's ``Lease`` itself is checked.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from draftdata.errors import LeaseLostError
from draftdata.hidden.backend import Backend, BackendSpec, ModelFacts, Opener
from draftdata.hidden.commit import Commits, Uploader
from draftdata.hidden.verify import SampleCheck, compare_sample, fp8_sums
from draftdata.hidden.writer import Compression, SampleRow, StoredDtype
from draftdata.hidden.writers import writer_for
from draftdata.store.base import Store
from draftdata.store.lease import LEASE_PREFIX, Lease
from draftdata.store.opener import open_store

DEPTH = 2  # batches queued per worker


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs (picklable): the backend to open, the engine's opener, the
    output and its format, the staging bound, and the lease (scope, generation) to watch."""

    backend: BackendSpec
    opener: Opener
    out: str
    protect: tuple[str, ...]
    format: str
    dtype: StoredDtype
    compress: Compression
    staging_bytes: int
    lease: tuple[str, int] | None = None


@dataclass
class BatchResult:
    """What a worker did since its last report: ``committed`` (row, bytes, created) of files
    now in the store, ``tokens`` and ``seconds`` of the forward passes and encodes it ran."""

    committed: list[tuple[int, int, bool]] = field(default_factory=list)
    tokens: int = 0
    samples: int = 0
    seconds: float = 0.0


class LeaseWatch:
    """A worker process's view of the command's lease: lost once the next claim exists."""

    def __init__(self, store: Store, scope: str, gen: int) -> None:
        self.store = store
        self.key = f"{LEASE_PREFIX}{scope}/{gen + 1:08d}/claim"

    def check(self) -> None:
        """LeaseLostError when another command has taken the set's lease over."""
        if self.store.exists(self.key):
            raise LeaseLostError(
                f"{self.store.url}: lost the set's lease (another command took it over); "
                "this worker stops committing"
            )


class WorkerState:
    """One worker's backend, writer and uploader (in a worker process: the module's
    ``_STATE``)."""

    def __init__(self, spec: WorkerSpec, lease: Lease | LeaseWatch | None) -> None:
        self.spec = spec
        self.backend: Backend = spec.opener(spec.backend)
        self.writer = writer_for(spec.format, dtype=spec.dtype, compress=spec.compress)
        self.store = open_store(spec.out, protect=spec.protect)
        if lease is None and spec.lease is not None:
            lease = LeaseWatch(self.store, *spec.lease)
        self.commits = Commits(self.store, self.writer, lease)
        self._done: list[tuple[int, int, bool]] = []
        self.uploader = self._uploader()

    def _uploader(self) -> Uploader:
        return Uploader(self.commits, self.spec.staging_bytes, on_done=self._record)

    def _record(self, row: int, size: int, created: bool) -> None:
        self._done.append((row, size, created))  # list.append is atomic under the GIL

    def facts(self) -> ModelFacts:
        """The backend's model facts."""
        return self.backend.facts

    def run_batch(self, batch: list[SampleRow]) -> BatchResult:
        """Forward ``batch``, encode each sample's file and queue its commit."""
        t0 = time.perf_counter()
        states = self.backend.states([s.input_ids for s in batch])
        for sample, st in zip(batch, states, strict=True):
            self.uploader.submit(sample.row, self.writer.encode(sample, st))
        return BatchResult(
            committed=self._take(),
            tokens=sum(len(s.input_ids) for s in batch),
            samples=len(batch),
            seconds=time.perf_counter() - t0,
        )

    def _take(self) -> list[tuple[int, int, bool]]:
        done, self._done = self._done, []
        return done

    def flush(self) -> BatchResult:
        """Wait for every queued commit; report them."""
        self.uploader.close()
        self.uploader = self._uploader()
        return BatchResult(committed=self._take())

    def verify(self, sample: SampleRow, fp8: bool) -> SampleCheck:
        """Recompute ``sample`` alone and compare with its file in the store."""
        fresh = self.backend.states([sample.input_ids])[0]
        stored = self.writer.decode(self.store.read(self.writer.key(sample.row)))
        check = compare_sample(
            sample.row,
            sample.input_ids,
            sample.loss_mask,
            stored.input_ids,
            stored.loss_mask,
            stored.states,
            fresh,
        )
        if fp8 and check.mismatch is None:
            check.fp8 = fp8_sums(fresh)
        return check

    def close(self) -> None:
        """Stop the uploader (queued files are dropped) and close the backend."""
        self.uploader.abandon()
        self.backend.close()


# -- in a worker process ----------------------------------------------------------------------

_STATE: WorkerState | None = None


def _init(spec: WorkerSpec) -> None:
    global _STATE
    _STATE = WorkerState(spec, None)


def _call(method: str, *args: Any) -> Any:
    assert _STATE is not None, "worker not initialised"
    return getattr(_STATE, method)(*args)


class _Local:
    """A worker in this process: calls run at once and return finished futures."""

    def __init__(self, spec: WorkerSpec, lease: Lease | None) -> None:
        self.state = WorkerState(spec, lease)

    def submit(self, method: str, *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(getattr(self.state, method)(*args))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut

    def close(self) -> None:
        self.state.close()


class _Remote:
    """A worker process (a one-process pool bound to this one)."""

    def __init__(self, spec: WorkerSpec, stack: contextlib.ExitStack) -> None:
        from draftdata.support.workerpool import worker_pool

        fewer = "fewer devices in --gpus use"
        self.pool = stack.enter_context(worker_pool(1, _init, (spec,), fewer=fewer))

    def submit(self, method: str, *args: Any) -> Future[Any]:
        return self.pool.submit(_call, method, *args)

    def close(self) -> None:
        self.pool.submit(_call, "close").result()


class Workers:
    """One worker per device (see the module docstring); a context manager."""

    def __init__(self, spec: WorkerSpec, devices: list[str], lease: Lease | None) -> None:
        self._stack = contextlib.ExitStack()
        self._workers: list[_Local | _Remote] = []
        self._inflight: list[list[Future[BatchResult]]] = []
        self._finished: list[BatchResult] = []
        try:
            if len(devices) == 1:
                self._workers.append(_Local(_on(spec, devices[0]), lease))
            else:
                for d in devices:
                    self._workers.append(_Remote(_on(spec, d), self._stack))
            self._inflight = [[] for _ in self._workers]
            # open every backend now (the processes' initialisers), and learn the facts
            facts = [w.submit("facts") for w in self._workers]
            self.facts: ModelFacts = facts[0].result()
            for f in facts[1:]:
                f.result()
        except BaseException as exc:
            # the error goes into the pools (``worker_pool``): they kill their workers instead
            # of waiting for the queued work, and a worker's death says how it died
            self._stack.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __enter__(self) -> Workers:
        return self

    def __exit__(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for w in self._workers:
                if typ is None or isinstance(w, _Local):  # on an error: queued files are
                    w.close()  # dropped, not waited for; the backend closed all the same (the
                    # vllm engine's connections and thread; its cancelled requests' files)
        except BaseException as exc:  # a worker that died as it was closed, included
            typ, value, tb = type(exc), exc, exc.__traceback__
            raise
        finally:
            # worker processes: the error goes into their pools (``close()`` would say there
            # was none): they are killed rather than waited for, and a worker that died ends
            # the command with ``WorkerDiedError`` (how it died) instead of ``BrokenProcessPool``
            self._stack.__exit__(typ, value, tb)

    def _collect(self, block: bool) -> None:
        pending = [f for fs in self._inflight for f in fs]
        if block and pending and all(f.running() or not f.done() for f in pending):
            wait(pending, return_when=FIRST_COMPLETED)
        for fs in self._inflight:
            for f in [f for f in fs if f.done()]:
                fs.remove(f)
                self._finished.append(f.result())

    def submit(self, batch: list[SampleRow]) -> None:
        """Queue ``batch`` on the least busy worker (blocks while all are ``DEPTH`` deep)."""
        self._collect(block=False)
        while min(len(fs) for fs in self._inflight) >= DEPTH:
            self._collect(block=True)
        i = min(range(len(self._workers)), key=lambda k: len(self._inflight[k]))
        self._inflight[i].append(self._workers[i].submit("run_batch", batch))

    def results(self) -> Iterator[BatchResult]:
        """What finished since the last call."""
        self._collect(block=False)
        done, self._finished = self._finished, []
        yield from done

    def flush(self) -> None:
        """Wait for every batch and commit of every worker (then ``results`` has them)."""
        while any(self._inflight):
            self._collect(block=True)
        for f in [w.submit("flush") for w in self._workers]:
            self._finished.append(f.result())

    def verify(self, samples: list[SampleRow], fp8: bool) -> list[SampleCheck]:
        """Each sample recomputed alone on a worker and compared with its file."""
        futures = [
            self._workers[i % len(self._workers)].submit("verify", s, fp8)
            for i, s in enumerate(samples)
        ]
        return [f.result() for f in futures]


def _on(spec: WorkerSpec, device: str) -> WorkerSpec:
    from dataclasses import replace

    return replace(spec, backend=replace(spec.backend, device=device))
