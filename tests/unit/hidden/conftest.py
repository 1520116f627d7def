"""The tiny target the hidden-states unit tests share (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.unit.hidden.helpers import tiny_qwen3


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 8-layer Qwen3-shaped target (vocab 256, hidden 64)."""
    return tiny_qwen3(tmp_path_factory.mktemp("tiny-target"), layers=8)


@pytest.fixture(scope="session")
def shallow_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 5-layer one (every layer id checked against output_hidden_states)."""
    return tiny_qwen3(tmp_path_factory.mktemp("shallow-target"), layers=5, seed=1)
