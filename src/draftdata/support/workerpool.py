"""Process pools whose workers end with their parent (``tokenize`` and ``merge`` ``--workers``),
and the signal handling a command without workers shares (``interrupts``).

A bare ``ProcessPoolExecutor`` outlives a parent that dies: its spawned workers block on their
queues for ever, and they and multiprocessing's resource tracker keep the parent's stdout and
stderr open, so ``draftdata tokenize --workers 2 ... | tee log`` never returns after a SIGTERM;
after a SIGINT the parent itself waits for every queued task before it exits. ``worker_pool``
binds the workers to the process that started them:

- In each worker: SIGINT is ignored (a Ctrl-C reaches the whole process group; the parent
  decides); on Linux ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the worker when its parent
  dies (kill -9 included); a thread polls the parent's pid every ``WATCH_S`` seconds as well
  (other systems, a worker busy in C code when the signal came, and the moment between the
  spawn and the ``prctl``).
- In the parent, while the pool is open (main thread, and only where SIGINT and SIGTERM still
  have Python's default handlers): SIGINT and SIGTERM SIGKILL the workers at once and raise
  ``Interrupted``; a second signal while that unwinds ends the process at once
  (``os._exit(128 + signal)``): the workers are already gone.
- Leaving the pool by an exception (``Interrupted``, an error, a closed generator) kills the
  workers instead of waiting for their queued tasks: what they write is create-only and a rerun
  of the command redoes it. A normal exit waits for them as usual.

- A worker that dies while the pool is open (the out-of-memory killer, a crash) ends the block
  with ``WorkerDiedError``, which says how it died; ``_DeathWatch`` makes sure the pool notices
  even when the worker died halfway through sending a result (see its docstring), and a block
  left by an exception closes the same pipe end after killing its workers, for the same reason.

The resource tracker needs nothing: it exits by itself once every process holding its pipe has
gone. The workers are started by the thread that submits the first tasks (Python 3.11 spawns
them on demand); ``PR_SET_PDEATHSIG`` follows that thread, so a pool is used by the thread that
opened it, which outlives it (``with``).

The command line opens one ``interrupts`` block around the whole command (``last=True``), so a
signal that lands anywhere, in the work or while the summary is printed, ends the same way; a
stage's own block inside it adds its action to that one handler. This module does not decide
what a stage does with an interruption; the CLI prints it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from multiprocessing.connection import wait as wait_for
from types import FrameType, TracebackType
from typing import Any, ParamSpec, TypeVar

from draftdata.errors import Interrupted, WorkerDiedError

_P = ParamSpec("_P")
_T = TypeVar("_T")

WATCH_S = 0.2  # how often a worker looks whether its parent is still there (and the parent
# whether its workers are)
_DEAD_WITHIN_S = 5.0  # a SIGKILLed worker is gone within this (it cannot delay its end)
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In a worker: end this process when ``parent`` is gone (see the module docstring)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCH_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="draftdata-parent-watch", daemon=True).start()


def _bound_init(
    parent: int, initializer: Callable[..., object] | None, initargs: tuple[Any, ...]
) -> None:
    global _START_ERROR
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    if initializer is not None:
        try:
            initializer(*initargs)
        except Exception as exc:  # every task raises it (``_task``): the caller's error, not
            _START_ERROR = (exc, exc.__traceback__)  # a worker that died (the pool's own
            # handling ends the worker)


# in a worker: what its initializer raised, if it failed, and where (each task raises it
# from there: the pool clears the traceback of an error it sends, so the second task's lost it)
_START_ERROR: tuple[Exception, TracebackType | None] | None = None


def _task(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """In a worker: run ``fn``, or raise what the worker's initializer raised (a model that
    could not load on that device: the command says so, instead of "a worker died"). An
    error that would not arrive as itself is raised as ``RuntimeError`` naming its type and
    message (``_portable``)."""
    try:
        if _START_ERROR is not None:
            raise _START_ERROR[0].with_traceback(_START_ERROR[1])
        return fn(*args, **kwargs)
    except Exception as exc:
        portable = _portable(exc)
        if portable is exc:
            raise
        raise portable from exc  # (the text of its traceback travels: ``__cause__``)


def _portable(exc: Exception) -> Exception:
    """``exc``, if the parent gets it back from a pickle as it is; else a ``RuntimeError`` that
    names it. The pool sends a task's error pickled: one that does not pickle (it holds a lock)
    came back as that pickling error, and one that does not unpickle (its ``__init__`` takes
    other arguments than ``args``) broke the pool, said as "a worker process died"."""
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # any failure: it does not travel
        pass
    return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


def _workers(pool: ProcessPoolExecutor) -> list[Any]:
    """The worker processes ``pool`` started (its private map; none once it is shut down)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL every worker process of ``pool`` (safe in a signal handler, idempotent)."""
    for proc in _workers(pool):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()


_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class _Interrupts:
    """The handler ``interrupts`` installs, and what the open blocks asked it to do."""

    def __init__(self, farewell: Callable[[int], None] | None = None) -> None:
        self.on_signal: list[Callable[[], None]] = []  # of the open blocks, innermost last
        self.seen: list[int] = []
        self.farewell = farewell  # says how a second signal ended the process
        self.holding = 0  # the main thread is in a pool's submit (``_signals_held``)
        self.deferred: int | None = None  # a first signal that came meanwhile

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.holding and not self.seen and self.deferred is None:
            self.deferred = signum  # acted on as the submit ends (``_signals_held``)
            return
        for act in reversed(self.on_signal):
            act()
        if self.seen or self.deferred is not None:
            if self.farewell is not None:
                with contextlib.suppress(Exception):
                    self.farewell(signum)
            os._exit(128 + signum)
        self.seen.append(signum)
        raise Interrupted(signum)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """In the main thread, under ``interrupts``: a first SIGINT or SIGTERM that lands in the
    block is acted on as the block ends (a second one still ends the process at once).

    A pool's ``submit`` spawns a worker; a signal that landed in the spawn left a child that
    had not been sent its start-up data (it held the pool's task pipe open and read nothing,
    so the pool's feeder thread and its shutdown waited for ever), or one started but not yet
    in the pool's list of workers (no kill reached it, and multiprocessing's exit handler
    joined it for ever)."""
    handler = signal.getsignal(signal.SIGINT)
    if not isinstance(handler, _Interrupts) or (
        threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    handler.holding += 1
    try:
        yield
    finally:
        handler.holding -= 1
        if not handler.holding and handler.deferred is not None:
            signum, handler.deferred = handler.deferred, None
            handler(signum, None)  # its actions (kill the workers), then Interrupted


class _BoundPool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` whose ``submit`` (which spawns the workers) a signal does not
    cut in two (``_signals_held``)."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        with _signals_held():
            return super().submit(_task, fn, *args, **kwargs)


def signals_free() -> bool:
    """Whether SIGINT and SIGTERM are free for a stage to take over for a while (generate's
    event loop): they have Python's default handlers or ``interrupts``' handler, not a
    notebook's or Ray's own, and this is the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    return all(
        signal.getsignal(s) is h or isinstance(signal.getsignal(s), _Interrupts)
        for s, h in _DEFAULTS.items()
    )


