"""Merges whose ``merge_report.json``, dataset card, plan and refusal were recorded from main's
merge stage (before the report became a typed record, issue 32) into ``data/``.

Each case builds its inputs under a folder and returns the config; ``outcome`` runs it and
returns the files to compare, with the folder written as ``<tmp>``. Rewrite the recordings with
``DRAFTDATA_WRITE_MERGE_FIXTURES=1 pytest tests/unit/merge/test_report_record.py`` (a change
of the report's bytes is deliberate).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.unit.merge.helpers import chat_rows, run_dir, token_samples, write_jsonl

from draftdata.errors import ConfigError
from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge

DATA = Path(__file__).parent / "data"
MIX = {"code": 0.35, "math": 0.2, "general": 0.3, "tool": 0.1, "agent": 0.05}


def _skewed(root: Path) -> tuple[str, str]:
    existing = token_samples(
        root / "existing", {"code": 385, "math": 30, "general": 85}, prefix="e"
    )
    added = token_samples(
        root / "added",
        {"code": 20, "math": 70, "general": 60, "tool": 35, "agent": 15},
        prefix="a",
        seed=1,
        shards=3,
        content_from=100_000,
    )
    return str(existing), str(added)


def tokens_mix(root: Path) -> MergeConfig:
    existing, added = _skewed(root)
    return MergeConfig(
        existing=[existing], add=[added], mix=MIX, out=str(root / "out"), eval_fraction=0.05,
        shard_rows=70, allow_drop=True,
    )  # fmt: skip


def rows_upsample(root: Path) -> MergeConfig:
    existing, added = _skewed(root)
    dup = token_samples(root / "dup", {"code": 10, "math": 40}, prefix="e", content_from=100_000)
    return MergeConfig(
        existing=[existing], add=[added, str(dup)], mix={"code": 0.3, "math": 0.4, "tool": 0.3},
        out=str(root / "out"), mix_by="rows", upsample=True, max_repeat=3, tolerance=0.01,
        eval_fraction=0.1, seed=7, allow_drop=True,
    )  # fmt: skip


def no_mix(root: Path) -> MergeConfig:
    existing, added = _skewed(root)
    return MergeConfig(
        existing=[existing],
        add=[added],
        out=str(root / "out"),
        eval_fraction=0,
        format="speculators",
    )


def chat_other(root: Path) -> MergeConfig:
    a = write_jsonl(root / "a.jsonl", chat_rows({"code": 30, "math": 12}, prefix="a"))
    b = write_jsonl(
        root / "b.jsonl", chat_rows({"general": 25, "math": 8}, prefix="b", style="sharegpt")
    )
    run = run_dir(str(root / "run"), {"code": 6, "general": 4}, prefix="r", model="target-1")
    return MergeConfig(
        existing=[str(a)], add=[str(b), run], mix={"code": 0.5, "other": 0.5},
        out=str(root / "out"), format="sharegpt", eval_fraction=0.1, allow_models=True,
    )  # fmt: skip


def eagle_left_out(root: Path) -> MergeConfig:
    rows = chat_rows({"code": 10, "general": 6}, prefix="c")
    rows[0]["conversations"].insert(0, {"role": "assistant", "content": "I speak first here."})
    rows[3]["conversations"].append({"role": "tool", "content": "out", "tool_call_id": "x"})
    bad = "not json at all\n"
    path = write_jsonl(root / "c.jsonl", rows)
    path.write_text(path.read_text() + bad)
    return MergeConfig(existing=[str(path)], out=str(root / "out"), format="eagle", eval_fraction=0)


def plan_only(root: Path) -> MergeConfig:
    existing, added = _skewed(root)
    return MergeConfig(
        existing=[existing], add=[added], mix=MIX, out=str(root / "out"), plan_only=True
    )


def stops(root: Path) -> MergeConfig:
    existing, added = _skewed(root)
    return MergeConfig(
        existing=[existing], add=[added], mix=MIX, out=str(root / "out"), min_keep=0.9
    )


CASES: dict[str, Callable[[Path], MergeConfig]] = {
    f.__name__: f
    for f in (tokens_mix, rows_upsample, no_mix, chat_other, eagle_left_out, plan_only, stops)
}


def _plain(value: Any) -> Any:
    """The plan as the JSON it is written as (a typed record or a dict alike)."""
    import msgspec

    return json.loads(msgspec.json.encode(value))


def outcome(name: str, root: Path) -> dict[str, str]:
    """What the merge of case ``name`` under ``root`` showed and wrote, by file name, with
    ``root`` written as ``<tmp>``."""
    config = CASES[name](root)
    plans: list[Any] = []
    files: dict[str, str] = {}
    try:
        summary = merge(config, on_plan=plans.append)
    except ConfigError as exc:
        files["refusal.txt"] = str(exc) + "\n"
    else:
        files["summary.json"] = json.dumps(_plain(summary.report), indent=2) + "\n"
        out = Path(config.out)
        for key in ("merge_report.json", "README.md"):
            if (out / key).exists():
                files[key] = (out / key).read_text(encoding="utf-8")
    [plan] = plans
    files["plan.json"] = json.dumps(_plain(plan), indent=2) + "\n"
    return {k: v.replace(str(root), "<tmp>") for k, v in files.items()}


def recorded(name: str) -> dict[str, str]:
    """The recorded files of case ``name``."""
    return {
        p.name.split(".", 1)[1]: p.read_text(encoding="utf-8")
        for p in sorted(DATA.glob(f"{name}.*"))
    }


def record(name: str, files: dict[str, str]) -> None:
    """Write ``files`` as the recording of case ``name``."""
    for old in DATA.glob(f"{name}.*"):
        old.unlink()
    for key, text in files.items():
        (DATA / f"{name}.{key}").write_text(text, encoding="utf-8")
