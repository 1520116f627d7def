"""What generate says while it runs, against the simulator (issue 23).

- During a Ctrl-C drain, and while no endpoint serves, the progress line shows that state
  instead of an ETA counting down to a time that is not coming.
- An endpoint taken out with requests in flight says what became of them (never "0 requests
  requeued" while it held some), and they are all answered.
- A partition of a fresh run (a Ray task) does not say it is resuming because another
  partition committed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import fast_config, write_prompts

from draftdata.errors import FleetUnavailableError
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


def sim(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {"output_sigma": 0.3, "max_running": 16}
    base.update(kw)
    return SimConfig(**base)


def progress_lines(lines: list[str]) -> list[str]:
    return [x for x in lines if re.match(r"generate: [\d,]+/[\d,]+ \(", x)]


def when(engine: Any, ready: Any, then: Any, stop: threading.Event) -> None:
    """From the engine's loop: a thread that waits for ``ready(engine)`` and calls ``then``."""
    loop = asyncio.get_running_loop()

    def watch() -> None:
        while not stop.is_set() and not ready(engine):
            time.sleep(0.01)
        if not stop.is_set():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(then, engine)

    threading.Thread(target=watch, daemon=True).start()


def test_a_drain_shows_its_state_not_an_eta(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 40)
    lines: list[str] = []
    stop = threading.Event()
    # answers of ~1,500 tokens at 0.05 of a 27B's speed: a second or two each
    config = sim(time_scale=0.05, mean_output_tokens=1500, max_running=8)
    cfg = dict(progress="plain", log_interval=0.2, grace_seconds=30.0, concurrency=8)
    with SimFleet(1, config) as fleet:
        try:
            summary = generate(
                fast_config(prompts, tmp_path / "run", fleet.urls, **cfg),
                log=lines.append,
                on_engine=lambda e: when(
                    e, lambda e: e.tally.completed >= 1, lambda e: e.interrupt(), stop
                ),
            )
        finally:
            stop.set()
    assert summary.interrupted
    cut = next(i for i, x in enumerate(lines) if x.startswith("generate: stopping; waiting"))
    during = progress_lines(lines[cut + 1 :])
    assert during, lines
    assert all("stopping: " in x and "ETA" not in x for x in during), during
    assert any("ETA" in x for x in progress_lines(lines[:cut]))


def test_a_fleet_that_serves_nothing_shows_its_state_not_an_eta(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 60)
    lines: list[str] = []
    stop = threading.Event()
    config = sim(time_scale=0.05, mean_output_tokens=800, max_running=8)
    cfg = dict(progress="plain", log_interval=0.2, unavailable_timeout=2.0, concurrency=8)
    with SimFleet(1, config) as fleet:
        try:
            with pytest.raises(FleetUnavailableError):
                generate(
                    fast_config(prompts, tmp_path / "run", fleet.urls, **cfg),
                    log=lines.append,
                    on_engine=lambda e: when(
                        e, lambda e: e.tally.completed >= 2, lambda e: fleet.crash(0), stop
                    ),
                )
        finally:
            stop.set()
    waiting = [x for x in progress_lines(lines) if "waiting: no endpoint serving" in x]
    assert waiting, lines
    assert all("ETA" not in x for x in waiting)


def test_a_taken_out_endpoint_says_what_became_of_its_requests(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 120)
    lines: list[str] = []
    stop = threading.Event()
    config = sim(time_scale=0.02, mean_output_tokens=1000, max_running=16)
    crashed: list[int] = []

    def crash(engine: Any) -> None:
        held = len(engine.dispatcher.on_endpoint[engine.endpoints[0]])
        crashed.append(held)
        fleet.crash(0)

    with SimFleet(2, config) as fleet:
        try:
            generate(
                fast_config(prompts, tmp_path / "run", fleet.urls, concurrency=16),
                log=lines.append,
                on_engine=lambda e: when(
                    e,
                    lambda e: (
                        e.tally.completed >= 4
                        and len(e.dispatcher.on_endpoint[e.endpoints[0]]) >= 4
                    ),
                    crash,
                    stop,
                ),
            )
        finally:
            stop.set()
    assert crashed and crashed[0] >= 4
    (out,) = [x for x in lines if " taken out: " in x and fleet.urls[0].rstrip("/") in x]
    assert "0 request(s) requeued" not in out and "its requests: " in out
    counts = [
        int(n.replace(",", "")) for n in re.findall(r"([\d,]+) (?:requeued|failed|still)", out)
    ]
    assert counts and sum(counts) > 0, out
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (120, 0)


def test_a_partition_of_a_fresh_run_does_not_say_it_resumes(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 40)
    lines: list[str] = []
    config = sim(time_scale=0.0, mean_output_tokens=30)
    with SimFleet(1, config) as fleet:
        for part in ("1/2", "0/2"):  # as Ray tasks do: the first commits before the second opens
            cfg = fast_config(prompts, tmp_path / "run", fleet.urls, partition=part)
            generate(cfg, log=lines.append)
        whole = generate(fast_config(prompts, tmp_path / "run", fleet.urls), log=lines.append)
    assert whole.already_done == 40 and whole.completed == 0
    resuming = [x for x in lines if "resuming" in x]
    assert len(resuming) == 1 and "40 completed" in resuming[0]  # the whole-run command only
