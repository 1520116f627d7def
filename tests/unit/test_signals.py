"""tests/signals.py: a child a test signals starts with the default disposition."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.signals import SENT, default_signals

# the child reports what it started with: its disposition (Python installs its own SIGINT
# handler only where SIGINT was not ignored) and its blocked signals
REPORT = (
    "import json, signal\n"
    "sent = [signal.SIGINT, signal.SIGTERM]\n"
    "print(json.dumps({\n"
    "    'ignored': [int(s) for s in sent if signal.getsignal(s) == signal.SIG_IGN],\n"
    "    'blocked': sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),\n"
    "    'int_handler': signal.getsignal(signal.SIGINT) is signal.default_int_handler,\n"
    "}))\n"
)


@contextmanager
def parent(ignored: set[signal.Signals], blocked: set[signal.Signals]) -> Iterator[None]:
    """This process with ``ignored`` ignored and ``blocked`` blocked, as a suite started from
    a script's background job or a runner that masks signals would be; restored after."""
    before = {s: signal.getsignal(s) for s in ignored}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        for s in ignored:
            signal.signal(s, signal.SIG_IGN)
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@settings(max_examples=8)
@given(ignored=st.sets(st.sampled_from(SENT)), blocked=st.sets(st.sampled_from(SENT)))
def test_a_signalled_child_starts_with_the_defaults_whatever_the_suite_has(
    ignored: set[signal.Signals], blocked: set[signal.Signals]
) -> None:
    with parent(ignored, blocked):
        out = subprocess.run(
            [sys.executable, "-c", REPORT],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            preexec_fn=default_signals,
        ).stdout
    got = json.loads(out)
    assert got == {"ignored": [], "blocked": [], "int_handler": True}


def test_without_it_the_child_inherits_what_the_suite_has() -> None:
    """What ``default_signals`` is for: exec keeps an ignored signal and the mask."""
    with parent({signal.SIGINT}, {signal.SIGTERM}):
        out = subprocess.run(
            [sys.executable, "-c", REPORT], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    got = json.loads(out)
    assert got["ignored"] == [int(signal.SIGINT)] and not got["int_handler"]
    assert int(signal.SIGTERM) in got["blocked"]
