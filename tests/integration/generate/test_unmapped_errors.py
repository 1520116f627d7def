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


@pytest.mark.parametrize(
    "where",
    [
        "Dispatcher._succeeded",
        "Dispatcher._failed",
        "Recheck.came",
        "Recheck.hold",
        "Progress.tick",
        "Endpoint.adapt",
        "Committer.flush",
    ],
)
def test_a_bug_in_acting_on_an_outcome_stops_generate_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A bug in the engine's own work (acting on an answer or a failure, the refusal check's
    canaries in their background task, the progress, load and commit loops) stops generate
    with that exception, as one in a request does. It was left in a task nobody awaited:
    printed at garbage collection (or never), the job never settled (hidden states' answers
    after 04e90c3: an IndexError on each), a loop dead for the rest of the run, and the run
    went on or ended exit 0."""
    from tests.integration.generate.helpers import fast_config, write_bad_and_good

    from draftdata.generate.engine import committer, dispatch, endpoint, progress, recheck
    from draftdata.generate.stage import generate
    from draftdata.sim.run import FaultConfig

    prompts = tmp_path / "p.jsonl"
    bad, good = write_bad_and_good(prompts, bad=12, good=150, rate=0.1, bad_first=False)
    ids = bad | good
    out = tmp_path / "run"
    owner_name, name = where.split(".")
    owner = {
        "Dispatcher": dispatch.Dispatcher,
        "Recheck": recheck.Recheck,
        "Progress": progress.Progress,
        "Endpoint": endpoint.Endpoint,
        "Committer": committer.Committer,
    }[owner_name]
    real = getattr(owner, name)
    calls = {"n": 0}
    bug = LookupError(f"planted in {where}")

    def planted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # Progress.tick: its first is the engine's start
            raise bug
        return real(self, *args, **kwargs)

    faults = FaultConfig(bad_prompts=0.1, error_500=0.05)
    config = SimConfig(time_scale=0.05, mean_output_tokens=20, max_running=8, faults=faults)
    with SimFleet(2, config) as fleet:
        cfg = fast_config(prompts, out, fleet.urls, order="file")
        monkeypatch.setattr(owner, name, planted)
        with pytest.raises(LookupError) as info:
            generate(cfg, log=lambda _l: None, handle_signals=False)
        assert info.value is bug
        monkeypatch.setattr(owner, name, real)
        generate(cfg, log=lambda _l: None, handle_signals=False)
    assert check_exactly_once(str(out), ids) == (len(good), len(bad))
