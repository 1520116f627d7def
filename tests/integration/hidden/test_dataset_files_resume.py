"""speculators' dataset files beside the sample files, when several partitions' commands make
one set: a command killed before the last of them (state.json) leaves some there, and another
partition's command completes them (the store takes a key that holds exactly the same bytes as
done, store/base.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.unit.hidden.helpers import sample_rows, tiny_qwen3, write_samples  # noqa: E402

from draftdata.hidden.config import HiddenConfig  # noqa: E402
from draftdata.hidden.stage import hidden_states  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_set_whose_dataset_files_were_cut_short_completes(tmp_path: Path) -> None:
    model = tiny_qwen3(tmp_path / "model", layers=4)
    tok = write_samples(tmp_path / "tok", sample_rows(12, seed=2))

    def config(partition: str | None) -> HiddenConfig:
        return HiddenConfig(
            tokenized=str(tok), model=str(model), out=str(tmp_path / "set"),
            format="speculators", layers="1,2", gpus="cpu", verify=0, progress=False,
            partition=partition,
        )  # fmt: skip

    hidden_states(config("0/2"), log=None)
    (tmp_path / "set" / "state.json").unlink()  # as if killed before the last dataset file
    summary = hidden_states(config("1/2"), log=None)
    assert summary.complete
    assert (tmp_path / "set" / "state.json").exists()
