"""Fixtures of the tokenize integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftdata.demo.tokenizer import ensure_demo_tokenizer


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """draftdata's demo BPE with the Qwen3-style generation-marker template (trained once)."""
    return ensure_demo_tokenizer(tmp_path_factory.mktemp("tok"))
