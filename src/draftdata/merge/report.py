"""The merge summary as terminal tables: the mix before / target / after per domain, the inputs,
and what was dropped. Reads only the ``merge_report.json`` object; computes nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from draftdata import tables
from draftdata.tables import table

MIX_HEADER = ["domain", "before", "before %", "unique", "target", "train", "eval", "after %"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def mix_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per domain (and a total): counts and shares before, target, after."""
    before: dict[str, int] = dict(report["before"])
    avail: dict[str, int] = dict(report.get("available", {}))
    train: dict[str, int] = dict(report["after"]["train"])
    evals: dict[str, int] = dict(report["after"]["eval"])
    target: dict[str, float] = report["target"]
    pooled = set(report.get("pooled_into_other", []))
    domains = sorted(set(before) | set(target) | set(train) | set(evals))
    n_before = sum(before.values())
    n_train, n_eval, n_avail = sum(train.values()), sum(evals.values()), sum(avail.values())
    n_after = n_train + n_eval
    if pooled and "other" in target:
        # the `other` row shows the pooled domains together (they keep their own labels)
        for counts in (before, avail, train, evals):
            counts["other"] = counts.get("other", 0) + sum(counts.get(p, 0) for p in pooled)
    rows = []
    for d in domains:
        after = train.get(d, 0) + evals.get(d, 0)
        t = target.get(d)
        tgt = _pct(t) if t is not None else ("(other)" if d in pooled else "-")
        rows.append(
            [
                d,
                f"{before.get(d, 0):,}",
                _pct(before.get(d, 0) / n_before if n_before else 0.0),
                f"{avail.get(d, 0):,}",
                tgt,
                f"{train.get(d, 0):,}",
                f"{evals.get(d, 0):,}",
                _pct(after / n_after if n_after else 0.0),
            ]
        )
    rows.append(
        [
            "total",
            f"{n_before:,}",
            "",
            f"{n_avail:,}",
            "",
            f"{n_train:,}",
            f"{n_eval:,}",
            "",
        ]
    )
    return rows


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """Print the inputs table, the mix table, the drops and any cannot-reach warning."""
    console = console or tables.console()
    inputs = [
        [i["path"], i["role"], i["kind"], f"{i['rows']:,}", f"{i.get('bad_rows', 0):,}"]
        for i in report["inputs"]
    ]
    console.print(table("inputs", ["input", "role", "kind", "rows", "bad rows"], inputs))
    console.print(table("domain mix (before / target / after)", MIX_HEADER, mix_rows(report)))
    dropped = ", ".join(f"{k} {v:,}" for k, v in report["dropped"].items() if v) or "none"
    console.print(f"dropped: {dropped}")
    for i in report["inputs"]:
        dup = i.get("duplicates", {}).get("duplicate_id", 0)
        if dup and dup * 2 >= max(i["rows"], 1) and i["role"] == "add":
            console.print(
                f"[yellow]note:[/] {dup:,} of {i['rows']:,} rows of {i['path']} share an id with "
                "an earlier input and were dropped; if the ids are unrelated, use --no-dedup-ids"
            )
    if report.get("upsampled"):
        ups = ", ".join(f"{k} +{v:,}" for k, v in report["upsampled"].items())
        console.print(f"repeated rows (--upsample): {ups}")
    if report.get("pooled_into_other"):
        console.print(f"pooled into other: {', '.join(report['pooled_into_other'])}")
    if report.get("limited_by") and report["target"]:
        console.print(
            f"the total is bounded by the supply of: {', '.join(report['limited_by'])} "
            f"(within {_pct(report['settings']['tolerance'])} of each target)"
        )
    if report.get("message"):
        console.print(f"[bold yellow]warning:[/] {report['message']}")
