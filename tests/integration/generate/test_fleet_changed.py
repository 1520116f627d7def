"""A fleet that starts refusing mid-run (restarted with another chat template, engine version or
options) stops the command in one line, and none of its refusals is recorded as a prompt's
failure; prompts every server refuses while the fleet still answers what it answered are
recorded, each once (``recheck.py``: the canary). Against the simulator over real sockets
(``--refuse I:400 --refuse-after N`` on every server, ``--bad-prompts``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import (
    completions,
    failures,
    fast_config,
    is_bad_prompt,
    write_prompts,
)

from draftdata.errors import FleetUnavailableError
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet, SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
BAD = "Invalid request: this prompt cannot be rendered (simulated)"
HISTORY = "Unsupported message role: assistant"  # a fleet that turned to refuse history


def _bad_ids(prompts: Path, rate: float) -> set[str]:
    """The prompts the simulator's ``--bad-prompts RATE`` refuses (its rule, on the messages)."""
    out = set()
    for line in prompts.read_bytes().splitlines():
        row = msgspec.json.decode(line)
        first = next(m["content"] for m in row["messages"] if m["role"] == "user")
        if is_bad_prompt(first, rate):
            out.add(row["id"])
    return out


def _stops_then_settles(
    prompts: Path,
    out: Path,
    ids: list[str],
    servers: int,
    changed: SimConfig,
    said: str,
    fixed: SimConfig | None = None,
    **cfg: Any,
) -> str:
    """Generate over a fleet that ``changed``: the command stops in one line quoting ``said``
    and records nothing of it; then over a ``fixed`` fleet (one that answers everything) every
    prompt settles once, answered. Returns the stop's line."""
    with SimFleet(servers, changed) as fleet, pytest.raises(FleetUnavailableError) as info:
        generate(fast_config(prompts, out, fleet.urls, **cfg), log=_quiet, handle_signals=False)
    line = str(info.value)
    assert "\n" not in line and said in line, line
    assert failures(out) == []
    fixed = fixed or SimConfig(time_scale=0, mean_output_tokens=20)
    with SimFleet(servers, fixed) as fleet:
        generate(fast_config(prompts, out, fleet.urls, **cfg), log=_quiet, handle_signals=False)
    assert check_exactly_once(str(out), set(ids)) == (len(ids), 0)
    return line


