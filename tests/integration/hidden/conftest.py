"""Fixtures of the hidden-states integration tier: tokenize's samples and a tiny target; a
simulated hidden-states fleet and its job (``simfleet.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.integration.hidden.helpers import target_for, tokenized_run
from tests.integration.hidden.simfleet import sim_config, write_model, write_samples

from draftdata.sim.run import SimFleet


@pytest.fixture(scope="session")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(tokenize's output of a 40-prompt simulated run, its tokenizer folder)."""
    return tokenized_run(tmp_path_factory.mktemp("hidden-run"))


@pytest.fixture(scope="session")
def target(tokenized: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 8-layer Qwen3-shaped target sized to the run's tokenizer."""
    return target_for(tokenized[1], tmp_path_factory.mktemp("hidden-target"))


@pytest.fixture
def sim_job(tmp_path: Path) -> dict[str, Any]:
    """A target folder, 48 tokenized samples and the fleet's staging folder (``simfleet``),
    for `hidden-states --engine vllm` against the simulated fleet."""
    staging = tmp_path / "staging"
    staging.mkdir()
    return {
        "model": write_model(tmp_path / "model"),
        "samples": write_samples(tmp_path / "tok", 48),
        "tok": tmp_path / "tok",
        "staging": staging,
        "tmp": tmp_path,
    }


@pytest.fixture
def sim_fleet(sim_job: dict[str, Any]) -> Iterator[Any]:
    """Start a simulated fleet; yields a function (n, **SimConfig) -> (SimFleet, fleet.yaml)."""
    started: list[SimFleet] = []

    def start(n: int, **kw: Any) -> tuple[SimFleet, Path]:
        fleet = SimFleet(n=n, config=sim_config(sim_job["staging"], **kw)).__enter__()
        started.append(fleet)
        return fleet, fleet.write(sim_job["tmp"] / f"fleet-{len(started)}.yaml")

    yield start
    for f in started:
        f.__exit__(None, None, None)
