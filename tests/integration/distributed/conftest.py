"""One local Ray instance for the whole distributed tier (start-up costs ~15 s on 2 cores).

The instance starts after the moto S3 server so its workers inherit the AWS_* variables that
point every client at moto.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3

from draftdata.sim.run import SimConfig, SimFleet


@pytest.fixture(scope="session")
def ray_local(moto_s3: MotoS3) -> Iterator[Any]:
    """``ray`` initialised with 2 CPUs, no dashboard; shut down at the end of the session."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # No runtime_env: with one, Ray cannot use the workers it prestarts (+8 s here).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def fleet() -> Iterator[SimFleet]:
    """Two fast simulated servers (tens of ms per answer, reasoning parsed)."""
    config = SimConfig(mean_output_tokens=24, min_output_tokens=8, time_scale=0.1, seed=3)
    with SimFleet(2, config) as sim:
        yield sim


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """draftdata's demo BPE with the Qwen3-style generation-marker template (trained once)."""
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    return ensure_demo_tokenizer(tmp_path_factory.mktemp("tok"))