def _only_daemons_left() -> bool:
    """No thread but this one will hold the interpreter's exit (it joins non-daemon threads)."""
    me = threading.current_thread()
    return all(t is me or t.daemon or not t.is_alive() for t in threading.enumerate())


@contextlib.contextmanager
def interrupts(
    on_signal: Callable[[], None] | None = None,
    *,
    farewell: Callable[[int], None] | None = None,
    last: bool = False,
) -> Iterator[None]:
    """While open: SIGINT/SIGTERM call ``on_signal`` (a pool's: kill its workers) and raise
    Interrupted (the first) or end the process with 128 + the signal (any later one, after
    ``farewell(signum)`` has said so), so a command says how it stopped whether it runs worker
    processes or not (``tokenize --workers 1``). Installed only in the main thread, and only
    over Python's default handlers (a notebook's or Ray's own handlers are left alone); a
    block opened inside another (a pool inside a command's block) adds its ``on_signal`` to
    the one handler, so every open block's action runs.

    ``last``: the block is the program's last word (the CLI's, around a whole command): on
    leaving it SIGINT and SIGTERM are ignored rather than given back, so one that lands while
    the interpreter shuts down, after everything was said and flushed, neither kills it
    silently (Python's defaults) nor prints a traceback; the command ends as it would have.
    Where a non-daemon thread is still running (the interpreter would wait for it), the
    defaults are given back instead, so a signal can still end the wait."""
    current = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if isinstance(current, _Interrupts):  # inside an open block: add this one's action
        if on_signal is not None:
            current.on_signal.append(on_signal)
        try:
            yield
        finally:
            if on_signal is not None:
                current.on_signal.remove(on_signal)
        return
    if any(signal.getsignal(s) is not h for s, h in _DEFAULTS.items()):
        yield
        return
    handler = _Interrupts(farewell)
    if on_signal is not None:
        handler.on_signal.append(on_signal)
    previous = {s: signal.signal(s, handler) for s in _DEFAULTS}
    try:
        yield
    finally:
        ignore = last and _only_daemons_left()
        for s, h in previous.items():
            signal.signal(s, signal.SIG_IGN if ignore else h)


