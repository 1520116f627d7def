"""tests/integration/ports.py: ports no other worker and no ephemeral bind can hand out."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.integration import ports


def _ephemeral() -> range:
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    low, high = (int(x) for x in text.split())
    return range(low, high + 1)


@settings(max_examples=25)
@given(worker=st.integers(0, 30), ns=st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_each_worker_gets_free_ports_of_its_own_outside_the_ephemeral_range(
    worker: int, ns: list[int]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        stretch = ports._stretch()
        bases = [(ports.free_port_base(n), n) for n in ns]
    handed = [p for base, n in bases for p in range(base, base + n)]
    assert len(set(handed)) == len(handed)  # never handed out twice
    assert all(p in stretch for p in handed)
    assert not set(handed) & set(_ephemeral())
    for p in handed:  # free: a server can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_stretches_of_different_workers_do_not_overlap() -> None:
    seen: set[int] = set()
    with pytest.MonkeyPatch.context() as mp:
        for k in range(ports.WORKERS):
            mp.setenv("PYTEST_XDIST_WORKER", f"gw{k}")
            stretch = set(ports._stretch())
            assert not stretch & seen
            seen |= stretch
    assert max(seen) < min(_ephemeral())
