"""`draftdata hidden-states` end to end on tokenize's samples and a tiny random Qwen3: the files
hold exactly each sample's tokens and its states alone, a rerun rewrites nothing, a changed
setting is refused, the bill refuses what does not fit, a pilot forecasts and the same command
finishes, and a planted batching fault is caught by the verification."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from tests.integration.hidden.helpers import samples_of, stats_of, target_for
from tests.unit.hidden.helpers import write_samples

from draftdata.cli import main
from draftdata.errors import LeaseHeldError, RunMismatchError, VerificationError
from draftdata.hidden.backend import BackendSpec
from draftdata.hidden.config import HiddenConfig
from draftdata.hidden.layers import Capture
from draftdata.hidden.setfiles import read_set
from draftdata.hidden.stage import hidden_states
from draftdata.hidden.transformers_backend import TransformersBackend
from draftdata.hidden.writers import writer_for
from draftdata.store.lease import acquire
from draftdata.store.opener import open_store

pytestmark = pytest.mark.integration


def _cli(*args: str) -> int:
    try:
        main(["hidden-states", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _args(tokenized: Path, target: Path, out: Path | str, fmt: str, *extra: str) -> list[str]:
    return [str(tokenized), "--model", str(target), "--out", str(out), "--format", fmt,
            "--gpus", "cpu", "--batch-tokens", "600", *extra]  # fmt: skip


def _alone(target: Path, capture: Capture, ids: np.ndarray) -> Any:
    backend = TransformersBackend(BackendSpec(model=str(target), capture=capture))
    try:
        return backend.states([ids])[0]
    finally:
        backend.close()


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_files_hold_each_samples_tokens_and_its_states_alone(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path, fmt: str, capfd: Any
) -> None:
    import torch

    tok_dir, _ = tokenized
    out = tmp_path / "set"
    assert _cli(*_args(tok_dir, target, out, fmt)) == 0
    err = capfd.readouterr().err
    assert "samples, " in err and "4 layers × 64 × bf16 → " in err  # the bill, first
    hs = read_set(str(out))
    samples = samples_of(tok_dir)
    index = hs.index.to_pylist()
    assert sorted(r["id"] for r in index) == sorted(samples)  # every sample, once
    assert [r["row"] for r in index] == list(range(len(index)))
    w = writer_for(fmt)
    assert sorted(p.name for p in (out / "hidden_states").iterdir()) == sorted(
        r["file"].split("/")[-1] for r in index
    )
    capture = Capture((2, 4, 5), w.capture_last)
    backend = TransformersBackend(BackendSpec(model=str(target), capture=capture))
    try:
        for r in index:
            stored = w.decode((out / r["file"]).read_bytes())
            sample = samples[r["id"]]
            assert stored.input_ids.tolist() == sample["input_ids"]
            if fmt == "specforge":
                assert stored.loss_mask is not None
                assert stored.loss_mask.tolist() == sample["loss_mask"]
            alone = backend.states([np.asarray(sample["input_ids"], np.int64)])[0]
            want = alone.to(torch.bfloat16).float()
            # batched on the CPU in float32, stored in bf16: at most one bf16 rounding apart
            torch.testing.assert_close(stored.states, want, rtol=1 / 64, atol=1e-3)
    finally:
        backend.close()
    summary = hs.summary
    assert summary is not None and summary["complete"] and summary["verification"]["passed"]
    assert summary["bytes_total"] == sum(
        p.stat().st_size for p in (out / "hidden_states").iterdir()
    )
    assert abs(summary["bill_bytes"] - summary["bytes_total"]) <= 0.02 * summary["bytes_total"]
    manifest = hs.manifest["settings"]
    assert manifest["aux_layers"] == [2, 4, 5] and manifest["last"] == w.capture_last
    # a rerun: nothing to compute, nothing rewritten, a second summary
    before = stats_of(out)
    assert _cli(*_args(tok_dir, target, out, fmt)) == 0
    assert stats_of(out) == before
    again = read_set(str(out)).summary
    assert again is not None and again["written"] == 0 and again["done_before"] == len(index)
    assert again["verification"]["samples"] == 8  # files already there are verified too


def test_speculators_dataset_rows_are_the_files_rows(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path
) -> None:
    import datasets
    import torch

    tok_dir, _ = tokenized
    out = tmp_path / "set"
    assert _cli(*_args(tok_dir, target, out, "speculators", "--verify", "0")) == 0
    ds = datasets.load_from_disk(str(out))
    index = pq.read_table(out / "hidden_index.parquet").to_pylist()
    samples = samples_of(tok_dir)
    assert len(ds) == len(index)
    for r in index:
        row = ds[r["row"]]  # torch tensors: the format speculators' reader sets
        assert row["input_ids"].dtype == row["loss_mask"].dtype == torch.int64
        assert row["input_ids"].tolist() == samples[r["id"]]["input_ids"]
        assert row["loss_mask"].tolist() == samples[r["id"]]["loss_mask"]
        assert int(row["seq_len"]) == len(samples[r["id"]]["input_ids"])


@pytest.mark.parametrize(
    ("extra", "changed"),
    [
        (["--dtype", "fp16"], 'dtype: "bf16" -> "fp16"'),
        (["--layers", "1,3,6"], "aux_layers"),
        (["--max-length", "50"], "max_length"),
    ],
)
def test_a_changed_setting_is_refused_in_one_line(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path, extra: list[str], changed: str,
    capfd: Any,
) -> None:  # fmt: skip
    tok_dir, _ = tokenized
    out = tmp_path / "set"
    assert _cli(*_args(tok_dir, target, out, "specforge", "--pilot", "3", "--verify", "0")) == 0
    before = stats_of(out)
    capfd.readouterr()
    assert _cli(*_args(tok_dir, target, out, "specforge", *extra)) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "made with other settings" in err[-1]
    assert changed in err[-1]
    assert stats_of(out) == before


def test_another_model_or_dataset_is_refused(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path
) -> None:
    tok_dir, tok = tokenized
    out = tmp_path / "set"
    config = HiddenConfig(tokenized=str(tok_dir), model=str(target), out=str(out),
                          format="specforge", gpus="cpu", pilot=2, verify=0)  # fmt: skip
    hidden_states(config, log=None)
    other = target_for(tok, tmp_path / "other", layers=9)
    with pytest.raises(RunMismatchError, match="model"):
        hidden_states(HiddenConfig(**{**_fields(config), "model": str(other)}), log=None)
    rows = list(samples_of(tok_dir).values())  # the same samples but the last one
    fewer = write_samples(tmp_path / "fewer", rows[:-1])
    with pytest.raises(RunMismatchError, match="dataset"):
        hidden_states(HiddenConfig(**{**_fields(config), "tokenized": str(fewer)}), log=None)


def _fields(config: HiddenConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in config.__struct_fields__}


def test_max_bytes_refuses_before_anything_is_written(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path, capfd: Any
) -> None:
    tok_dir, _ = tokenized
    out = tmp_path / "set"
    assert _cli(*_args(tok_dir, target, out, "speculators", "--max-bytes", "100KB")) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --max-bytes 100 KB: this set would take 2.0 MB (")
    assert not out.exists() or not any(out.iterdir())


def test_a_pilot_forecasts_then_the_same_command_finishes(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path, capfd: Any
) -> None:
    tok_dir, _ = tokenized
    out = tmp_path / "set"
    assert _cli(*_args(tok_dir, target, out, "specforge", "--pilot", "0.25")) == 0
    err = capfd.readouterr().err
    assert "at the pilot's " in err and "tok/s on the CPU: " in err and "tokens left" in err
    n = len(samples_of(tok_dir))
    pilot = stats_of(out)
    assert len(pilot) == round(0.25 * n)
    assert not read_set(str(out)).store.exists("hidden_summary.json")  # not done yet
    assert _cli(*_args(tok_dir, target, out, "specforge")) == 0
    after = stats_of(out)
    assert len(after) == n and {k: after[k] for k in pilot} == pilot
    assert read_set(str(out)).summary is not None


def test_two_cpu_workers_write_the_same_set(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path
) -> None:
    tok_dir, _ = tokenized
    one, two = tmp_path / "one", tmp_path / "two"
    assert _cli(*_args(tok_dir, target, one, "speculators", "-q")) == 0
    assert _cli(*_args(tok_dir, target, two, "speculators", "--gpus", "cpu:2", "-q")) == 0
    assert sorted(stats_of(one)) == sorted(stats_of(two))
    summary = read_set(str(two)).summary
    assert summary is not None and summary["devices"] == ["cpu", "cpu"]
    assert summary["verification"]["passed"]
    assert (one / "hidden_index.parquet").read_bytes() == (
        two / "hidden_index.parquet"
    ).read_bytes()


class _WrongRows(TransformersBackend):
    """A planted batching fault: left padding (with its mask) but each sample's *first* rows
    kept, as a backend that mixes up its padding side would."""

    def states(self, batch: Any) -> list[Any]:
        import torch

        width = max(len(b) for b in batch)
        rows = []
        for b in batch:
            padded = np.concatenate([np.zeros(width - len(b), np.int64), b])
            mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b)])
            self._got.clear()
            with torch.inference_mode():
                self.model(input_ids=torch.from_numpy(padded)[None], attention_mask=mask)
                stacked = torch.stack([self._got[s] for s in range(len(self._got))], dim=2)
            rows.append(stacked[0, : len(b)].float())
        return rows


def _wrong_rows(spec: BackendSpec) -> _WrongRows:
    return _WrongRows(spec)


def test_the_verification_catches_a_planted_wrong_batch(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path
) -> None:
    tok_dir, _ = tokenized
    config = HiddenConfig(tokenized=str(tok_dir), model=str(target), out=str(tmp_path / "set"),
                          format="speculators", gpus="cpu", batch_tokens=600)  # fmt: skip
    lines: list[str] = []
    with pytest.raises(
        VerificationError, match=r"verification failed after the first batches: layer .* differs"
    ):
        hidden_states(config, opener=_wrong_rows, log=lines.append)
    # caught as soon as the first batched samples were committed, not after the whole set
    written = list((tmp_path / "set" / "hidden_states").glob("hs_*"))
    assert 2 <= len(written) <= len(samples_of(tok_dir)) // 2
    assert any("one at a time after the first batches" in line for line in lines)
    # the same fault with --verify 0 goes unseen: the check is what caught it
    quiet = HiddenConfig(**{**_fields(config), "out": str(tmp_path / "unchecked"), "verify": 0})
    assert hidden_states(quiet, opener=_wrong_rows, log=None).complete


def test_one_writer_at_a_time(tokenized: tuple[Path, str], target: Path, tmp_path: Path) -> None:
    tok_dir, _ = tokenized
    out = tmp_path / "set"
    lease = acquire(open_store(str(out)))
    try:
        config = HiddenConfig(tokenized=str(tok_dir), model=str(target), out=str(out),
                              format="specforge", gpus="cpu")  # fmt: skip
        with pytest.raises(LeaseHeldError, match="another process"):
            hidden_states(config, log=None)
    finally:
        lease.release()


def test_a_protected_or_foreign_output_is_refused(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path, capfd: Any
) -> None:
    tok_dir, _ = tokenized
    assert _cli(*_args(tok_dir, target, tmp_path / "p" / "set", "specforge",
                       "--protect", str(tmp_path / "p"))) == 1  # fmt: skip
    assert "protected prefix" in capfd.readouterr().err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert _cli(*_args(tok_dir, target, foreign, "specforge")) == 1
    assert "not empty and holds no hidden_manifest.json" in capfd.readouterr().err
    assert json.loads(json.dumps(sorted(p.name for p in foreign.iterdir()))) == ["notes.txt"]


def test_the_start_lists_the_states_folder_once(
    tokenized: tuple[Path, str], target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pilot's set resumed: the start walks ``hidden_states/`` once, removing the temp
    files a killed command left and finding the files already there in the same walk (it was
    walked twice: ``sweep_temps``, then the done-set's listing; on a set of many thousand
    files the start paid for each)."""
    import os

    tok_dir, _ = tokenized
    out = tmp_path / "set"
    config = HiddenConfig(tokenized=str(tok_dir), model=str(target), out=str(out),
                          format="specforge", gpus="cpu", pilot=3, verify=0)  # fmt: skip
    hidden_states(config, log=None)
    states = out / "hidden_states"
    have = sorted(p.name for p in states.iterdir())
    for i in range(3):  # what killed writers left beside the files
        (states / f".{have[0]}.tmp-killed{i}").write_bytes(b"x" * (i + 1))
    walks: list[str] = []
    started = [True]  # until the line that says what is done

    def counted(real: Any) -> Any:
        def call(path: Any = ".", *args: Any, **kw: Any) -> Any:
            if started[0] and Path(path).resolve() == states.resolve():
                walks.append(real.__name__)
            return real(path, *args, **kw)

        return call

    monkeypatch.setattr(os, "walk", counted(os.walk))
    monkeypatch.setattr(os, "scandir", counted(os.scandir))
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if "samples already in" in line:
            started[0] = False

    summary = hidden_states(HiddenConfig(**{**_fields(config), "pilot": None}), log=log)
    assert summary.complete
    assert len(walks) == 1, walks
    assert any("removed 3 temp file(s) (6 B)" in line for line in lines), lines
    assert any(line.startswith("hidden-states: 3 of ") for line in lines), lines
    assert not [p for p in states.iterdir() if p.name.startswith(".")]