@contextlib.contextmanager
def worker_pool(
    workers: int,
    initializer: Callable[..., object] | None = None,
    initargs: tuple[Any, ...] = (),
    *,
    fewer: str = "fewer --workers use",
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``workers`` spawned processes bound to this one (see the
    module docstring); ``initializer(*initargs)`` runs in each worker first. A worker that dies
    (the kernel's out-of-memory killer, a crash in C code) ends the block with
    ``WorkerDiedError``, which names how it died (and after a SIGKILL, that ``fewer`` ...
    less memory: the command's option, ``--workers`` or hidden-states' ``--gpus``)."""
    pool = _BoundPool(
        max_workers=workers,
        mp_context=get_context("spawn"),
        initializer=_bound_init,
        initargs=(os.getpid(), initializer, initargs),
    )
    watch = _DeathWatch(pool)
    with interrupts(lambda: kill_workers(pool)):
        try:
            yield pool
        except BaseException as exc:
            watch.stop()
            watch.note_dead()  # before the kill: the ones that died by themselves
            # this pool is the one that broke (a pool beside it, closed with the same error,
            # passes it on unchanged: hidden-states' pool per device; it breaks on the kill)
            broke = bool(watch.dead or getattr(pool, "_broken", False))
            kill_workers(pool)
            _unstick(pool)
            try:
                pool.shutdown(wait=True, cancel_futures=True)
            except RuntimeError:  # a signal landed in the first submit, between the pool's
                # manager thread made and started: there is no thread to wait for
                pool.shutdown(wait=False, cancel_futures=True)
            if isinstance(exc, BrokenProcessPool) and broke:
                raise WorkerDiedError(watch.how_died(fewer)) from exc
            raise
        watch.stop()
        pool.shutdown(wait=True)


class _DeathWatch:
    """A thread that watches a pool's workers for one that dies while the pool is open.

    ``ProcessPoolExecutor`` learns of a dead worker from its process sentinel, unless the worker
    died while it wrote a result: the pool's manager thread then waits in ``recv`` for the rest
    of that message, which never comes (this process holds the write end of the result pipe as
    well, so no end of file either), and every future and ``shutdown(wait=True)`` wait for ever.
    This thread marks the pool broken (no new worker is spawned), kills the other workers and
    closes this process's write end, so that read ends and the pool fails its futures with
    ``BrokenProcessPool``, as it does for any other death.
    """

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self.pool = pool
        self.dead: list[Any] = []  # the multiprocessing.Process objects found dead
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()  # stop() ends the thread's wait at once
        self._thread = threading.Thread(
            target=self._run, name="draftdata-worker-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """End the thread (before the pool is shut down: a shutdown's workers end normally)."""
        if self._stopping:
            return
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while not self._stopping:
            procs = _workers(self.pool)
            # the workers are spawned as tasks come: look again for new ones now and then
            ready = wait_for([self._wake_r, *(p.sentinel for p in procs)], timeout=WATCH_S)
            if self._stopping or self._wake_r in ready:
                return
            if ready:
                self.dead = [p for p in procs if p.sentinel in ready]
                _mark_broken(self.pool)
                kill_workers(self.pool)
                _unstick(self.pool)
                return

    def note_dead(self) -> None:
        """Note the workers dead now, if the thread found none (the pool saw the death first)."""
        if self.dead:
            return
        procs = _workers(self.pool)
        with contextlib.suppress(OSError, ValueError):
            ready = wait_for([p.sentinel for p in procs], timeout=0)
            self.dead = [p for p in procs if p.sentinel in ready]

    def how_died(self, fewer: str = "fewer --workers use") -> str:
        """One line: how the worker died (after the pool's shutdown has reaped it). The pool
        SIGTERMs the other workers when one dies: such endings count only if all are such."""
        codes = [p.exitcode for p in self.dead]
        if any(c != -signal.SIGTERM for c in codes):
            codes = [c for c in codes if c != -signal.SIGTERM]
        ends = sorted({_ending(c) for c in codes}) or ["died"]
        hint = ""
        if -signal.SIGKILL in codes:
            hint = (
                " (SIGKILL is how the kernel's out-of-memory killer ends a process: "
                f"{fewer} less memory)"
            )
        return (
            f"a worker process of this command {' / '.join(ends)}{hint}; what was written is "
            "kept, and the same command run again finishes the work"
        )


def _ending(code: int | None) -> str:
    if code is None:
        return "died"
    if code == 0:
        return "ended unasked (an error in its start-up is printed above)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _mark_broken(pool: ProcessPoolExecutor) -> None:
    """Mark ``pool`` broken (its next ``submit`` raises ``BrokenProcessPool`` instead of spawning
    a worker that would need the result pipe's write end)."""
    lock = getattr(pool, "_shutdown_lock", None)
    if lock is None or not hasattr(pool, "_broken"):
        return
    with lock:
        if not pool._broken:
            pool._broken = "a worker process died; the pool is not usable any more"  # type: ignore[assignment]


def _unstick(pool: ProcessPoolExecutor) -> None:
    """Once the workers are dead (killed just before, or found dead), close this process's write
    end of the pool's result pipe, so a read of a result a dying worker had begun to write ends
    (end of file) instead of waiting for the rest for ever (see ``_DeathWatch``)."""
    sentinels = [p.sentinel for p in _workers(pool)]
    deadline = time.monotonic() + _DEAD_WITHIN_S
    with contextlib.suppress(OSError, ValueError):
        while sentinels and time.monotonic() < deadline:  # sentinels: no reaping (the pool's)
            ended = wait_for(sentinels, timeout=deadline - time.monotonic())
            sentinels = [s for s in sentinels if s not in ended]
    if sentinels:  # one is not dead yet: it may still write
        return
    queue = getattr(pool, "_result_queue", None)
    writer = getattr(queue, "_writer", None)
    if writer is not None:
        with contextlib.suppress(OSError):
            writer.close()