def _quiet(_line: str) -> None:
    """A log that drops every line."""


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    servers=st.integers(1, 3),
    data=st.data(),
    prompts_n=st.sampled_from([60, 150]),
    kind=st.sampled_from(["plain", "mixed"]),
    bad=st.sampled_from([0.0, 0.05]),
)
def test_a_fleet_that_starts_refusing_stops_and_records_none_of_it(
    tmp_path_factory: pytest.TempPathFactory,
    servers: int,
    data: st.DataObject,
    prompts_n: int,
    kind: str,
    bad: float,
) -> None:
    """Every server answers its first ``after`` requests, then refuses each with one 400:
    the command stops in one line (the opening's, or the mid-run one once answers came
    first), no refusal is recorded (bad prompts answered before it may be), and the command
    over a fleet that answers again settles every prompt once."""
    # fewer than the prompts' requests: some are refused (a retry may take one more)
    after = data.draw(st.integers(1, prompts_n // servers - 12), label="after")
    tmp = tmp_path_factory.mktemp("c")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, prompts_n, kind=kind)
    out = tmp / "run"
    refusing = {i: 400 for i in range(servers)}
    faults = FaultConfig(refuse=refusing, refuse_after=after, bad_prompts=bad)
    sim = SimConfig(time_scale=0, mean_output_tokens=20, faults=faults)
    with SimFleet(servers, sim) as fleet, pytest.raises(FleetUnavailableError) as info:
        generate(fast_config(prompts, out, fleet.urls), log=lambda _l: None, handle_signals=False)
    line = str(info.value)
    assert "\n" not in line and "configured differently" in line, line
    assert "answered earlier in this run" in line or "of the first" in line, line
    assert {f.message for f in failures(out)} <= {BAD}  # bad prompts met before the change
    # the fleet answers again: the same command settles the rest, every prompt once
    fixed = SimConfig(time_scale=0, mean_output_tokens=20, faults=FaultConfig(bad_prompts=bad))
    with SimFleet(servers, fixed) as fleet:
        generate(fast_config(prompts, out, fleet.urls), log=lambda _l: None, handle_signals=False)
    done, failed = check_exactly_once(str(out), set(ids))
    assert done + failed == prompts_n
    assert {f.id for f in failures(out)} == _bad_ids(prompts, bad)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    servers=st.integers(1, 3),
    rate=st.sampled_from([0.02, 0.1, 0.3]),
    kind=st.sampled_from(["plain", "mixed"]),
    n=st.sampled_from([1, 2]),
)
def test_prompts_every_server_refuses_are_each_recorded(
    tmp_path_factory: pytest.TempPathFactory, servers: int, rate: float, kind: str, n: int
) -> None:
    """Prompts every server refuses, the fleet unchanged (its canaries answered): each is its
    prompt's Failure, once, quoting the refusal; every other prompt is answered; the run
    ends (exit 0: no stop)."""
    tmp = tmp_path_factory.mktemp("b")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 120, kind=kind)
    out = tmp / "run"
    sim = SimConfig(time_scale=0, mean_output_tokens=20, faults=FaultConfig(bad_prompts=rate))
    with SimFleet(servers, sim) as fleet:
        summary = generate(
            fast_config(prompts, out, fleet.urls, n=n), log=lambda _l: None, handle_signals=False
        )
    bad = _bad_ids(prompts, rate)
    assert {f.id for f in failures(out)} == bad
    assert {c.id for c in completions(out)} == set(ids) - bad
    assert {(f.reason, f.message) for f in failures(out)} == (
        {("invalid_request", BAD)} if bad else set()
    )
    assert len(failures(out)) == n * len(bad) and len(completions(out)) == n * (120 - len(bad))
    assert summary.failures == n * len(bad)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    servers=st.sampled_from([1, 2, 4]),
    rate=st.sampled_from([0.05, 0.2, 0.6]),
    slots=st.sampled_from([8, 64]),
)
def test_refusals_coming_back_first_do_not_stop_a_fleet_that_answers(
    tmp_path_factory: pytest.TempPathFactory, servers: int, rate: float, slots: int
) -> None:
    """Answers take time and refusals come back at once: with a share of prompts every
    server refuses, the first outcomes to come back are mostly refusals. The command is not
    stopped for them (the opening judges the first jobs sent, and stops only when none was
    answered): each bad prompt is its Failure, every other prompt answered."""
    tmp = tmp_path_factory.mktemp("t")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 200)
    out = tmp / "run"
    sim = SimConfig(
        time_scale=0.05,
        mean_output_tokens=60,
        max_running=slots,
        faults=FaultConfig(bad_prompts=rate),
    )
    with SimFleet(servers, sim) as fleet:
        generate(fast_config(prompts, out, fleet.urls), log=lambda _l: None, handle_signals=False)
    bad = _bad_ids(prompts, rate)
    assert {f.id for f in failures(out)} == bad
    assert check_exactly_once(str(out), set(ids)) == (200 - len(bad), len(bad))


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(servers=st.integers(1, 3), after=st.integers(20, 40))
def test_a_fleet_that_turns_to_refuse_prompts_with_tools_stops(
    tmp_path_factory: pytest.TempPathFactory, servers: int, after: int
) -> None:
    """Restarted without tool calling mid-run: every prompt with tools is refused, the others
    answered still. The canaries of those refusals are answered requests with tools (a plain
    one would be answered, and every prompt with tools left recorded as failed): refused
    alike, the command stops in one line, nothing of it recorded, and the fleet that answers
    again settles every prompt once."""
    tmp = tmp_path_factory.mktemp("k")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 150, kind="mixed")
    out = tmp / "run"
    sim = SimConfig(
        time_scale=0, mean_output_tokens=20, unsupported=["tools"], unsupported_after=after
    )
    line = _stops_then_settles(prompts, out, ids, servers, sim, "Unsupported parameter: tools")
    assert "answered earlier in this run" in line, line


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(servers=st.integers(1, 3), after=st.integers(20, 40))
def test_a_fleet_that_turns_to_refuse_later_turns_stops(
    tmp_path_factory: pytest.TempPathFactory, servers: int, after: int
) -> None:
    """Restarted with a chat template that cannot take a conversation's history (the
    target's turn, a tool result): every conversation's later request is refused, every
    first request answered still. The canaries of those refusals are answered conversations'
    last requests (their first one would be answered, and every conversation left recorded as
    failed): refused alike, the command stops in one line, nothing of it recorded, and the
    fleet that answers again settles every prompt once."""
    tmp = tmp_path_factory.mktemp("r")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 150, kind="mixed")
    out = tmp / "run"
    sim = SimConfig(  # 4 slots a server: conversations are answered whole before the change
        time_scale=0,
        mean_output_tokens=20,
        max_running=4,
        unsupported=["role:assistant"],
        unsupported_after=after,
    )
    # in file order each server answers whole conversations among its first requests (in the
    # learnt order a loaded machine may send every conversation after the change: with none
    # answered, bad conversations and a changed fleet cannot be told apart, as documented)
    line = _stops_then_settles(prompts, out, ids, servers, sim, HISTORY, order="file")
    assert "answered earlier in this run" in line, line


