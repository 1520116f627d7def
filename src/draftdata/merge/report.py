"""The merge summary as terminal tables: the plan (before anything is written), the mix before /
target / after per domain in rows and in loss tokens, the inputs, and what was dropped. Reads
only the ``merge_report.json`` object (and its ``plan``); computes nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from draftdata import tables
from draftdata.tables import compact, table
from draftdata.tokens import ESTIMATE_ERROR

# what an estimate of loss tokens is, and the way to count them exactly
ESTIMATE_NOTE = (
    f"~ loss tokens estimated from the text: {ESTIMATE_ERROR}; --tokenizer DIR counts them "
    "with the target's tokenizer"
)
# the mix merge aims at is the train split's (eval is a stratified split taken before the plan)
MIX_HEADER = ["domain", "before", "before %", "unique", "target", "train", "eval", "train %"]


def target_unit(report: dict[str, Any]) -> str:
    """What the report's target shares count: ``loss tokens`` or ``rows``."""
    return "loss tokens" if report.get("mix_by") == "loss_tokens" else "rows"


def mix_header(report: dict[str, Any]) -> list[str]:
    """The row table's header, each share labelled with what it counts: the rows' shares are
    of rows, the target of what the mix was planned in (loss tokens by default), so a token
    target beside a row share never reads as a miss."""
    unit = target_unit(report)
    target = "target (of tokens)" if unit == "loss tokens" else "target (of rows)"
    return [
        "domain", "before", "before % (rows)", "unique", target, "train", "eval",
        "train % (rows)",
    ]  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def mix_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per domain (and a total): counts and shares before, target, the train and eval
    rows, and the train split's share (the split the mix is planned for)."""
    before: dict[str, int] = dict(report["before"])
    avail: dict[str, int] = dict(report.get("available", {}))
    train: dict[str, int] = dict(report["after"]["train"])
    evals: dict[str, int] = dict(report["after"]["eval"])
    target: dict[str, float] = report["target"]
    pooled = set(report.get("pooled_into_other", []))
    domains = sorted(set(before) | set(target) | set(train) | set(evals))
    n_before = sum(before.values())
    n_train, n_eval, n_avail = sum(train.values()), sum(evals.values()), sum(avail.values())
    if pooled and "other" in target:
        # the `other` row shows the pooled domains together (they keep their own labels)
        for counts in (before, avail, train, evals):
            counts["other"] = counts.get("other", 0) + sum(counts.get(p, 0) for p in pooled)
    rows = []
    for d in domains:
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
                _pct(train.get(d, 0) / n_train if n_train else 0.0),
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


def plan_rows(plan: dict[str, Any], estimated: bool) -> list[list[str]]:
    """One row per group of the plan (and a total): have, keep, copies, drop, share, target,
    and the share if everything were kept (the closest mix the supply allows)."""
    tokens = plan["unit"] == "loss_tokens"

    def n(x: int) -> str:
        return compact(x, estimated) if tokens else f"{x:,}"

    rows = []
    for g, d in plan["domains"].items():
        rows.append(
            [
                g,
                n(d["have"]),
                n(d["keep"]),
                n(d["copies"]) if d["copies"] else "",
                n(d["drop"]),
                f"{d['rows_out']:,} / {d['rows']:,}",
                _pct(d["share"]),
                _pct(d["target"]),
                _pct(d["all_kept_share"]),
            ]
        )
    rows.append(
        [
            "total",
            n(plan["have"]),
            n(plan["keep"]),
            n(plan["out"] - plan["keep"]) if plan["out"] > plan["keep"] else "",
            n(plan["have"] - plan["keep"]),
            "",
            "",
            "",
            "",
        ]
    )
    return rows


