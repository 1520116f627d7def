"""Impossible answers are a server fault, not data (issue 24): a server answering 64-token
requests with 50 MB bodies, with negative or astronomical usage, or with more text than its
usage could write, is taken out (one line), its prompts go to the healthy simulator beside it,
and nothing it said is committed. The body is read only up to a bound tied to the request's
output limit (the server sees the client hang up long before its 50 MB are sent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, write_prompts
from tests.integration.generate.rogue import RogueServer

from draftdata.sim.run import SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
FAST = ["--time-scale", "0.01", "--mean-output-tokens", "40"]


def _generate(prompts: Path, out: Path, urls: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [*CLI, "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
    for url in urls:
        cmd += ["--endpoint", url]
    cmd += ["--max-tokens", "64", "--flush-seconds", "0.2", "--concurrency", "10"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _usage(prompt: int, output: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


@pytest.mark.parametrize(
    ("behaviour", "kwargs", "said"),
    [
        ("huge", {"size": 50 << 20}, "bytes to a request for at most 64 tokens"),
        ("usage", {"usage": _usage(-7, 5)}, "negative number of tokens"),
        ("usage", {"usage": _usage(12, 10**12)}, "1,000,000,000,000 output tokens"),
        ("usage", {"usage": _usage(12, 13_100_000)}, "against max_tokens 64"),
        ("usage", {"usage": _usage(10**9, 5)}, "prompt tokens for a request of"),
        ("usage", {"usage": _usage(12, 5), "content": "y" * 40_000}, "bytes of text"),
    ],
)
def test_an_impossible_answer_takes_its_endpoint_out_and_is_never_committed(
    tmp_path: Path, behaviour: str, kwargs: dict[str, Any], said: str
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 40)
    out = tmp_path / "run"
    with SimProcess(n=1, args=FAST) as sim, RogueServer(behaviour, **kwargs) as rogue:
        res = _generate(prompts, out, [rogue.url, sim.urls[0]])
        stats = rogue.stats
    assert res.returncode == 0, res.stderr[-3000:]
    assert stats.chats >= 1
    assert check_exactly_once(str(out), set(ids)) == (40, 0)
    got = completions(out)
    assert {c.endpoint for c in got} == {sim.urls[0]}
    assert all(0 <= c.usage.completion_tokens <= 64 for c in got)
    taken = [x for x in res.stderr.splitlines() if "taken out" in x and rogue.url + " " in x]
    assert len(taken) == 1, res.stderr
    assert "gives impossible answers" in taken[0] and said in taken[0], taken[0]
    assert {c.attempts for c in got} == {1}  # the server's fault is not the prompt's attempt
    if behaviour == "huge":
        assert stats.cut >= 1  # the client hung up: it did not read 50 MB


def test_a_sane_answer_from_the_same_server_is_kept(tmp_path: Path) -> None:
    """The control: the server of the test above, answering within the bounds, is used."""
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 40)
    out = tmp_path / "run"
    with (
        SimProcess(n=1, args=FAST) as sim,
        RogueServer("usage", usage=_usage(12, 5), content="y" * 600) as rogue,
    ):
        res = _generate(prompts, out, [rogue.url, sim.urls[0]])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "taken out" not in res.stderr
    assert rogue.url in {c.endpoint for c in completions(out)}