def test_a_resumed_command_over_a_fleet_refusing_later_turns_stops(tmp_path: Path) -> None:
    """A command resuming a run of conversations over a fleet that now refuses their history:
    every first request answered, every later one refused. Its opening stop is first asked of
    a conversation an earlier command answered, by its last request (its first one would be
    answered, and every conversation left recorded as failed): refused alike, the command
    stops in one line, nothing recorded; the fleet that answers again settles the rest."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60, kind="multi")
    out = tmp_path / "run"
    with SimFleet(1, SimConfig(time_scale=0, mean_output_tokens=20)) as fleet:
        generate(fast_config(prompts, out, fleet.urls, limit=40), log=lambda _l: None)
    changed = SimConfig(time_scale=0, mean_output_tokens=20, unsupported=["role:assistant"])
    _stops_then_settles(prompts, out, ids, 1, changed, HISTORY)


def test_the_cli_stops_in_one_line_mid_run_and_the_fixed_fleet_finishes(tmp_path: Path) -> None:
    """``fleet sim --refuse 0:400 --refuse-after 40`` on a fleet of one: generate answers 40,
    then stops with exit 1 and one ``error:`` line; nothing refused is recorded; the same
    command over a fleet that answers finishes the rest."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 120)
    out = tmp_path / "run"
    base = [*CLI, "--progress", "off", "--prompts", str(prompts), "--out", str(out)]
    args = ["--time-scale", "0", "--refuse", "0:400", "--refuse-after", "40"]
    with SimProcess(n=1, args=args) as sim:
        res = subprocess.run(
            [*base, "--fleet", str(sim.fleet_yaml)], capture_output=True, text=True, timeout=90
        )
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "answered earlier in this run" in errors[0], res.stderr
    assert failures(out) == [] and 1 <= len(completions(out)) <= 40
    with SimProcess(n=1, args=["--time-scale", "0"]) as sim:
        again = subprocess.run(
            [*base, "--fleet", str(sim.fleet_yaml)], capture_output=True, text=True, timeout=90
        )
    assert again.returncode == 0, again.stderr[-3000:]
    assert check_exactly_once(str(out), set(ids)) == (120, 0)


