"""The vLLM engine's room check: a batch whose staged files cannot fit in the fleet's folder is
refused in one line, and what the line advises works. Generated over sample lengths, the
folder's free space and --batch-tokens; the batches are the stage's own (``plan.batches``)."""

from __future__ import annotations

import re
import shutil
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draftdata.hidden.vllm_backend as vb
from draftdata.errors import ConfigError
from draftdata.hidden.backend import ModelFacts
from draftdata.hidden.plan import batches
from draftdata.hidden.writer import SampleRow

PER_TOKEN = 4 * 32 * 2 + 8  # 4 layers x 32 wide in bf16, and the token id


def _backend(free: int, monkeypatch: pytest.MonkeyPatch, staging: str) -> Any:
    backend = object.__new__(vb.VllmBackend)
    backend._facts = ModelFacts(model_type="m", num_layers=8, hidden_size=32, dtype="bfloat16")
    backend.fleet = SimpleNamespace(hidden_states=SimpleNamespace(layers=[1, 2, 3, 4]))
    backend.staging = staging
    usage = shutil.disk_usage(staging)
    monkeypatch.setattr(vb.shutil, "disk_usage", lambda _: usage._replace(free=free))
    # past the check, nothing is sent: the request coroutine is closed unrun
    backend._call = lambda coro: coro.close()
    return backend


def _refusal(backend: Any, lengths: list[int], budget: int) -> str | None:
    rows = [
        SampleRow(
            row=i, id=str(i), input_ids=np.zeros(n, np.int64), loss_mask=np.zeros(n, np.int64)
        )
        for i, n in enumerate(lengths)
    ]
    for batch in batches(rows, budget):
        try:
            backend.states([s.input_ids.tolist() for s in batch])
        except ConfigError as exc:
            return str(exc)
    return None


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=12),
    room_tokens=st.integers(0, 600),
    budget=st.integers(1, 2000),
)
def test_the_advice_of_a_refused_batch_runs(
    lengths: list[int],
    room_tokens: int,
    budget: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A refusal naming a --batch-tokens is one the same samples then pass with; a sample too
    long to fit alone is said as such (no --batch-tokens helps it) and is indeed too long."""
    with pytest.MonkeyPatch.context() as mp:
        backend = _backend(room_tokens * PER_TOKEN + 7, mp, str(tmp_path_factory.getbasetemp()))
        line = _refusal(backend, lengths, budget)
        if line is None:
            return
        assert "\n" not in line
        advised = re.search(r"use --batch-tokens ([\d,]+) or less", line)
        if advised is None:
            assert "alone" in line and max(lengths) > room_tokens, line
            return
        fits = int(advised.group(1).replace(",", ""))
        assert fits >= 1, line
        assert _refusal(backend, lengths, fits) is None, line
