"""A pool of ``worker_pool`` ends within a bound whatever ends it, and at whatever moment:
a worker SIGKILLed from outside (the out-of-memory killer), an error in the caller, a SIGINT.

The moment that used to hang: a worker killed while it writes a result. The pool's manager
thread then waits for the rest of that message for ever (this process holds the result pipe's
write end too, so no end of file comes), and with it every future and ``shutdown(wait=True)``:
``merge --workers 2`` hung after a Ctrl-C. Here every result is 8 MB, so a worker spends most
of its time writing one and a kill at a random moment lands mid-message most of the time.

Each case runs in its own process (a hung pool would hold pytest's exit: the pool's manager
thread is joined at interpreter exit), in a new session, found and killed by its session id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.signals import default_signals, session_processes

pytestmark = pytest.mark.chaos

ENDS_WITHIN_S = 30.0  # from the moment to the process's exit (a loaded 2-core box)

PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from draftdata.errors import Interrupted, WorkerDiedError
    from draftdata.support.workerpool import interrupts, worker_pool

    how, delay = sys.argv[1], float(sys.argv[2])
    RESULT = 8_000_000  # bytes: a result written in many pipe-sized pieces

    def at_the_moment(act):
        threading.Timer(delay, act).start()

    try:
        with interrupts(), worker_pool(2) as pool:
            if how == "kill a worker":
                def kill():
                    procs = list(pool._processes.values())
                    os.kill(procs[0].pid, signal.SIGKILL)
                # the workers are spawned by the first submits
                window = [pool.submit(bytes, RESULT) for _ in range(4)]
                at_the_moment(kill)
            elif how == "SIGINT":
                window = [pool.submit(bytes, RESULT) for _ in range(4)]
                at_the_moment(lambda: os.kill(os.getpid(), signal.SIGINT))
            elif how == "SIGTERM as the workers spawn":
                at_the_moment(lambda: os.kill(os.getpid(), signal.SIGTERM))
                window = [pool.submit(bytes, RESULT) for _ in range(4)]
            else:
                window = [pool.submit(bytes, RESULT) for _ in range(4)]
            start = time.monotonic()
            while True:
                window.pop(0).result()
                window.append(pool.submit(bytes, RESULT))
                if how == "an error" and time.monotonic() - start > delay:
                    raise RuntimeError("the caller failed")
    except WorkerDiedError as exc:
        print("died:", exc, flush=True)
    except Interrupted as exc:
        print("interrupted:", exc.signame, flush=True)
    except RuntimeError as exc:
        print("raised:", exc, flush=True)
    """
)

EXPECTED = {
    "kill a worker": "died: a worker process of this command was killed by SIGKILL (SIGKILL is",
    "an error": "raised: the caller failed",
    "SIGINT": "interrupted: SIGINT",
    "SIGTERM as the workers spawn": "interrupted: SIGTERM",
}
SPAWN_S = 0.06  # a spawn (fork, exec, its start-up data written) lands in this from the start


def _run(how: str, delay: float) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, how, str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_signals,
    )
    try:
        out, _ = proc.communicate(timeout=ENDS_WITHIN_S + delay)
    except subprocess.TimeoutExpired:
        stuck = [" ".join(p.cmdline()[-2:]) for p in session_processes(proc.pid)]
        pytest.fail(f"{how} at {delay:.3f} s: still running {ENDS_WITHIN_S:g} s on: {stuck}")
    finally:
        for p in session_processes(proc.pid):
            try:
                p.kill()
            except psutil.Error:
                continue
        proc.wait(timeout=30)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert EXPECTED[how] in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    deadline = time.monotonic() + 10
    while session_processes(proc.pid) and time.monotonic() < deadline:  # the resource tracker ends
        time.sleep(0.1)  # once every holder of its pipe has gone
    assert not session_processes(proc.pid), [p.cmdline() for p in session_processes(proc.pid)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(how=st.sampled_from(["kill a worker", "an error", "SIGINT"]), delay=st.floats(0.0, 1.5))
@example(how="kill a worker", delay=0.5)
@example(how="an error", delay=0.5)
@example(how="SIGINT", delay=0.5)
def test_a_pool_ends_whatever_ends_it(how: str, delay: float) -> None:
    _run(how, delay)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(delay=st.floats(0.0, SPAWN_S))
def test_a_signal_as_the_workers_spawn(delay: float) -> None:
    """SIGTERM while the first submits spawn the workers: a worker spawned but not yet sent
    its start-up data (it holds the pool's task pipe and reads nothing) or not yet in the
    pool's list (no kill reaches it) held the command for ever (1 in 28 of merge's SIGTERMs
    right after its workers started, under load)."""
    _run("SIGTERM as the workers spawn", delay)


def test_the_line_names_how_a_worker_died() -> None:
    """The exit code or signal of the worker that died, and the out-of-memory hint only for
    SIGKILL (the one signal the kernel's out-of-memory killer sends)."""
    from draftdata.support.workerpool import _DeathWatch

    class Dead:
        def __init__(self, exitcode: int | None) -> None:
            self.exitcode = exitcode

    def line(*codes: int | None) -> str:
        watch = _DeathWatch.__new__(_DeathWatch)
        watch.dead = [Dead(c) for c in codes]
        return watch.how_died()

    assert "was killed by SIGKILL (SIGKILL is how the kernel's out-of-memory" in line(-9)
    assert "was killed by SIGSEGV;" in line(-signal.SIGSEGV)
    assert "out-of-memory" not in line(-signal.SIGSEGV)
    assert "exited with code 3;" in line(3)
    assert "ended unasked (an error in its start-up is printed above)" in line(0)
    assert "died;" in line(None)
    assert "the same command run again finishes the work" in line(-9)


def test_a_worker_whose_start_up_failed_gives_its_error_to_each_task() -> None:
    """A worker whose initializer raised (a model that cannot load on one device: hidden-states
    on several devices) makes each task raise that error, so the command says what failed: the
    pool used to lose the worker and say only that a process "terminated abruptly"."""
    from draftdata.support.workerpool import worker_pool

    with (
        pytest.raises(ValueError, match="invalid literal for int"),
        worker_pool(2, int, ("not a number",)) as pool,
    ):
        pool.submit(abs, -3).result(timeout=ENDS_WITHIN_S)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), pools=st.integers(2, 3))
