"""Empty inputs (issue 31): every command that reads an input refuses one that holds no row, in
one line, exit 1, writing nothing; before, they exited 0 with "done: 0 completions", an empty
dataset or an empty page (and generate left ``lease/`` behind).

A generator over the empty kinds (0 bytes, only blank lines, only whitespace, gzip of those, a
parquet of 0 rows in any schema, an empty JSON array) x every command that reads one
(hidden-states too: an empty file is no conversation to tokenize first), each run as the
console script runs it, in a folder whose files are compared before and after."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import write_prompts

from draftdata.cli import main
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration

WHITESPACE = st.text(alphabet=" \t\r\n", max_size=40)
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
# parquet schemas a dataset may have (chat rows, prompts, ShareGPT, tokenized samples)
PARQUET = {
    "messages": pa.schema([("messages", MESSAGES)]),
    "prompts": pa.schema([("id", pa.string()), ("messages", MESSAGES)]),
    "sharegpt": pa.schema(
        [("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())])))]
    ),
    "tokenized": pa.schema(
        [("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))]
    ),
}


@st.composite
def empty_inputs(draw: st.DrawFn, text_only: bool) -> tuple[str, bytes | pa.Schema]:
    """(file name, its bytes or the schema of a 0-row parquet) of one empty kind."""
    kinds = ["zero", "blank", "whitespace"] + ([] if text_only else ["gzip", "parquet", "array"])
    kind = draw(st.sampled_from(kinds))
    if kind == "zero":
        return "empty.jsonl", b""
    if kind == "blank":
        return "empty.jsonl", b"\n" * draw(st.integers(1, 20))
    if kind == "whitespace":
        return "empty.jsonl", draw(WHITESPACE.filter(lambda t: t.strip() == "" and t)).encode()
    if kind == "gzip":
        return "empty.jsonl.gz", gzip.compress(draw(WHITESPACE).encode())
    if kind == "parquet":
        return "empty.parquet", PARQUET[draw(st.sampled_from(sorted(PARQUET)))]
    inner = draw(WHITESPACE)
    return "empty.json", f"{draw(WHITESPACE)}[{inner}]{draw(WHITESPACE)}".encode()


def _write(path: Path, content: bytes | pa.Schema) -> None:
    if isinstance(content, pa.Schema):
        pq.write_table(content.empty_table(), path)
    else:
        path.write_bytes(content)


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(1, SimConfig(time_scale=0, mean_output_tokens=16)) as f:
        yield f


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    return str(ensure_demo_tokenizer(tmp_path_factory.mktemp("tok")))


def _argv(command: str, data: Path, root: Path, url: str, tokenizer: str) -> list[str]:
    """The command line that gives ``data`` to ``command``, every output under ``root``."""
    good = root / "good.jsonl"
    good.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                                      "content": "hello"}]})
        + "\n"
    )  # fmt: skip
    config = root / "prep.yaml"
    schema = "openai"
    config.write_text(
        json.dumps(
            {"out": str(root / "prepared"), "sources": [{"name": "s", "path": str(data),
                                                         "schema": schema}]}
        )
    )  # fmt: skip
    return {
        "stats": ["stats", str(data)],
        "stats-json": ["stats", str(data), "--json"],
        "report": ["report", str(data), "-o", str(root / "page.html")],
        "merge-existing": ["merge", "--existing", str(data), "-o", str(root / "merged")],
        "merge-add": [
            "merge", "--existing", str(good), "--add", str(data), "-o", str(root / "merged")
        ],
        "tokenize": [
            "tokenize", str(data), "--tokenizer", tokenizer, "--out", str(root / "tokenized")
        ],
        "prepare": ["prepare", str(config)],
        "hidden-states": [
            "hidden-states", str(data), "--model", tokenizer, "--out", str(root / "hs"),
            "--format", "speculators",
        ],
        "generate": [
            "generate", "--prompts", str(data), "--endpoint", url, "--out", str(root / "run"),
            "--progress", "off",
        ],
        "acceptance": [
            "acceptance", "--prompts", str(data), "--endpoint", url, "--out", str(root / "acc")
        ],
    }[command]  # fmt: skip


READS_ANY = [
    "stats", "stats-json", "report", "merge-existing", "merge-add", "tokenize", "prepare",
    "hidden-states",
]  # fmt: skip
READS_JSONL = ["generate", "acceptance"]  # prompts JSONL only


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_an_empty_input_is_one_line_exit_1_and_nothing_written(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    fleet: SimFleet,
    tokenizer: str,
    data: st.DataObject,
) -> None:
    command = data.draw(st.sampled_from(READS_ANY + READS_JSONL), label="command")
    name, content = data.draw(empty_inputs(text_only=command in READS_JSONL), label="input")
    root = tmp_path_factory.mktemp("empty")
    path = root / name
    _write(path, content)
    argv = _argv(command, path, root, fleet.urls[0], tokenizer)
    before = _listing(root)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exit_.value.code == 1, (argv, out[-2000:], err[-2000:])
    # one error line, the last (a non-empty input read before it may show its progress line)
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err
    if command == "hidden-states":  # empty, not "conversations: tokenize them first"
        assert "tokenize` first" not in errors[0], errors[0]
    assert _listing(root) == before  # nothing written: no output, no lease/, no empty folder


def test_a_run_without_completions_is_refused_where_it_gives_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer: str
) -> None:
    """A run whose every prompt failed (too long for the context) has nothing to export,
    tokenize or merge: one line, exit 1, nothing written (export wrote an empty file and
    exited 0); stats still shows it, failures and all."""
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 4)
    sim = SimConfig(time_scale=0, faults=FaultConfig(context_400=1.0))
    with SimFleet(1, sim) as f:
        config = GenerateConfig(
            prompts=str(prompts), endpoints=f.urls, out=str(tmp_path / "run"), progress="off"
        )
        generate(config, handle_signals=False, log=lambda _l: None)
    run = str(tmp_path / "run")
    before = _listing(tmp_path)
    for argv in (
        *(["export", run, "--format", fmt, "-o", str(tmp_path / fmt)] for fmt in ("specforge",
                                                                                "sharegpt")),
        ["tokenize", run, "--tokenizer", tokenizer, "--out", str(tmp_path / "tokenized")],
        ["merge", "--add", run, "-o", str(tmp_path / "merged")],
    ):  # fmt: skip
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 1 and err[-1].startswith("error: "), (argv, err)
        assert _listing(tmp_path) == before, argv
    with pytest.raises(SystemExit) as exit_:
        main(["stats", run])
    assert exit_.value.code in (0, None)
    assert "4 failures" in capsys.readouterr().out
