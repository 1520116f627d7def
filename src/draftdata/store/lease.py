"""The run lease: one live writer per run (or per partition of it), on a create-only store.

Without it, the same ``generate`` started twice on one run (two terminals,
a rerun while the first still runs, a Ray retry beside a zombie worker) answers the same
prompts twice and commits both. The lease makes the second one refuse in one line naming the
holder, or wait for it; a holder that dies needs no cleanup, its claim expires on its own.

Protocol (every write is ``put_new``: local exclusive link, S3 ``If-None-Match: *``; nothing is
ever overwritten or deleted)::

    lease/<scope>/<gen:08d>/claim        {holder, host, node, pid, since, ttl}: generation gen
    lease/<scope>/<gen:08d>/hb-<n:08d>   heartbeat n of that generation (n = 1, 2, ...)
    lease/<scope>/<gen:08d>/released     the holder's clean exit
    lease/scopes/<scope>                 marks that the scope exists (for overlap checks)

``scope`` is ``run`` for a whole run and ``part-<i>-of-<n>`` for a partition, so the Ray
partitions of one run each hold their own lease.

- **Acquire.** Find the latest generation G by probing ``claim`` keys (1, 2, 4, ... then a
  binary search: generations are dense). G is free when there is none, when it is
  ``released``, when its holder ran on this node (host, boot and pid namespace) and its pid
  is gone (a kill -9 is seen at once), or when it is *observed* dead: no new heartbeat appears
  for ``ttl`` seconds of our own monotonic clock. A heartbeat that does appear proves the
  holder alive (on the same node, a live pid whose last heartbeat is younger than ``ttl`` is
  alive at once): refuse (LeaseHeldError, naming host, pid and since) or, with ``wait``, keep
  watching. To take over, create ``claim`` of G+1; the conditional create lets exactly one
  contender win (the loser reads the winner as the new holder). Then the scopes that overlap
  ours (the whole run and any partition, or partitions of another count) are checked the same
  way, after our claim is visible, so of two overlapping starters at least one sees the other.
- **Hold.** A thread writes heartbeat n+1 every ``ttl / 4`` seconds. Before every commit the
  Run calls ``check()``: it fails (LeaseLostError) once claim G+1 exists (someone presumed us
  dead and took over), and when our last heartbeat is older than ``ttl / 2`` it first tries a
  heartbeat itself; if that does not land (the store does not answer) it raises
  LeaseUnconfirmedError, a StoreError the committer retries like any store outage, and commits
  resume once a heartbeat lands and claim G+1 is still absent. A contender needs ``ttl`` of
  silence, so a holder that cannot heartbeat stops committing well before anyone may take over.
- **Release.** A clean exit (also an error or Ctrl-C) writes ``released``; the next command
  takes over at once.

Clock skew: expiry never compares two machines' clocks. A contender measures heartbeat silence
on its own monotonic clock; ``since`` and heartbeat times are informational only. S3 eventual
listing: the protocol never lists to decide anything; generations and heartbeats are found by
HEAD on deterministic keys (S3 and MinIO give read-after-write consistency for new keys). Only
the overlap check between different scopes lists ``lease/scopes/``; a store whose listing lags
can miss a scope created in that lag. What the lease cannot stop: a shard write already in
flight when its holder froze for longer than ``ttl`` (a stopped VM) can land after a takeover.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftdata.errors import (
    AlreadyExistsError,
    ConfigError,
    LeaseHeldError,
    LeaseLostError,
    LeaseUnconfirmedError,
    StoreError,
)
from draftdata.store.base import Store

LEASE_PREFIX = "lease/"
DEFAULT_TTL = 30.0
RUN_SCOPE = "run"


@dataclass(frozen=True)
class LeaseOptions:
    """How ``Run.open`` takes the lease: its scope, expiry, how long to wait for a live
    holder (0: refuse at once) and what to call when it is lost later (from any thread)."""

    scope: str = "run"
    ttl: float = 30.0
    wait: float = 0.0
    on_lost: Callable[[str], None] | None = None


def scope_of(partition: Any) -> str:
    """The lease scope of a partition (``Partition`` or ``"i/n"``; None or ``0/1``: the run)."""
    if partition is None:
        return RUN_SCOPE
    index, _, count = str(partition).partition("/")
    if not count or int(count) <= 1:
        return RUN_SCOPE
    return f"part-{int(index)}-of-{int(count)}"


def _overlaps(a: str, b: str) -> bool:
    """Whether scopes ``a`` and ``b`` may answer the same prompts."""
    if a == b:
        return False  # the same scope is decided by its own generations
    if RUN_SCOPE in (a, b):
        return True
    _, _, na = a.rpartition("-of-")
    _, _, nb = b.rpartition("-of-")
    return na != nb  # partitions of one count are disjoint; of different counts they overlap


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's), or we cannot tell: assume alive
    return True


def _hostname() -> str:
    return socket.gethostname()


def _node() -> str:
    """This machine and pid namespace: pids (and wall clocks) compare only within one node.
    The hostname alone is not enough: containers may share it but not their pids."""
    parts = [_hostname()]
    with contextlib.suppress(OSError):
        parts.append(open("/proc/sys/kernel/random/boot_id").read().strip())  # noqa: SIM115
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "|".join(parts)


class _Gen:
    """What we know of one generation of a scope."""

    def __init__(self, scope: str, gen: int, claim: dict[str, Any]) -> None:
        self.scope = scope
        self.gen = gen
        self.claim = claim

    def describe(self) -> str:
        c = self.claim
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(c.get("since", 0))))
        return f"host {c.get('host', '?')}, pid {c.get('pid', '?')}, since {since}"


class Lease:
    """A held lease of one scope of a run (``acquire`` makes one; ``release`` ends it)."""

    def __init__(
        self,
        store: Store,
        scope: str,
        gen: int,
        *,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.scope = scope
        self.gen = gen
        self.ttl = ttl
        self.on_lost = on_lost
        self._clock = clock
        self._beats = 0
        self._last_beat = clock()
        self._lost: str | None = None
        self._released = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- keys ---------------------------------------------------------------------------------

    def _key(self, gen: int, name: str) -> str:
        return _gen_key(self.scope, gen, name)

    # -- holding ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the heartbeat thread (a daemon: it dies with the process)."""
        self._thread = threading.Thread(target=self._beat_loop, name="draftdata-lease", daemon=True)
        self._thread.start()

    def _beat_loop(self) -> None:
        interval = self.ttl / 4
        while not self._stop.wait(interval):
            if self._lost is not None:
                return
            with contextlib.suppress(StoreError):
                self._beat()

    def _beat(self) -> None:
        """Write the next heartbeat, unless someone has taken over (then: lost)."""
        with self._lock:
            if self._lost is not None:
                return
            if self.store.exists(self._key(self.gen + 1, "claim")):
                self._lose("another process took over this run's lease")
                return
            n = self._beats + 1
            with contextlib.suppress(AlreadyExistsError):  # only we write these names
                self.store.put_new(self._key(self.gen, f"hb-{n:08d}"), _stamp())
            self._beats = n
            self._last_beat = self._clock()

    def _lose(self, why: str) -> None:
        self._lost = (
            f"{self.store.url}: lost the run lease ({self.scope}, generation {self.gen}): {why}; "
            "this process stops committing; the other one continues the run"
        )
        if self.on_lost is not None:
            self.on_lost(self._lost)

    def check(self) -> None:
        """Raise LeaseLostError unless we still hold the lease (call before every commit)."""
        if self._lost is None and self._clock() - self._last_beat > self.ttl / 2:
            try:
                self._beat()
            except StoreError as exc:
                if not exc.outage:  # access denied, bad credentials: no wait renews it
                    raise
                # a store outage, not a takeover: no commit until a heartbeat lands again (and
                # claim G+1 is still absent); the committer retries this like any outage
                raise LeaseUnconfirmedError(
                    f"{self.store.url}: cannot renew the run lease ({exc}); not committing "
                    "until it is renewed"
                ) from exc
        if self._lost is None and self.store.exists(self._key(self.gen + 1, "claim")):
            with self._lock:
                self._lose("another process took over this run's lease")
        if self._lost is not None:
            raise LeaseLostError(self._lost)

    @property
    def lost(self) -> str | None:
        """Why the lease was lost (someone took over), or None while held or once released."""
        return None if self._released else self._lost

    def release(self) -> None:
        """Stop heartbeats and mark the generation released (idempotent, best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)
        with self._lock:
            if self._lost is not None:
                return
            with contextlib.suppress(StoreError):
                self.store.put_new(self._key(self.gen, "released"), b"{}")
            self._lost = f"{self.store.url}: the run lease was released"
            self._released = True


# -- acquiring --------------------------------------------------------------------------------


def _gen_key(scope: str, gen: int, name: str) -> str:
    return f"{LEASE_PREFIX}{scope}/{gen:08d}/{name}"


def _stamp(**extra: Any) -> bytes:
    return json.dumps({"time": time.time(), **extra}).encode()


def _last_dense(exists: Callable[[int], bool]) -> int:
    """The largest n >= 1 with ``exists(n)`` (0 if none), for keys that exist for 1..N only."""
    if not exists(1):
        return 0
    lo, hi = 1, 2
    while exists(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # exists(lo) and not exists(hi)
        mid = (lo + hi) // 2
        if exists(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _latest(store: Store, scope: str) -> _Gen | None:
    gen = _last_dense(lambda g: store.exists(_gen_key(scope, g, "claim")))
    if gen == 0:
        return None
    try:
        claim = json.loads(store.read(_gen_key(scope, gen, "claim")))
    except (StoreError, ValueError):
        claim = {}
    return _Gen(scope, gen, claim if isinstance(claim, dict) else {})


def _beats(store: Store, g: _Gen, hint: int = 0) -> int:
    """The number of heartbeats generation ``g`` has written (probing up from ``hint``)."""
    key = _gen_key
    if hint and store.exists(key(g.scope, g.gen, f"hb-{hint:08d}")):
        n = hint
        while store.exists(key(g.scope, g.gen, f"hb-{n + 1:08d}")):
            n += 1
        return n
    return _last_dense(lambda n: store.exists(key(g.scope, g.gen, f"hb-{n:08d}")))


def _plainly_free(store: Store, g: _Gen) -> bool:
    """Free without watching: released, or its holder ran here and its pid is gone."""
    if store.exists(_gen_key(g.scope, g.gen, "released")):
        return True
    pid = g.claim.get("pid")
    return g.claim.get("node") == _node() and isinstance(pid, int) and not _pid_alive(pid)


def _alive_here(store: Store, g: _Gen, ttl: float, now: float) -> bool:
    """Alive without watching: its holder runs on this host (one clock: times compare), its
    pid exists and its last heartbeat is younger than ``ttl`` at ``now`` (epoch seconds)."""
    pid = g.claim.get("pid")
    if g.claim.get("node") != _node() or not isinstance(pid, int) or not _pid_alive(pid):
        return False
    n = _beats(store, g)
    try:
        last = (
            json.loads(store.read(_gen_key(g.scope, g.gen, f"hb-{n:08d}")))["time"]
            if n
            else (g.claim["since"])
        )
        return bool(now - float(last) < ttl)
    except (StoreError, ValueError, KeyError, TypeError):
        return False


def _watch(
    store: Store,
    gens: list[_Gen],
    *,
    ttl: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> _Gen | None:
    """Watch ``gens`` for up to ``ttl`` seconds: the first that proves alive (a new heartbeat,
    or a newer generation of its scope), else None when every one was silent for ``ttl``."""
    start = clock()
    seen = {id(g): _beats(store, g) for g in gens}
    poll = min(1.0, ttl / 10)
    while True:
        for g in gens:
            if store.exists(_gen_key(g.scope, g.gen + 1, "claim")):
                return _latest(store, g.scope) or g  # someone else took it over meanwhile
            if _plainly_free(store, g):
                continue
            if _beats(store, g, seen[id(g)]) > seen[id(g)]:
                return g
        live = [g for g in gens if not _plainly_free(store, g)]
        if not live or clock() - start >= ttl:
            return None
        gens = live
        sleep(poll)


def acquire(
    store: Store,
    scope: str = RUN_SCOPE,
    *,
    ttl: float = DEFAULT_TTL,
    wait: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
    on_lost: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
    writer_id: str = "",
) -> Lease:
    """Take the lease of ``scope`` on the run in ``store`` (see the module docstring).

    ``clock`` and ``sleep`` time the watching (monotonic seconds); ``wall`` is the epoch clock
    that a holder on this node's heartbeat times compare with.

    Raises LeaseHeldError (one line naming the holder) when a live process holds it or an
    overlapping scope, after waiting up to ``wait`` seconds for it to go. A dead holder's claim
    is taken over after ``ttl`` seconds of heartbeat silence (at once for a gone pid here).
    """
    if not ttl > 0:
        raise ConfigError(f"--lease-ttl: {ttl}; must be greater than 0")
    deadline = clock() + wait
    with contextlib.suppress(AlreadyExistsError):
        store.put_new(f"{LEASE_PREFIX}scopes/{scope}", b"{}")
    while True:
        g = _latest(store, scope)
        if g is not None and not _plainly_free(store, g):
            if _alive_here(store, g, ttl, wall()):
                alive: _Gen | None = g
            else:
                if log is not None:
                    log(
                        f"generate: the run lease ({scope}) is held by {g.describe()}; waiting "
                        f"up to {ttl:g} s for a heartbeat to tell whether it still runs"
                    )
                alive = _watch(store, [g], ttl=ttl, clock=clock, sleep=sleep)
            if alive is not None:
                if clock() < deadline:
                    sleep(min(1.0, ttl / 4))  # alive: look again soon, not in a busy loop
                    continue
                raise _held(store, alive)
        gen = (g.gen if g is not None else 0) + 1
        claim = {
            "holder": writer_id,
            "host": _hostname(),
            "node": _node(),
            "pid": os.getpid(),
            "since": time.time(),
            "ttl": ttl,
        }
        try:
            store.put_new(_gen_key(scope, gen, "claim"), json.dumps(claim).encode())
        except AlreadyExistsError:
            continue  # another contender won this generation: judge it as the holder
        lease = Lease(store, scope, gen, ttl=ttl, clock=clock, on_lost=on_lost)
        try:
            lease._beat()
            _check_overlaps(store, scope, ttl=ttl, clock=clock, sleep=sleep, lease=lease)
        except BaseException:  # refused, or the store failed: leave no claim behind
            lease.release()
            raise
        lease.start()
        return lease


def _check_overlaps(
    store: Store,
    scope: str,
    *,
    ttl: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    lease: Lease,
) -> None:
    others = [
        s.removeprefix(f"{LEASE_PREFIX}scopes/") for s in store.list(f"{LEASE_PREFIX}scopes/")
    ]
    gens = [g for s in others if _overlaps(scope, s) and (g := _latest(store, s)) is not None]
    gens = [g for g in gens if not _plainly_free(store, g)]
    if not gens:
        return
    # keep our own claim fresh while we watch, so that they see us too
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(lease.ttl / 4):
            with contextlib.suppress(StoreError):
                lease._beat()

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        alive = _watch(store, gens, ttl=ttl, clock=clock, sleep=sleep)
    finally:
        stop.set()
        t.join()
    if alive is not None:
        raise _held(store, alive, ours=scope)


def _held(store: Store, g: _Gen, ours: str | None = None) -> LeaseHeldError:
    what = f"{g.scope} overlaps {ours}" if ours is not None and ours != g.scope else g.scope
    return LeaseHeldError(
        f"{store.url}: the run is being written by another process ({g.describe()}; lease "
        f"{what}); wait for it to finish or stop it (its claim expires {g.claim.get('ttl', '?')} s "
        "after its last heartbeat), then run the same command again"
    )


# -- readers ----------------------------------------------------------------------------------


def live_writer(
    store: Store,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Who writes the run in ``store`` now (``host ..., pid ..., since ...``), or None.

    For readers that would take a moving run for a finished one (tokenize, export, merge).
    Every scope of the run is looked at (the whole run and each Ray partition), as ``acquire``
    judges a holder: a generation not released is live at once when its holder runs on this
    node, its pid exists and its last heartbeat is younger than its ttl; free at once when that
    pid is gone; any other holder (another node, or here but silent) is watched for a new
    heartbeat for up to its ttl (no clocks compared), so a dead remote holder costs this wait
    once and a live one is seen within a quarter of it. Nothing is written.
    """
    remote: list[_Gen] = []
    for key in store.list(f"{LEASE_PREFIX}scopes/"):
        g = _latest(store, key.removeprefix(f"{LEASE_PREFIX}scopes/"))
        if g is None or _plainly_free(store, g):
            continue
        if _alive_here(store, g, float(g.claim.get("ttl") or DEFAULT_TTL), time.time()):
            return g.describe()
        remote.append(g)  # elsewhere, or here but silent (frozen, or a reused pid): watch it
    if not remote:
        return None
    ttl = max(float(g.claim.get("ttl") or DEFAULT_TTL) for g in remote)
    alive = _watch(store, remote, ttl=ttl, clock=clock, sleep=sleep)
    return alive.describe() if alive is not None else None


def refuse_live_writer(store: Store, reader: str) -> None:
    """LeaseHeldError (one line) when a live process still writes the run in ``store``:
    ``reader`` (tokenize, export, merge) would see only what was committed so far and pass
    it on as the whole run."""
    holder = live_writer(store)
    if holder is None:
        return
    raise LeaseHeldError(
        f"{store.url}: generate is still writing this run ({holder}); {reader} would read "
        "only what it has committed so far. Run it once generate has finished (or stopped: "
        "what it committed is kept, and the same generate command resumes the rest)"
    )
