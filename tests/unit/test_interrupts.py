"""``interrupts`` blocks nest: a pool's block opened inside a command's block adds its action to
the one handler, so a signal runs every open block's action (a pool's: kill its workers) before
the command stops in one line; leaving the blocks puts Python's handlers back."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.errors import Interrupted
from draftdata.support.workerpool import interrupts

DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def python_defaults() -> Iterator[None]:
    """Python's own handlers while the test runs (an xdist worker may ignore SIGINT)."""
    before = {s: signal.signal(s, h) for s, h in DEFAULTS.items()}
    yield
    for s, h in before.items():
        signal.signal(s, h)


@settings(max_examples=20, deadline=None)
@given(
    depth=st.integers(1, 4),
    acting=st.lists(st.booleans(), min_size=4, max_size=4),
    sig=st.sampled_from([signal.SIGINT, signal.SIGTERM]),
)
def test_every_open_block_acts_on_a_signal(depth: int, acting: list[bool], sig: int) -> None:
    ran: list[int] = []

    def nest(level: int) -> None:
        act = (lambda: ran.append(level)) if acting[level] else None
        with interrupts(act):
            if level + 1 < depth:
                nest(level + 1)
            else:
                os.kill(os.getpid(), sig)

    with pytest.raises(Interrupted) as caught:
        nest(0)
    assert caught.value.signum == sig
    assert ran == [lvl for lvl in reversed(range(depth)) if acting[lvl]]  # innermost first
    assert {s: signal.getsignal(s) for s in DEFAULTS} == DEFAULTS  # put back


@pytest.mark.parametrize("daemon_only", [True, False])
def test_the_last_block_leaves_the_signals_ignored_unless_a_thread_would_hold_the_exit(
    daemon_only: bool,
) -> None:
    """The command line's block (``last``): leaving it, SIGINT and SIGTERM are ignored (a
    signal while the interpreter shuts down neither kills it silently nor prints a
    traceback); with a non-daemon thread still running, Python's handlers come back, so a
    signal can end the wait for it."""
    import threading

    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=daemon_only)
    thread.start()
    try:
        with interrupts(last=True):
            pass
        got = {s: signal.getsignal(s) for s in DEFAULTS}
    finally:
        release.set()
        thread.join()
    if daemon_only:
        assert got == dict.fromkeys(DEFAULTS, signal.SIG_IGN)
    else:
        assert got == DEFAULTS


def test_a_second_signal_says_farewell_and_ends_with_128_plus_it() -> None:
    """The first signal raises Interrupted; a second, while that unwinds, ends the process at
    once with 128 + the signal, after ``farewell`` has said so."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "from draftdata.support.workerpool import interrupts\n"
        "say = lambda n: os.write(2, f'farewell {n}'.encode())\n"
        "with interrupts(farewell=say):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    finally:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stderr == f"farewell {int(signal.SIGTERM)}", done.stderr


def test_a_signal_in_the_pools_first_submit_ends_as_that_signal() -> None:
    """A signal that lands in the first submit, after the pool made its manager thread and
    before it started it, ends the command as the signal (its Interrupted), not with the
    pool's "cannot join thread before it is started" (make test met it: exit 1 and a
    traceback instead of 130 and the line)."""
    import threading

    from draftdata.support.workerpool import worker_pool

    with pytest.raises(Interrupted), worker_pool(1) as pool:
        made = threading.Thread(target=lambda: None)  # made, never started
        pool._executor_manager_thread = made  # type: ignore[assignment]
        raise Interrupted(signal.SIGINT)