def test_pools_closed_with_one_error_name_the_death_of_the_one_that_broke(
    data: st.DataObject, pools: int
) -> None:
    """Pools opened side by side (hidden-states: one per device) and closed together with the
    error of the one whose worker died: the line names that death (SIGKILL), whichever pool it
    was. A healthy pool closed first took the error for its own and said only "died"."""
    import contextlib

    from draftdata.errors import WorkerDiedError
    from draftdata.support.workerpool import worker_pool

    broken = data.draw(st.integers(0, pools - 1), label="broken")
    with (
        pytest.raises(WorkerDiedError, match="was killed by SIGKILL") as caught,
        contextlib.ExitStack() as stack,
    ):
        opened = [stack.enter_context(worker_pool(1)) for _ in range(pools)]
        futures = [p.submit(time.sleep, ENDS_WITHIN_S) for p in opened]
        for f in futures:
            while not f.running():
                time.sleep(0.01)
        worker = next(iter(opened[broken]._processes.values()))  # type: ignore[attr-defined]
        os.kill(worker.pid, signal.SIGKILL)
        futures[broken].result(timeout=ENDS_WITHIN_S)
    assert "died;" not in str(caught.value)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(["TwoArgs", "HoldsLock", "RowError", "ValueError"]),
    where=st.sampled_from(["task", "initializer"]),
    text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1),
)
@example(shape="TwoArgs", where="initializer", text="the model does not fit")
@example(shape="HoldsLock", where="task", text="the model does not fit")
def test_a_workers_error_reaches_the_caller_whatever_its_shape(
    shape: str, where: str, text: str
) -> None:
    """A task's or an initializer's error arrives as itself, or (one that does not survive a
    pickle) as a ``RuntimeError`` that names its type and says its text; never as a worker
    that died. One whose ``__init__`` takes other arguments than ``args`` broke the pool (said
    as "a worker process ... was killed by SIGTERM; ... run again finishes the work"), one
    holding a lock came back as "cannot pickle '_thread.lock' object". An initializer's error
    is raised by each task with its traceback (the second task's came without it)."""
    from tests.chaos import raisers

    from draftdata.support.workerpool import worker_pool

    expected = raisers.make(shape, text)
    init = (raisers.fail, (shape, text)) if where == "initializer" else (None, ())
    with worker_pool(1, *init) as pool:
        causes = []
        for _ in range(1 if where == "task" else 12):
            with pytest.raises(Exception) as caught:
                pool.submit(raisers.fail, shape, text).result(timeout=ENDS_WITHIN_S)
            causes.append(str(caught.value.__cause__))
    got = caught.value
    if shape in ("RowError", "ValueError"):
        assert type(got) is type(expected)
        assert str(got) == str(expected)
        assert vars(got) == vars(expected)
    else:
        assert type(got) is RuntimeError
        assert str(got) == f"tests.chaos.raisers.{shape}: {expected}"
    assert len(set(map(len, causes))) == 1, [len(c) for c in causes]  # the same traceback


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), devices=st.integers(2, 3))
def test_a_worker_that_dies_as_hidden_states_closes_its_workers_is_named(
    data: st.DataObject, devices: int
) -> None:
    """hidden-states on several devices: a worker that dies while the command closes its
    workers (each is asked to finish its commits) ends it with ``WorkerDiedError``; the pools
    were then closed as if nothing had gone wrong, and ``BrokenProcessPool`` came out as a
    traceback."""
    import contextlib

    from draftdata.errors import WorkerDiedError
    from draftdata.hidden.run import Workers, _Remote
    from draftdata.support.workerpool import worker_pool

    dies = data.draw(st.integers(0, devices - 1), label="dies")
    workers = Workers.__new__(Workers)
    workers._stack = contextlib.ExitStack()
    workers._workers = []
    for i in range(devices):
        w = _Remote.__new__(_Remote)
        w.pool = workers._stack.enter_context(worker_pool(1))

        def close(w: _Remote = w, i: int = i) -> None:  # a worker's last commits, or death
            if i == dies:
                os.kill(next(iter(w.pool._processes.values())).pid, signal.SIGKILL)  # type: ignore[attr-defined]
                w.pool.submit(time.sleep, ENDS_WITHIN_S).result()
            w.pool.submit(abs, 1).result()

        w.close = close  # type: ignore[method-assign]
        workers._workers.append(w)
    for w in workers._workers:  # the workers are running
        w.pool.submit(abs, 1).result()
    with pytest.raises(WorkerDiedError, match="was killed by SIGKILL"):
        workers.__exit__(None, None, None)