def test_a_command_waiting_on_its_canaries_says_so(tmp_path: Path) -> None:
    """When all a command waits for is the refusal check (bad prompts last in the file, every
    other prompt answered), the progress views say what it waits for instead of an ETA: the
    canaries out, which server, how long (a hung server keeps a command up to 3 x 120 s at its
    end)."""
    import threading
    import time

    from tests.integration.generate.helpers import write_bad_and_good

    prompts = tmp_path / "p.jsonl"
    bad, good = write_bad_and_good(prompts, bad=3, good=16, rate=0.2, bad_first=False)
    sim = SimConfig(  # a step of 0.4 s: a canary's one token is out for a while
        time_scale=20, mean_output_tokens=3, faults=FaultConfig(bad_prompts=0.2)
    )
    states: list[str] = []
    done = threading.Event()

    def watch(engine: Any) -> None:
        def poll() -> None:
            while not done.wait(0.01):
                state = engine._state()
                if state is not None and state not in states:
                    states.append(state)

        threading.Thread(target=poll, daemon=True).start()

    with SimFleet(1, sim) as fleet:
        cfg = fast_config(prompts, tmp_path / "run", fleet.urls, order="file")
        try:
            summary = generate(cfg, on_engine=watch, log=lambda _l: None, handle_signals=False)
        finally:
            done.set()
            time.sleep(0.05)
        name = fleet.urls[0].split("://", 1)[-1]
    assert summary.completed == len(good) and {f.id for f in failures(tmp_path / "run")} == bad
    checking = [s for s in states if s.startswith("checking: ")]
    assert checking, states
    assert f"refused prompt(s) held while {name} is asked again" in checking[0], checking


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(servers=st.integers(1, 2), first=st.sampled_from([30, 45]))
def test_a_resumed_command_of_mixed_prompts_over_a_fleet_refusing_later_turns_stops(
    tmp_path_factory: pytest.TempPathFactory, servers: int, first: int
) -> None:
    """A command resuming a run of plain prompts, prompts with tools and conversations, over a
    fleet that now refuses a conversation's history: its plain prompts are answered (the
    opening does not stop), every conversation's later request refused. This command answered
    no conversation to ask again, the run did: the canaries of those refusals are the
    conversations an earlier command answered (a plain prompt is answered, and every
    conversation left was recorded as failed, exit 0): refused alike, the command stops in
    one line, nothing of it recorded; the fleet that answers again settles the rest."""
    tmp = tmp_path_factory.mktemp("m")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 90, kind="mixed")
    out = tmp / "run"
    with SimFleet(servers, SimConfig(time_scale=0, mean_output_tokens=20)) as fleet:
        generate(fast_config(prompts, out, fleet.urls, limit=first), log=lambda _l: None)
    changed = SimConfig(time_scale=0, mean_output_tokens=20, unsupported=["role:assistant"])
    _stops_then_settles(prompts, out, ids, servers, changed, HISTORY)


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    servers=st.integers(1, 2), after=st.integers(30, 50), max_tokens=st.sampled_from([12, 14, 16])
)
def test_conversations_cut_after_their_first_turn_do_not_hide_a_fleet_refusing_history(
    tmp_path_factory: pytest.TempPathFactory, servers: int, after: int, max_tokens: int
) -> None:
    """Conversations, many cut by the token limit at their first turn (they end there: their
    only request has no history), the rest asked their second request; the fleet turns to
    refuse a conversation's history. The cut ones are still answered after the change: as
    canaries (their last request is their first) they would be answered, and each
    conversation refused since recorded as failed. A conversation asked with history stays
    the canary: refused alike, the command stops in one line, nothing of it recorded."""
    tmp = tmp_path_factory.mktemp("s")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 150, kind="multi")
    out = tmp / "run"
    sim = SimConfig(
        time_scale=0,
        mean_output_tokens=12,
        min_output_tokens=4,
        max_running=4,
        unsupported=["role:assistant"],
        unsupported_after=after,
    )
    fixed = SimConfig(time_scale=0, mean_output_tokens=12, min_output_tokens=4)
    _stops_then_settles(prompts, out, ids, servers, sim, HISTORY, fixed, max_tokens=max_tokens)
    stops = [c.stop_reason for c in completions(out)]
    assert "length" in stops and None in stops, stops  # both shapes met
