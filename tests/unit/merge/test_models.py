"""merge refuses inputs answered by different target models (issue 31), and records them.

The shape (generated): two inputs answered by the same model or by two, each input a run (chat
rows), tokenize's output of a run (samples; its summary names the run's models, or, written by
an older tokenize, only the run), or merge's output of a run; every output format of the family.
Two models: refused in one line naming both, nothing written; with ``--allow-models`` merged,
and the report names each input's models. One model: merged, the report names it. An input
whose files do not tell (a training set of chat rows) is not known and not refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.merge.helpers import chat_rows, run_dir, write_jsonl

from draftdata.demo.tokenizer import ensure_demo_tokenizer
from draftdata.errors import ConfigError
from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.stage import tokenize

KINDS = ("run", "tokenized", "tokenized_old", "merged")
FORMATS = {"chat": ("parquet", "sharegpt", "specforge"), "samples": ("parquet", "speculators")}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_tokenizer(tmp_path_factory.mktemp("tok"))


def _input(root: Path, kind: str, model: str, prefix: str, tokenizer: Path) -> str:
    run = run_dir(
        str(root / f"run-{prefix}"), {"math": 6, "general": 6}, prefix=prefix, model=model
    )
    if kind == "run":
        return run
    if kind == "merged":
        out = root / f"merged-{prefix}"
        merge(MergeConfig(add=[run], out=str(out), eval_fraction=0.0))
        return str(out)
    out = root / f"tok-{prefix}"
    tokenize(TokenizeConfig(run=run, tokenizer=str(tokenizer), out=str(out)))
    summary = out / "summary.json"
    doc = json.loads(summary.read_text())
    assert doc["models"] == [model]
    if kind == "tokenized_old":  # written before tokenize recorded models: only the run
        del doc["models"]
        summary.write_text(json.dumps(doc))
    return str(out)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("two", [False, True])
def test_two_models_are_refused_unless_allowed(
    tmp_path: Path, tokenizer: Path, kind: str, two: bool
) -> None:
    a = _input(tmp_path, kind, "Qwen3-8B", "a", tokenizer)
    b = _input(tmp_path, kind, "Llama-3-8B" if two else "Qwen3-8B", "b", tokenizer)
    family = "chat" if kind in ("run", "merged") else "samples"
    for fmt in FORMATS[family]:
        out = tmp_path / f"out-{fmt}"
        config = MergeConfig(existing=[a], add=[b], out=str(out), format=fmt, eval_fraction=0.0)
        if two:
            with pytest.raises(ConfigError) as err:
                merge(config)
            said = str(err.value)
            assert "\n" not in said and "'Llama-3-8B'" in said and "'Qwen3-8B'" in said
            assert "predicts neither" in said and "--allow-models" in said
            assert not out.exists() or not any(out.iterdir())  # nothing written
            config = MergeConfig(**{**_fields(config), "allow_models": True})
        report = merge(config).report
        expect = ["Llama-3-8B", "Qwen3-8B"] if two else ["Qwen3-8B"]
        assert report.models == expect
        assert [i.models for i in report.inputs] == [
            ["Qwen3-8B"],
            ["Llama-3-8B" if two else "Qwen3-8B"],
        ]
        assert report.settings.allow_models is two
        saved = json.loads((out / "merge_report.json").read_text())
        assert saved["models"] == expect


def test_an_input_whose_files_do_not_tell_is_not_known(tmp_path: Path) -> None:
    live = write_jsonl(tmp_path / "live.jsonl", chat_rows({"math": 4, "general": 4}, prefix="x"))
    run = run_dir(str(tmp_path / "run"), {"math": 6, "general": 6}, prefix="r", model="Qwen3-8B")
    report = merge(MergeConfig(existing=[str(live)], add=[run], out=str(tmp_path / "o"))).report
    assert [i.models for i in report.inputs] == [None, ["Qwen3-8B"]]
    assert report.models == ["Qwen3-8B"]


def _fields(c: MergeConfig) -> dict[str, object]:
    return {f: getattr(c, f) for f in c.__struct_fields__}


def test_the_cli_says_it_in_one_line_and_allow_models_merges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from draftdata.cli import main

    a = run_dir(str(tmp_path / "a"), {"math": 6, "general": 6}, prefix="a", model="Qwen3-8B")
    b = run_dir(str(tmp_path / "b"), {"math": 6, "general": 6}, prefix="b", model="Llama-3-8B")
    args = ["merge", "--existing", a, "--add", b, "--out", str(tmp_path / "o"), "-q"]
    with pytest.raises(SystemExit) as refused:
        main(args)
    assert refused.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "predicts neither" in err and "--allow-models" in err
    with pytest.raises(SystemExit) as merged:
        main([*args, "--allow-models"])
    assert merged.value.code == 0
    assert json.loads((tmp_path / "o" / "merge_report.json").read_text())["models"] == [
        "Llama-3-8B",
        "Qwen3-8B",
    ]
