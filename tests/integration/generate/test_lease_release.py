"""An error between opening the run and starting the engine still releases the run lease, so
the same command (in the same process: a notebook, a Ray worker that retries) goes on at once
instead of finding its own live pid holding the run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tests.integration.generate.helpers import completions, fast_config, write_prompts

import draftdata.generate.stage as stage
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("where", ["make_endpoints", "PromptReader"])
def test_error_after_the_run_is_opened_releases_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 12)
    out = tmp_path / "run"
    with SimFleet(1, SimConfig(time_scale=0.0, mean_output_tokens=8)) as fleet:
        config = fast_config(prompts, out, fleet.urls, lease_ttl=600.0)

        def boom(*args: object, **kwargs: object) -> None:
            raise Boom(where)

        with monkeypatch.context() as mp:
            mp.setattr(stage, where, boom)
            with pytest.raises(Boom):
                generate(config, handle_signals=False)
        started = time.monotonic()
        summary = generate(config, handle_signals=False)  # no RunLeaseError, no 600 s wait
        assert time.monotonic() - started < 60
    assert summary.completed == len(ids)
    assert sorted(c.id for c in completions(out)) == sorted(ids)
