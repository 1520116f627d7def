"""Refusals in generate's commit path that no wait cures, under a real `draftdata generate`
process against the simulator: they end the command with one line and exit 1 instead of being
retried for ever as a store outage, and nothing committed is lost.

- Two partitions of one new run started with different settings: the one whose deferred
  manifest loses the race meets RunMismatchError at its first commit.
- The whole class: every StoreError that is no outage (``outage`` False) and every other
  DraftdataError, injected into ``Run.flush`` after a random number of good commits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import write_prompts

from draftdata.generate.prompts.partition import partition_of
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

CLI = [sys.executable, "-c", "import sys; from draftdata.cli import main; main(sys.argv[1:])"]
# a generate whose Run.flush raises errors.<argv[1]> from commit number argv[2] on (0: the first),
# and at the latest in the run's closing flush
REFUSING = [
    sys.executable,
    "-c",
    """
import sys
from draftdata import errors
from draftdata.cli import main
from draftdata.store.run import Run

kind, good = sys.argv[1], int(sys.argv[2])
real, real_close, calls, closing = Run.flush, Run.close, [0], [False]

def flush(self):
    calls[0] += 1
    # the last commit (close's flush) refuses too: a run may end in fewer commits than `good`
    if calls[0] > good or closing[0]:
        raise getattr(errors, kind)(f"injected refusal {kind}; fix it and run again")
    return real(self)

def close(self):
    closing[0] = True
    return real_close(self)

Run.flush = flush
Run.close = close
main(sys.argv[3:])
""",
]
# what the committer may meet that no retry cures; every one must end the command
REFUSALS = [
    "RunMismatchError",
    "ProtectedPrefixError",
    "AlreadyExistsError",
    "FormatVersionError",
    "InputError",
    "ConfigError",
]
ENDS_WITHIN = 60.0  # seconds; the old committer retried these for ever
# each example is a real process or two: no shrinking (a failing example would be rerun for
# minutes; the example hypothesis prints is already small)
PHASES = [Phase.explicit, Phase.reuse, Phase.generate]


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    config = SimConfig(time_scale=0.05, mean_output_tokens=60, output_sigma=0.3, max_running=32)
    with SimFleet(1, config) as running:
        yield running


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@settings(
    max_examples=6,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    kind=st.sampled_from(REFUSALS),
    good=st.integers(0, 3),
    n=st.integers(40, 160),
    flush_records=st.integers(4, 40),
)
# a run that ends in fewer commits than `good`: the refusal comes at its closing commit
@example(kind="InputError", good=3, n=40, flush_records=40)
def test_a_refusal_no_wait_cures_ends_generate_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    fleet: SimFleet,
    kind: str,
    good: int,
    n: int,
    flush_records: int,
) -> None:
    root = tmp_path_factory.mktemp("refusal")
    prompts = root / "p.jsonl"
    ids = write_prompts(prompts, n)
    out = root / "run"
    args = ["generate", "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
    args += ["--endpoint", fleet.urls[0], "--flush-records", str(flush_records)]
    args += ["--flush-seconds", "0.2"]
    try:
        stopped = subprocess.run(
            [*REFUSING, kind, str(good), *args],
            capture_output=True,
            text=True,
            timeout=ENDS_WITHIN,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{kind} was retried for ever: {exc.stderr!r}"[-2000:])
    err = stopped.stderr
    assert stopped.returncode == 1, err
    assert "Traceback" not in err
    lines = _errors(err)
    assert len(lines) == 1, err
    assert f"injected refusal {kind}" in lines[0]
    assert "retried with backoff" not in err and "waiting for the store" not in err, err
    # nothing committed is lost or doubled: the same command finishes the run
    resumed = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=ENDS_WITHIN)
    assert resumed.returncode == 0, resumed.stderr
    assert check_exactly_once(str(out), set(ids)) == (n, 0)


@settings(max_examples=3, deadline=None, phases=PHASES)
@given(
    tokens=st.lists(st.integers(40, 400), min_size=2, max_size=2, unique=True),
    delay=st.floats(0.0, 0.5),
)
def test_partitions_started_with_other_settings_stop_the_later_one(
    tmp_path_factory: pytest.TempPathFactory, tokens: list[int], delay: float
) -> None:
    root = tmp_path_factory.mktemp("clash")
    prompts = root / "p.jsonl"
    ids = write_prompts(prompts, 240)
    out = root / "run"
    # slow enough that both open the new run before either commits (the manifest is deferred
    # to the first commit), and one commit at the end
    config = SimConfig(time_scale=0.1, mean_output_tokens=60, output_sigma=0.3, max_running=8)
    with SimFleet(1, config) as fleet:
        procs = []
        for part, max_tokens in enumerate(tokens):
            args = ["generate", "--prompts", str(prompts), "--out", str(out)]
            args += ["--endpoint", fleet.urls[0], "--progress", "off", "--partition", f"{part}/2"]
            args += ["--max-tokens", str(max_tokens), "--flush-records", "1000"]
            args += ["--flush-seconds", "600"]
            procs.append(
                subprocess.Popen(
                    [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
            time.sleep(delay)
        outcomes = []
        try:
            for proc in procs:
                _, err = proc.communicate(timeout=ENDS_WITHIN)
                outcomes.append((proc.returncode, err))
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
            pytest.fail("a partition with other settings was retried for ever as an outage")
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 1], outcomes
    won = next(i for i, (code, _) in enumerate(outcomes) if code == 0)
    err = outcomes[1 - won][1]
    assert "Traceback" not in err
    lines = _errors(err)
    assert len(lines) == 1 and "other settings" in lines[0], err
    assert "retried with backoff" not in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["max_tokens"] == tokens[won]
    # the winner's partition is whole, exactly once; the loser committed nothing
    check_exactly_once(str(out), {i for i in ids if partition_of(i, 2) == won})
