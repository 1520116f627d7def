"""The run lease on a local store: refuse a live holder, take over a dead one, fence the loser.

Real stores and real processes (a child process that holds a lease and is then killed); short
TTLs keep each test under a couple of seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from draftdata.errors import ConfigError, LeaseHeldError, LeaseLostError, RunMismatchError
from draftdata.store.lease import (
    LEASE_PREFIX,
    _node,
    acquire,
    live_writer,
    refuse_live_writer,
    scope_of,
)
from draftdata.store.local import LocalStore
from draftdata.store.run import Run


def _store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "run")


class FakeTime:
    """acquire's clocks: ``sleep`` moves the monotonic clock on at once (and counts);
    ``wall`` is the epoch clock, ``ahead`` seconds ahead of the real one."""

    def __init__(self, ahead: float = 0.0) -> None:
        self.now = 0.0
        self.slept = 0.0
        self.ahead = ahead

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds

    def wall(self) -> float:
        return time.time() + self.ahead


def _foreign_claim(store: LocalStore, scope: str = "run", gen: int = 1) -> None:
    claim = {"holder": "w", "host": "elsewhere", "node": "elsewhere|x", "pid": 1, "since": 0}
    store.put_new(f"{LEASE_PREFIX}{scope}/{gen:08d}/claim", json.dumps(claim).encode())


def test_second_holder_refuses_at_once_naming_the_first(tmp_path: Path) -> None:
    store = _store(tmp_path)
    first = acquire(store, ttl=5)
    fake = FakeTime()
    with pytest.raises(LeaseHeldError) as info:
        acquire(store, ttl=5, clock=fake.clock, sleep=fake.sleep)
    assert fake.slept == 0  # same node, live pid, fresh heartbeat: no watching
    msg = str(info.value)
    assert "being written by another process" in msg and "pid " in msg and "since " in msg
    assert len(msg.splitlines()) == 1
    first.check()  # the refusal took nothing from the holder
    first.release()
    second = acquire(store, ttl=5)  # released: taken at once
    assert second.gen == 2
    second.release()


def test_a_killed_holder_on_this_node_is_taken_over_at_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    code = (
        "import sys, time; from draftdata.store.lease import acquire; "
        "from draftdata.store.local import LocalStore; "
        f"acquire(LocalStore(__import__('pathlib').Path({str(store.root)!r})), ttl=30); "
        "print('held', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeldError):
            acquire(store, ttl=30)
        child.kill()  # kill -9: no release, no more heartbeats
        child.wait()
        fake = FakeTime()
        lease = acquire(store, ttl=30, clock=fake.clock, sleep=fake.sleep)
        assert fake.slept == 0 and lease.gen == 2  # its pid is gone: no watching
        lease.release()
    finally:
        child.kill()
        child.wait()


def test_a_silent_foreign_holder_expires_after_ttl(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _foreign_claim(store)
    logs: list[str] = []
    fake = FakeTime()
    lease = acquire(store, ttl=30, clock=fake.clock, sleep=fake.sleep, log=logs.append)
    # watched for the whole ttl on its own clock (polls of at most 1 s), then taken over
    assert 30 <= fake.slept <= 31 and lease.gen == 2
    assert logs and "host elsewhere" in logs[0]
    lease.release()


def test_a_foreign_holder_that_heartbeats_is_refused_or_waited_for(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _foreign_claim(store)
    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.wait(0.1):
            n += 1
            store.put_new(f"{LEASE_PREFIX}run/00000001/hb-{n:08d}", b'{"time": 0}')

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        with pytest.raises(LeaseHeldError, match="host elsewhere, pid 1"):
            acquire(store, ttl=1.0)
        # waiting: the holder finishes (released) while we wait, then we take over
        threading.Timer(
            0.5, lambda: store.put_new(f"{LEASE_PREFIX}run/00000001/released", b"{}")
        ).start()
        lease = acquire(store, ttl=1.0, wait=5.0)
        assert lease.gen == 2
        lease.release()
    finally:
        stop.set()
        t.join()


def test_a_frozen_holder_is_taken_over_and_then_stops_committing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    lost: list[str] = []
    first = acquire(store, ttl=0.6, on_lost=lost.append)
    first._stop.set()  # frozen: no more heartbeats (a SIGSTOP, a hung VM)
    assert first._thread is not None
    first._thread.join()
    with pytest.raises(LeaseHeldError):  # same node, live pid, fresh heartbeat: alive
        acquire(store, ttl=0.6)
    later = FakeTime(ahead=0.7)  # 0.7 s on: its last heartbeat aged past ttl
    second = acquire(store, ttl=0.6, clock=later.clock, sleep=later.sleep, wall=later.wall)
    assert second.gen == 2 and 0.6 <= later.slept <= 0.7  # watched for ttl, then taken
    with pytest.raises(LeaseLostError, match="lost the run lease"):
        first.check()
    assert lost and first.lost is not None
    second.check()
    second.release()


def test_overlapping_scopes_exclude_each_other(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert scope_of(None) == scope_of("0/1") == "run" and scope_of("2/4") == "part-2-of-4"
    p0 = acquire(store, scope_of("0/2"), ttl=5)
    p1 = acquire(store, scope_of("1/2"), ttl=5)  # disjoint partitions: both fine
    with pytest.raises(LeaseHeldError, match="part-0-of-2 overlaps run"):
        acquire(store, "run", ttl=5)
    with pytest.raises(LeaseHeldError, match="overlaps part-1-of-3"):
        acquire(store, scope_of("1/3"), ttl=5)
    p0.release()
    p1.release()
    whole = acquire(store, "run", ttl=5)
    whole.release()


def test_run_open_takes_the_lease_and_refuses_a_foreign_prefix_first(tmp_path: Path) -> None:
    from draftdata.store.lease import LeaseOptions

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.txt").write_text("x")
    with pytest.raises(RunMismatchError):
        Run.open(str(foreign), settings={"a": 1}, lease=LeaseOptions())
    assert sorted(p.name for p in foreign.iterdir()) == ["data.txt"]  # no lease written there
    out = str(tmp_path / "run")
    run = Run.open(out, settings={"a": 1}, lease=LeaseOptions(ttl=5))
    with pytest.raises(LeaseHeldError):
        Run.open(out, settings={"a": 1}, lease=LeaseOptions(ttl=5))
    run.close()
    again = Run.open(out, settings={"a": 1}, lease=LeaseOptions(ttl=5))
    assert again.lease is not None and again.lease.gen == 2
    again.close()
    with pytest.raises(ConfigError):
        acquire(LocalStore(tmp_path / "x"), ttl=0)
    assert "|" in _node() or _node()


def test_live_writer_sees_every_scope_and_judges_holders_like_acquire(tmp_path: Path) -> None:
    """Readers ask ``live_writer``: a holder here is seen at once (whole run or a partition),
    a released one is not; a foreign one is live while it heartbeats and not once silent for
    its ttl (readers refuse a moving run, issue 24)."""
    store = _store(tmp_path)
    assert live_writer(store) is None  # no lease at all
    for scope in ("run", "part-1-of-2"):
        lease = acquire(store, scope, ttl=5)
        fake = FakeTime()
        holder = live_writer(store, clock=fake.clock, sleep=fake.sleep)
        assert holder is not None and f"pid {os.getpid()}" in holder
        assert fake.slept == 0  # at once: no watching
        with pytest.raises(LeaseHeldError, match="generate is still writing this run"):
            refuse_live_writer(store, "tokenize")
        lease.release()
        assert live_writer(store) is None
    other = _store(tmp_path / "other")
    claim = {"host": "elsewhere", "node": "elsewhere|x", "pid": 1, "since": 0, "ttl": 0.6}
    other.put_new(f"{LEASE_PREFIX}scopes/run", b"{}")
    other.put_new(f"{LEASE_PREFIX}run/00000001/claim", json.dumps(claim).encode())
    fake = FakeTime()
    assert live_writer(other, clock=fake.clock, sleep=fake.sleep) is None  # silent: dead
    assert 0.6 <= fake.slept < 3.0  # ... once watched for its ttl

    beats = [0]

    class Beating(FakeTime):
        """The foreign holder heartbeats while the reader watches (each of its sleeps)."""

        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            beats[0] += 1
            other.put_new(f"{LEASE_PREFIX}run/00000001/hb-{beats[0]:08d}", b'{"time": 0}')

    beating = Beating()
    holder = live_writer(other, clock=beating.clock, sleep=beating.sleep)
    assert holder is not None and "host elsewhere, pid 1" in holder
    assert beating.slept < 0.6  # seen before its ttl ran out
