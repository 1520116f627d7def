"""Faults in generate's commit path against the simulator: an unexpected exception (a bug, not a
StoreError) stops the run at once with one line and exit 1, and the same command resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import write_prompts

from draftdata.cli import main
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store.run import Run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("exc", [ValueError("injected: a record pyarrow cannot encode"), KeyError])
def test_unexpected_commit_error_stops_the_run_at_once_and_resumes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: BaseException | type[BaseException],
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 400)
    out = tmp_path / "run"
    real_flush = Run.flush
    calls = {"n": 0}

    def broken_flush(self: Run) -> int:
        calls["n"] += 1
        if calls["n"] == 3:  # the third flush meets the bug
            real_flush(self)  # the records so far are committed
            raise exc
        return real_flush(self)

    monkeypatch.setattr(Run, "flush", broken_flush)
    config = SimConfig(time_scale=0.3, mean_output_tokens=60, output_sigma=0.3, max_running=16)
    args = ["generate", "--prompts", str(prompts), "--out", str(out), "--progress", "off"]
    args += ["--flush-records", "16", "--flush-seconds", "0.2"]
    with SimFleet(2, config) as fleet:
        for url in fleet.urls:
            args += ["--endpoint", url]
        with pytest.raises(SystemExit) as info:
            main(args)
        sent = fleet.stats(0).requests + fleet.stats(1).requests
        err = capsys.readouterr().err
        assert info.value.code == 1, err
        assert "Traceback" not in err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err
        assert "committing to" in errors[0] and "run the same command to resume" in errors[0]
        name = exc.__name__ if isinstance(exc, type) else type(exc).__name__
        assert name in errors[0]
        assert sent < 300  # stopped at once, not after generating everything
        monkeypatch.setattr(Run, "flush", real_flush)
        with pytest.raises(SystemExit) as again:
            main(args)
        resumed: Any = again.value.code
        assert resumed in (None, 0), capsys.readouterr().err
    assert check_exactly_once(str(out), set(ids)) == (400, 0)
