"""Wedged servers (issue 24): one that passes ``/health`` and ``/v1/models`` but never answers a
chat request, one that trickles a valid body a byte at a time. Beside a healthy simulator, the
prompts stuck on them are hedged onto the idle good endpoint within a bounded time (the wedged
server has never answered, so it has no measured rate), and the read timeout is a deadline for
the whole answer, not for each chunk."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, write_prompts
from tests.integration.generate.rogue import RogueServer

from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
FAST = ["--time-scale", "0.01", "--mean-output-tokens", "40"]


def _generate(
    prompts: Path, out: Path, urls: list[str], *args: str, limit: list[str] | None = None
) -> tuple[int, str, float]:
    """(exit code, stdout + stderr, seconds) of generate; exit None-like -9 past 90 s;
    ``limit``: the output limit's options (default ``--max-tokens 64``)."""
    cmd = [*CLI, "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
    for url in urls:
        cmd += ["--endpoint", url]
    cmd += ["--max-tokens", "64"] if limit is None else limit
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            [*cmd, "--flush-seconds", "0.2", "--concurrency", "5", *args],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        said = (exc.stdout or b"").decode() + (exc.stderr or b"").decode()  # type: ignore[union-attr]
        return -9, said, time.monotonic() - t0
    return res.returncode, res.stdout + res.stderr, time.monotonic() - t0


@pytest.mark.parametrize("behaviour", ["hang", "trickle"])
def test_prompts_on_a_wedged_server_are_hedged_onto_the_idle_good_one(
    tmp_path: Path, behaviour: str
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 10)
    out = tmp_path / "run"
    with SimProcess(n=1, args=FAST) as sim, RogueServer(behaviour, interval=1.0) as wedged:
        # the default --read-timeout (3600 s): only hedging can finish this in time
        code, said, took = _generate(prompts, out, [wedged.url, sim.urls[0]])
        chats = wedged.stats.chats
    assert code == 0, said[-3000:]
    assert chats >= 1  # the wedged server did get prompts
    assert check_exactly_once(str(out), set(ids)) == (10, 0)
    assert {c.endpoint for c in completions(out)} == {sim.urls[0]}
    assert took < 60, said[-2000:]
    line = next(x for x in said.splitlines() if x.startswith("  wasted"))
    assert "hedge won 0" not in line, said


def test_a_wedged_server_is_hedged_soon_without_an_output_limit(tmp_path: Path) -> None:
    """The default output limit (the context, 8192 here) and a fleet decoding ~40 tokens/s a
    sequence: the prompts on the wedged server are copied within seconds. Their age was
    taken as tokens produced at the fleet's rate: their domain's estimate grew with it, and
    the copy, judged on that estimate, waited until it reached the cap (~400 s here; half an
    hour on a 32K context)."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 10)
    out = tmp_path / "run"
    slow = ["--time-scale", "1", "--mean-output-tokens", "40"]
    with SimProcess(n=1, args=slow) as sim, RogueServer("hang", interval=1.0) as wedged:
        code, said, took = _generate(prompts, out, [wedged.url, sim.urls[0]], limit=[])
        chats = wedged.stats.chats
    assert code == 0, said[-3000:]
    assert chats >= 1
    assert check_exactly_once(str(out), set(ids)) == (10, 0)
    assert took < 45, said[-2000:]


def test_a_trickling_server_is_timed_out_per_request_not_per_chunk(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 10)
    out = tmp_path / "run"
    with SimProcess(n=1, args=FAST) as sim, RogueServer("trickle", interval=0.5) as trickle:
        # no hedging: the read deadline alone must free the prompts (each chunk comes well
        # within the timeout, the whole answer never does)
        code, said, took = _generate(
            prompts, out, [trickle.url, sim.urls[0]], "--no-hedge", "--read-timeout", "3"
        )
        chats = trickle.stats.chats
    assert code == 0, said[-3000:]
    assert chats >= 1
    assert check_exactly_once(str(out), set(ids)) == (10, 0)
    assert {c.endpoint for c in completions(out)} == {sim.urls[0]}
    assert "within 3 s" in said or "timeout" in said, said[-3000:]
    assert took < 60