PLAN_HEADER = ["domain", "have", "keep", "copies", "drop", "rows out / rows", "share", "target"]


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """The lines under the plan table: what it keeps, whether it is the best, and the verdict
    against --min-keep with the ways out."""
    unit = "loss tokens" if plan["unit"] == "loss_tokens" else "rows"
    lines = [
        f"the plan keeps {100 * plan['kept_share']:.1f}% of the {unit} the mix can use "
        f"(within {_pct(plan['tolerance'])} of each target)"
    ]
    gap = plan.get("bound", 0) - plan["keep"]
    if plan.get("optimal") is False and gap > 0:
        lines[0] += f"; at most {gap:,} tokens short of the best possible (search cut short)"
    if plan.get("note"):
        lines.append(f"note: {plan['note']}")
    ways = plan.get("ways_out")
    if ways:
        verdict = "merge stops" if plan["stops"] else "--allow-drop: writing it anyway"
        lines.append(f"that is under --min-keep {plan['min_keep']:g}: {verdict}; ways out:")
        for w in ways:
            if w["option"] == "--allow-drop":
                lines.append(f"  {'--allow-drop':<28} write this plan anyway")
            elif w["kept_share"] is None:
                lines.append(
                    f"  (no --upsample or --tolerance up to {w['option'].split()[-1]} keeps enough)"
                )
            else:
                lines.append(f"  {w['option']:<28} keeps {100 * w['kept_share']:.0f}%")
    return lines


def print_plan(plan: dict[str, Any], console: Console | None = None) -> None:
    """Print the plan (what merge will keep and drop) before anything is written."""
    console = console or tables.console()
    estimated = bool(plan.get("estimated", True))
    unit = "loss tokens" if plan["unit"] == "loss_tokens" else "rows"
    if estimated and plan["unit"] == "loss_tokens":
        unit += ", ~ estimated"
    header = [*PLAN_HEADER, "all kept"]
    console.print(table(f"plan ({unit})", header, plan_rows(plan, estimated)))
    for line in plan_lines(plan):
        console.print(line, highlight=False)
    if plan["unit"] == "loss_tokens" and plan.get("method", "estimate") == "estimate":
        console.print(ESTIMATE_NOTE, highlight=False)


def token_rows(report: dict[str, Any]) -> list[list[str]]:
    """The loss-token mix per domain: before, target, and the train split's (the split the mix
    is planned for; eval is a stratified split taken before the plan)."""
    tok = report.get("tokens") or {}
    estimated = tok.get("method") != "exact"
    before: dict[str, int] = dict(tok.get("before") or {})
    after: dict[str, int] = {
        d: int(v) for d, v in ((tok.get("after") or {}).get("train") or {}).items()
    }
    target: dict[str, float] = report["target"]
    n_before, n_after = sum(before.values()), sum(after.values())
    rows = []
    for d in sorted(set(before) | set(after) | set(target)):
        rows.append(
            [
                d,
                compact(before.get(d, 0), estimated),
                _pct(before.get(d, 0) / n_before if n_before else 0.0),
                _pct(target.get(d)),
                compact(after.get(d, 0), estimated),
                _pct(after.get(d, 0) / n_after if n_after else 0.0),
            ]
        )
    rows.append(["total", compact(n_before, estimated), "", "", compact(n_after, estimated), ""])
    return rows


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """Print the inputs table, the mix table, the drops and any cannot-reach warning."""
    console = console or tables.console()
    inputs = [
        [i["path"], i["role"], i["kind"], f"{i['rows']:,}", f"{i.get('bad_rows', 0):,}"]
        for i in report["inputs"]
    ]
    console.print(table("inputs", ["input", "role", "kind", "rows", "bad rows"], inputs))
    title = "domain mix in rows (before / target / train, eval)"
    if target_unit(report) == "loss tokens" and report["target"]:
        title += "; the target is of loss tokens: the next table"
    console.print(table(title, mix_header(report), mix_rows(report)))
    held = (report.get("plan") or {}).get("eval") or {}
    if held.get("rows"):
        each = ", ".join(f"{d} {n:,}" for d, n in held["rows"].items())
        console.print(
            f"eval: {sum(held['rows'].values()):,} rows set aside before the plan, stratified "
            f"over the {held['of_rows']:,} unique rows kept ({each}); the train split is on the mix"
        )
    if report.get("tokens"):
        how = {"exact": "exact", "tokenizer": "~ counted with --tokenizer"}.get(
            report["tokens"].get("method"), "~ estimated from the text"
        )
        head = [
            "domain", "before", "before % (tokens)", mix_header(report)[4], "train",
            "train % (tokens)",
        ]  # fmt: skip
        title = f"loss tokens (before / target / train; {how})"
        console.print(table(title, head, token_rows(report)))
        if report["tokens"].get("method") == "estimate":
            console.print(ESTIMATE_NOTE, highlight=False)
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
