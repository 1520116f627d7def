"""Every drop and cut is counted in the command's summary line, with a warning line above 5%.

Generated over the shapes that lose rows: runs whose last turns were cut by the token limit
(export, every format), a run tokenized at random ``--max-length`` with ``--long`` truncate or
drop (tokenize), inputs with duplicates and unreadable rows (merge), sources with malformed
rows (prepare). Each time the figures the line states are checked against the files written,
and the ``warning:`` line must be there exactly when the unintended losses pass 5%.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.cli import main
from draftdata.records import Completion, Message, Turn
from draftdata.store.run import Run

WARN_SHARE = 0.05  # the documented threshold: a warning above 5%
SLOW = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, list[str]]:
    """(the last stdout line, the warning lines on stderr) of a command that succeeds."""
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr()
    out = capsys.readouterr()
    lines = [ln for ln in out.out.splitlines() if ln.strip()]
    return lines[-1], [ln for ln in out.err.splitlines() if ln.startswith("warning:")]


def _warns(lost: int, total: int) -> bool:
    return total > 0 and lost > WARN_SHARE * total


def _number(pattern: str, line: str) -> int:
    found = re.search(pattern, line)
    assert found is not None, (pattern, line)
    return int(found.group(1).replace(",", ""))


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    return ensure_demo_tokenizer(tmp_path_factory.mktemp("tok"))


# -- export -------------------------------------------------------------------------------------


def _completion(i: int, turns: int, cut: bool) -> Completion:
    messages = [Message(role="user", content=f"question {i}.{k}") for k in range(turns)]
    made = [
        Turn(
            content=f"answer {i}.{k} " * 3,
            reasoning=f"think {k}",
            finish_reason="length" if cut and k == turns - 1 else "stop",
        )
        for k in range(turns)
    ]
    return Completion(
        id=f"c{i}", domain="general", messages=messages, turns=made, server_thinking=True
    )


def _write_run(path: Path, shapes: list[tuple[int, bool]]) -> str:
    with Run.open(str(path), settings={}, flush_records=8, flush_seconds=3600) as run:
        for i, (turns, cut) in enumerate(shapes):
            run.add_completion(_completion(i, turns, cut))
            if run.flush_due():
                run.flush()
    return str(path)


_shapes = st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=30)


@SLOW
@given(shapes=_shapes, fmt=st.sampled_from(["specforge", "sharegpt", "openai", "parquet"]))
def test_export_counts_what_it_left_out_or_cut(
    shapes: list[tuple[int, bool]],
    fmt: str,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path_factory.mktemp("export")
    run = _write_run(root / "run", shapes)
    out = root / f"out.{fmt}"
    line, warnings = _run_cli(["export", run, "--format", fmt, "--out", str(out)], capsys)
    cut_turns = sum(cut for _, cut in shapes)
    if fmt == "specforge":
        turns = sum(n for n, _ in shapes)
        assert len(out.read_text().splitlines()) == turns - cut_turns
        assert _number(r"left out ([\d,]+) of", line) == cut_turns
        assert _number(r"of ([\d,]+) turns", line) == turns
        assert bool(warnings) == _warns(cut_turns, turns), (line, warnings)
    else:
        written = (
            pq.read_table(out).num_rows
            if fmt == "parquet"
            else len(out.read_text().split("\n")) - 1
        )
        assert written == len(shapes)
        assert _number(r"([\d,]+) of [\d,]+ rows \(", line) == cut_turns
        assert bool(warnings) == _warns(cut_turns, len(shapes)), (line, warnings)
    assert len(warnings) <= 1


def test_the_token_formats_count_cut_and_dropped_turns(
    tmp_path: Path, demo_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shapes = [(1, False)] * 8 + [(2, True)] * 2
    run = _write_run(tmp_path / "run", shapes)
    out = tmp_path / "sp.jsonl"
    line, warnings = _run_cli(
        ["export", run, "--format", "speculators", "--tokenizer", str(demo_tokenizer), "--out",
         str(out)],
        capsys,
    )  # fmt: skip
    rows = len(out.read_text().splitlines())
    assert _number(r"of ([\d,]+) turns", line) == 12
    assert _number(r"left out ([\d,]+) of", line) == 12 - rows
    assert _number(r"; ([\d,]+) rows end where the token limit cut", line) == 2
    assert len(warnings) == 1 and "2 of 12 turns left out or cut" in warnings[0]


def _ids_completion(i: int, turns: int, cut: bool, bad: bool) -> Completion:
    """A completion whose turns carry token ids: the served ones (``bad``: ids that are not
    the turn's text, which tokenize drops as unverified)."""
    c = _completion(i, turns, cut)
    made = [
        msgspec.structs.replace(
            t,
            prompt_token_ids=[1, 2, 3] if bad else None,
            output_token_ids=[7] * (k + 2) if bad else None,
        )
        for k, t in enumerate(c.turns)
    ]
    return msgspec.structs.replace(c, turns=made)


@SLOW
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 3), st.booleans(), st.booleans()), min_size=1, max_size=12
    ),
    fmt=st.sampled_from(["modelopt", "speculators", "specforge-text", "specforge"]),
)
def test_every_per_turn_format_counts_each_turn_once(
    shapes: list[tuple[int, bool, bool]],
    fmt: str,
    demo_tokenizer: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Cut turns, turns tokenize drops and turns it keeps, in any mix: the line's turns are the
    run's turns, and what it says it left out is exactly the turns without a row (a cut turn
    tokenize also drops is one turn left out, not two)."""
    root = tmp_path_factory.mktemp("perturn")
    with Run.open(str(root / "run"), settings={}, flush_records=8, flush_seconds=3600) as run:
        for i, (turns, cut, bad) in enumerate(shapes):
            run.add_completion(_ids_completion(i, turns, cut, bad))
    out = root / "out.jsonl"
    argv = ["export", str(root / "run"), "--format", fmt, "--out", str(out)]
    if fmt != "specforge":
        argv += ["--tokenizer", str(demo_tokenizer)]
    line, _ = _run_cli(argv, capsys)
    turns = sum(n for n, _, _ in shapes)
    rows = len(out.read_text().splitlines())
    assert _number(r"of ([\d,]+) turns", line) == turns, line
    assert _number(r"left out ([\d,]+) of", line) == turns - rows, line


# -- tokenize -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("long")
    with Run.open(str(root / "run"), settings={}, flush_records=64, flush_seconds=3600) as run:
        for i in range(30):
            words = " ".join(f"word{j}" for j in range(5 + 7 * i))
            run.add_completion(
                Completion(
                    id=f"t{i}",
                    domain=("math", "code")[i % 2],
                    messages=[Message(role="user", content=f"say {i} words")],
                    turns=[Turn(content=words, reasoning="ok")],
                    server_thinking=True,
                )
            )
    return str(root / "run")


@pytest.fixture(scope="module")
def all_samples(
    long_run: str, demo_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory
) -> int:
    from draftdata.tokenize.config import TokenizeConfig
    from draftdata.tokenize.stage import tokenize

    out = tmp_path_factory.mktemp("full") / "tok"
    config = TokenizeConfig(run=long_run, tokenizer=str(demo_tokenizer), out=str(out))
    return tokenize(config).count("samples")


@SLOW
@given(max_length=st.integers(3, 400), long=st.sampled_from(["truncate", "drop"]))
def test_tokenize_counts_what_it_truncated_or_dropped(
    max_length: int,
    long: str,
    long_run: str,
    all_samples: int,
    demo_tokenizer: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path_factory.mktemp("tok") / "out"
    argv = ["tokenize", long_run, "--tokenizer", str(demo_tokenizer), "--out", str(out)]
    argv += ["--max-length", str(max_length), "--long", long]
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None)
    captured = capsys.readouterr()
    line = next(ln for ln in captured.out.splitlines() if ln.startswith("tokenize:"))
    warnings = [ln for ln in captured.err.splitlines() if ln.startswith("warning:")]
    rows = [r for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    truncated = sum(r["truncated"] for r in rows)
    dropped = all_samples - len(rows)
    if truncated:
        assert _number(r"truncated ([\d,]+) \(", line) == truncated
    else:
        assert "truncated" not in line.split(";", 1)[1]
    if dropped:
        assert _number(r"dropped ([\d,]+) \(", line) == dropped
    else:
        assert "dropped" not in line.split(";", 1)[1]
    assert bool(warnings) == _warns(truncated + dropped, all_samples), (line, warnings)
    assert len(warnings) <= 1


# -- merge --------------------------------------------------------------------------------------


@SLOW
@given(
    good=st.integers(5, 40), dups=st.integers(0, 10), bad=st.integers(0, 6), seed=st.integers(0, 9)
)
def test_merge_counts_what_it_dropped(
    good: int,
    dups: int,
    bad: int,
    seed: int,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path_factory.mktemp("merge")
    rows = [
        json.dumps(
            {
                "id": f"r{i}",
                "domain": ("code", "math")[i % 2],
                "conversations": [
                    {"role": "user", "content": f"question {i}"},
                    {"role": "assistant", "content": f"answer {i}"},
                ],
            }
        )
        for i in range(good)
    ]
    lines = rows + rows[:dups] + ["{not json"] * bad
    data = root / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = root / "merged"
    argv = ["merge", "--existing", str(data), "--out", str(out), "--eval-fraction", "0"]
    line, warnings = _run_cli([*argv, "--seed", str(seed)], capsys)
    written = sum(pq.read_table(p).num_rows for p in out.glob("**/*.parquet"))
    read = len(lines)
    assert _number(r"of ([\d,]+) rows read", line) == read
    assert _number(r"dropped ([\d,]+) \(", line) == read - written
    assert bool(warnings) == _warns(bad, read), (line, warnings)


# -- prepare ------------------------------------------------------------------------------------


@SLOW
@given(good=st.integers(3, 40), bad=st.integers(0, 8))
def test_prepare_counts_what_it_rejected(
    good: int,
    bad: int,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path_factory.mktemp("prepare")
    source = root / "chats.jsonl"
    ok = [
        json.dumps({"messages": [{"role": "user", "content": f"Tell me a fact about {i}."}]})
        for i in range(good)
    ]
    source.write_text("\n".join(ok + ["{broken"] * bad) + "\n")
    config = root / "prep.yaml"
    config.write_text(
        "sources:\n  - {name: chats, schema: openai, path: chats.jsonl, domain: general}\n"
        "dedup: {near: false}\n"
    )
    out = root / "prompts"
    line, warnings = _run_cli(["prepare", str(config), "--out", str(out)], capsys)
    rejected = len((out / "rejects.jsonl").read_text().splitlines())
    assert rejected == bad
    assert _number(r"rejected ([\d,]+) \(", line) == bad
    assert bool(warnings) == _warns(bad, good + bad), (line, warnings)
