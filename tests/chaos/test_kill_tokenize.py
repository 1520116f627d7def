"""kill -9 `tokenize` after any of its writes: a reader refuses the unfinished output, the same
command finishes it with exactly the samples of an uninterrupted run (each once), a further
rerun is a no-op, and other settings are refused before they write."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.test_kill_merge import DRIVER
from tests.integration.generate.helpers import simulated_run, user_prompts
from tests.unit.merge.helpers import file_hashes

from draftdata.errors import ConfigError, InputError
from draftdata.stats.readers import open_dataset
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(a run of 60 prompts in 6 shards, some multi-turn, with n=2; the tokenizer it used)."""
    root = tmp_path_factory.mktemp("tok-run")
    prompts = user_prompts(60, "Question {i}: {i} + {i}?", "p{:03d}")
    for p in prompts[::3]:
        p["messages"] += [
            {"role": "assistant", "content": "(o)"},
            {"role": "user", "content": "Why?"},
        ]
    run, tok = simulated_run(
        root, prompts, n=2, mean_output_tokens=30, max_tokens=120, flush_records=20
    )
    return str(run), tok


def _ids(out: Path) -> Counter[str]:
    return Counter(
        i for p in sorted(out.glob("*.parquet")) for i in pq.read_table(p).column("id").to_pylist()
    )


def _shards(out: Path) -> dict[str, str]:
    return {k: v for k, v in file_hashes(out).items() if k != "summary.json"}


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(after=st.integers(0, 14))
def test_kill_9_tokenize_then_rerun(run: tuple[str, str], tmp_path: Path, after: int) -> None:
    url, tok = run
    reference = tmp_path / "reference"
    config = TokenizeConfig(run=url, tokenizer=tok, out=str(reference), batch_rows=5)
    if not reference.exists():
        tokenize(config)
    expected = _ids(reference)
    assert len(expected) > 120 and max(expected.values()) == 1
    out = Path(tempfile.mkdtemp(dir=tmp_path)) / "out"
    cli = ["tokenize", url, "--tokenizer", tok, "--out", str(out), "--batch-rows", "5", "-q"]
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, *cli],
        env={**os.environ, "KILL_AFTER": str(after)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    if any(out.glob("*.parquet")):  # a part of the samples: readers refuse it
        with pytest.raises(InputError, match="unfinished tokenize"):
            open_dataset(str(out))
        with pytest.raises(ConfigError, match="unfinished tokenize with other settings"):
            tokenize(TokenizeConfig(run=url, tokenizer=tok, out=str(out), batch_rows=7))
    done = tokenize(TokenizeConfig(run=url, tokenizer=tok, out=str(out), batch_rows=5))
    assert _ids(out) == expected
    assert _shards(out) == _shards(reference)  # summary.json names its own --out
    assert done.counts == tokenize(config).counts
    assert open_dataset(str(out)).kind == "tokenized"
    before = file_hashes(out)
    again = tokenize(TokenizeConfig(run=url, tokenizer=tok, out=str(out), batch_rows=5))
    assert again.counts == done.counts and file_hashes(out) == before


@pytest.mark.parametrize("bad", ["missing", "empty", "not-a-tokenizer"])
def test_a_tokenize_that_fails_before_its_first_shard_leaves_no_claim(
    run: tuple[str, str], tmp_path: Path, bad: str
) -> None:
    """A wrong --tokenizer fails before the output is claimed, so the corrected command into
    the same --out runs (it was refused as 'an unfinished tokenize with other settings')."""
    url, tok = run
    wrong = tmp_path / bad
    if bad != "missing":
        wrong.mkdir()
    if bad == "not-a-tokenizer":
        (wrong / "tokenizer.json").write_text("{not json", encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises((ConfigError, InputError)):
        tokenize(TokenizeConfig(run=url, tokenizer=str(wrong), out=str(out)))
    assert not (out / "tokenize_config.json").exists()
    summary = tokenize(TokenizeConfig(run=url, tokenizer=tok, out=str(out)))
    assert summary.shards > 0
    assert max(_ids(out).values()) == 1
