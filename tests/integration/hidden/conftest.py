"""Fixtures of the hidden-states integration tier: tokenize's samples and a tiny target."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.integration.hidden.helpers import target_for, tokenized_run


@pytest.fixture(scope="session")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(tokenize's output of a 40-prompt simulated run, its tokenizer folder)."""
    return tokenized_run(tmp_path_factory.mktemp("hidden-run"))


@pytest.fixture(scope="session")
def target(tokenized: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 8-layer Qwen3-shaped target sized to the run's tokenizer."""
    return target_for(tokenized[1], tmp_path_factory.mktemp("hidden-target"))
