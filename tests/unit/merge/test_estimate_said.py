"""Loss tokens of chat rows and runs: counted with ``--tokenizer`` where given (stats and merge
alike, merge's token mix on the same counts as stats'), else estimated, and every place an
estimate is shown says it is one and how far off it can be.

A generator over the inputs (chat rows, a run) × the commands that show loss tokens (stats,
merge's plan and summary) × with or without the demo's tokenizer (a tokenizer of another
family than Qwen3, the estimate's reference).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.merge.helpers import write_jsonl
from tests.unit.merge.test_token_mix import chat, run_cli

from draftdata.records import Completion, Message, Turn
from draftdata.store.run import Run

SPEC = {"code": (20, 40), "math": (12, 80), "general": (12, 60)}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    return ensure_demo_tokenizer(tmp_path_factory.mktemp("tok"))


def _input(root: Path, kind: str) -> Path:
    rows = chat(SPEC, "x")
    if kind == "chat":
        return write_jsonl(root / "rows.jsonl", rows)
    with Run.open(str(root / "run"), settings={}) as run:
        for r in rows:
            user, answer = r["conversations"]
            run.add_completion(
                Completion(
                    id=r["id"],
                    domain=r["domain"],
                    messages=[Message(role="user", content=user["content"])],
                    turns=[Turn(content=answer["content"], finish_reason="stop")],
                )
            )
    return root / "run"


@pytest.mark.parametrize("kind", ["chat", "run"])
@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_an_estimate_says_so_and_how_far_off_and_merge_counts_as_stats(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    kind: str,
    with_tokenizer: bool,
) -> None:
    src = _input(tmp_path, kind)
    tok = ["--tokenizer", str(tokenizer)] if with_tokenizer else []
    code, stats_out, err = run_cli(["stats", str(src), *tok], capsys)
    assert code == 0, err
    code, stats_json, err = run_cli(["stats", str(src), "--json", *tok], capsys)
    stats = json.loads(stats_json)
    args = ["merge", "--existing", str(src), "--mix", "code=0.4,math=0.3,general=0.3"]
    code, merge_out, err = run_cli(
        [*args, "--allow-drop", "--tolerance", "0.05", "--out", str(tmp_path / "m"), *tok], capsys
    )
    assert code == 0, err
    report = json.loads((tmp_path / "m" / "merge_report.json").read_text())
    if with_tokenizer:
        assert stats["token_method"] == "tokenizer" and report["tokens"]["method"] == "tokenizer"
        assert "counted with the tokenizer" in stats_out
        for out in (stats_out, merge_out):
            assert "another family" not in out
    else:
        assert stats["token_method"] == "estimate" and report["tokens"]["method"] == "estimate"
        for out in (stats_out, merge_out):
            assert "estimated from the text" in out and "another family" in out, out
        assert merge_out.count("another family") == 2  # under the plan and the token table
    # merge's token mix is counted as stats counts: the same loss tokens per domain
    per_domain = {d: v["loss_tokens"] for d, v in stats["domains"].items()}
    assert report["tokens"]["before"] == per_domain
