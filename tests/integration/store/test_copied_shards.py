"""A run where some completions sit in two shards (a shard copied by hand, whole or in part,
once or twice): every reader counts each (id, sample) once and says how many it dropped
(issue 24: export dropped the copies but stats said "600 prompts, 700 completions" and
tokenize wrote 700 samples). A real run from the simulator, with two samples per prompt."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import simulated_run, user_prompts

from draftdata.export.stage import export_run
from draftdata.stats import compute_stats
from draftdata.store.write import parquet_bytes
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize
from draftdata.tokenize.summary import losses, summary_lines, warning_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """(a run of 80 prompts x 2 samples in ~8 shards, its tokenizer, its completions)."""
    root = tmp_path_factory.mktemp("copied")
    run, tok = simulated_run(
        root, user_prompts(80, "Question {i}: what is {i} * 3?", "p{:03d}"),
        n=2, mean_output_tokens=40, max_tokens=80, flush_records=20,
    )  # fmt: skip
    return run, tok, 160


copies = st.lists(
    st.tuples(
        st.integers(0, 100),  # which shard (modulo the number of shards)
        st.sampled_from(["aaa", "zzz"]),  # a name sorting before or after the originals
        st.floats(0.0, 1.0),  # where the copied slice starts
        st.floats(0.0, 1.0),  # how much of the shard it holds
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(copies=copies)
def test_every_reader_counts_a_copied_completion_once(
    made: tuple[Path, str, int],
    copies: list[tuple[int, str, float, float]],
) -> None:
    source, tok, total = made
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(source, run)
        shards = sorted((run / "completions").glob("*.parquet"))
        duplicated = 0
        for n, (which, name, start, share) in enumerate(copies):
            table = pq.read_table(shards[which % len(shards)])
            first = int(start * (table.num_rows - 1))
            part = table.slice(first, max(1, int(share * (table.num_rows - first))))
            copy = run / "completions" / f"part-{name}{n}-000000.parquet"
            copy.write_bytes(parquet_bytes(part, checksums=True))
            duplicated += part.num_rows

        stats = compute_stats(str(run))
        assert stats["rows"] == total
        assert stats["duplicates"]["rows"] == duplicated
        assert stats["run"]["completions"] == total and stats["run"]["prompts"] == total // 2
        assert stats["run"]["duplicates"] == duplicated

        out = Path(tmp) / "tok"
        summary = tokenize(TokenizeConfig(run=str(run), tokenizer=tok, out=str(out)))
        assert summary.count("completions") == total
        # one unit per figure: duplicates in completions, apart from the samples' drops and
        # shares, which are those of the run without the copies
        assert summary.count("duplicates") == duplicated
        assert "duplicate" not in summary.dropped
        lines = summary_lines(summary)
        assert f"not counted: {duplicated} duplicate completions" in "\n".join(lines)
        alone = tokenize(TokenizeConfig(run=str(source), tokenizer=tok, out=str(Path(tmp) / "t0")))
        assert summary.count("samples") == alone.count("samples")
        assert summary.dropped == alone.dropped
        assert losses(summary) == losses(alone)
        assert warning_line(summary) == warning_line(alone)
        ids = [i for p in out.glob("*.parquet") for i in pq.read_table(p).column("id").to_pylist()]
        assert len(ids) == len(set(ids)) == summary.count("samples")

        exported = export_run(str(run), "sharegpt", Path(tmp) / "train.jsonl")
        assert exported.get("export.records") == total
        assert exported.get("export.duplicates_dropped") == duplicated
