"""A demo-like output folder (run + merge output + tokenized set) for the report tests."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.stats import builders as b

MERGE_REPORT = {
    "format": "draftdata.merge-report",
    "version": 1,
    "target": {"code": 0.35, "math": 0.35, "general": 0.3},
    "before": {"code": 77, "math": 13, "general": 10},
    "after": {"train": {"code": 3, "math": 3, "general": 2}, "eval": {"code": 1}},
    "inputs": [{"url": "existing"}, {"url": "run"}],
    "dropped": {"duplicate": 4, "over_target": 80},
}

PLOT_IDS = {
    "domain-mix",
    "domain-mix-tokens",
    "output-length",
    "tokens-per-domain",
    "finish-reasons",
    "failures",
    "throughput",
}


def merged_dir(root: Path, report: dict[str, object] | None = MERGE_REPORT) -> Path:
    """A merge output: train and eval parquet shards plus merge_report.json."""
    b.conversations_parquet(
        root / "train" / "part-00000.parquet", {"code": 3, "math": 3, "general": 2}
    )
    b.conversations_parquet(root / "eval" / "part-00000.parquet", {"code": 1})
    if report is not None:
        (root / "merge_report.json").write_text(json.dumps(report))
    return root


def demo_dir(root: Path, with_metrics: bool = True) -> Path:
    """``prompts/``, ``run/``, ``merged/`` and ``tokenized/`` side by side, as the demo writes
    them."""
    b.prompts_dir(root / "prompts")
    b.run_dir(root / "run", with_metrics=with_metrics)
    merged_dir(root / "merged")
    b.tokenized_parquet(root / "tokenized" / "part-00000.parquet")
    return root
