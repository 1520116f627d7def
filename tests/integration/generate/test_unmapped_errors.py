"""An exception in a request that nobody mapped (a bug, not a server fault) against the
simulator: generate stops at once with that exception and its traceback, not a retry as a
"malformed" answer; what was committed is kept and the same command resumes it."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import write_prompts

from draftdata.cli import main
from draftdata.generate.engine.client import EndpointClient
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store.read import iter_completions, iter_failures

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "bug", [KeyError("usage"), AttributeError("'NoneType' object has no attribute 'x'")]
)
def test_a_bug_in_a_request_stops_generate_with_its_traceback_and_resumes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bug: Exception,
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 300)
    out = tmp_path / "run"
    real_chat = EndpointClient.chat
    calls = {"n": 0}

    async def buggy_chat(self: EndpointClient, body: dict[str, Any]) -> Any:
        calls["n"] += 1
        if calls["n"] == 120:  # the bug meets one request, after others were answered
            raise bug
        return await real_chat(self, body)

    monkeypatch.setattr(EndpointClient, "chat", buggy_chat)
    config = SimConfig(time_scale=0.3, mean_output_tokens=60, output_sigma=0.3, max_running=16)
    args = ["generate", "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
    args += ["--flush-records", "16", "--flush-seconds", "0.2"]
    with SimFleet(2, config) as fleet:
        for url in fleet.urls:
            args += ["--endpoint", url]
        with pytest.raises(type(bug)) as info:
            main(args)
        assert info.value is bug  # the exception itself, not a one-line DraftdataError
        frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert "buggy_chat" in frames  # its traceback reaches where it was raised
        err = capsys.readouterr().err
        assert f"stopped by an unexpected {type(bug).__name__}" in err, err
        assert "run the same command to resume" in err
        sent = fleet.stats(0).requests + fleet.stats(1).requests
        assert sent < 200  # stopped at once, not after generating everything
        committed = {c.id for c in iter_completions(str(out))}
        assert 60 <= len(committed) < 300  # what finished before the bug is kept
        assert not list(iter_failures(str(out)))  # and nothing was charged to a prompt
        monkeypatch.setattr(EndpointClient, "chat", real_chat)
        with pytest.raises(SystemExit) as again:
            main(args)
        assert again.value.code in (None, 0), capsys.readouterr().err
    assert check_exactly_once(str(out), set(ids)) == (300, 0)
