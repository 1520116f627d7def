"""The merge summary as terminal tables: the plan (before anything is written), the mix before /
target / after per domain in rows and in loss tokens, the inputs, and what was dropped. Reads
only the ``merge_report.json`` record (``store/merge_report.py``) and its plan; computes nothing.
"""

from __future__ import annotations

from rich.console import Console

from draftdata.shared.tokens import ESTIMATE_ERROR
from draftdata.store.merge_report import MergePlan, MergeReport
from draftdata.support import tables
from draftdata.support.tables import compact, table

# what an estimate of loss tokens is, and the way to count them exactly
ESTIMATE_NOTE = (
    f"~ loss tokens estimated from the text: {ESTIMATE_ERROR}; --tokenizer DIR counts them "
    "with the target's tokenizer"
)
# the mix merge aims at is the train split's (eval is a stratified split taken before the plan)
MIX_HEADER = ["domain", "before", "before %", "unique", "target", "train", "eval", "train %"]


def target_unit(report: MergeReport) -> str:
    """What the report's target shares count: ``loss tokens`` or ``rows``."""
    return "loss tokens" if report.mix_by == "loss_tokens" else "rows"


def mix_header(report: MergeReport) -> list[str]:
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


def mix_rows(report: MergeReport) -> list[list[str]]:
    """One row per domain (and a total): counts and shares before, target, the train and eval
    rows, and the train split's share (the split the mix is planned for)."""
    before = dict(report.before)
    avail = dict(report.available)
    train = dict(report.after.train)
    evals = dict(report.after.eval)
    target = report.target
    pooled = set(report.pooled_into_other)
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


def plan_rows(plan: MergePlan, estimated: bool) -> list[list[str]]:
    """One row per group of the plan (and a total): have, keep, copies, drop, share, target,
    and the share if everything were kept (the closest mix the supply allows)."""
    tokens = plan.unit == "loss_tokens"

    def n(x: int) -> str:
        return compact(x, estimated) if tokens else f"{x:,}"

    rows = []
    for g, d in plan.domains.items():
        rows.append(
            [
                g,
                n(d.have),
                n(d.keep),
                n(d.copies) if d.copies else "",
                n(d.drop),
                f"{d.rows_out:,} / {d.rows:,}",
                _pct(d.share),
                _pct(d.target),
                _pct(d.all_kept_share),
            ]
        )
    rows.append(
        [
            "total",
            n(plan.have),
            n(plan.keep),
            n(plan.out - plan.keep) if plan.out > plan.keep else "",
            n(plan.have - plan.keep),
            "",
            "",
            "",
            "",
        ]
    )
    return rows


PLAN_HEADER = ["domain", "have", "keep", "copies", "drop", "rows out / rows", "share", "target"]


def plan_lines(plan: MergePlan) -> list[str]:
    """The lines under the plan table: what it keeps, whether it is the best, and the verdict
    against --min-keep with the ways out."""
    unit = "loss tokens" if plan.unit == "loss_tokens" else "rows"
    lines = [
        f"the plan keeps {100 * plan.kept_share:.1f}% of the {unit} the mix can use "
        f"(within {_pct(plan.tolerance)} of each target)"
    ]
    gap = (plan.bound or 0) - plan.keep
    if plan.optimal is False and gap > 0:
        lines[0] += f"; at most {gap:,} tokens short of the best possible (search cut short)"
    if plan.note:
        lines.append(f"note: {plan.note}")
    if plan.ways_out:
        verdict = "merge stops" if plan.stops else "--allow-drop: writing it anyway"
        lines.append(f"that is under --min-keep {plan.min_keep:g}: {verdict}; ways out:")
        for w in plan.ways_out:
            if w.option == "--allow-drop":
                lines.append(f"  {'--allow-drop':<28} write this plan anyway")
            elif w.kept_share is None:
                lines.append(
                    f"  (no --upsample or --tolerance up to {w.option.split()[-1]} keeps enough)"
                )
            else:
                lines.append(f"  {w.option:<28} keeps {100 * w.kept_share:.0f}%")
    return lines


def print_plan(plan: MergePlan, console: Console | None = None) -> None:
    """Print the plan (what merge will keep and drop) before anything is written."""
    console = console or tables.console()
    unit = "loss tokens" if plan.unit == "loss_tokens" else "rows"
    if plan.estimated and plan.unit == "loss_tokens":
        unit += ", ~ estimated"
    header = [*PLAN_HEADER, "all kept"]
    console.print(table(f"plan ({unit})", header, plan_rows(plan, plan.estimated)))
    for line in plan_lines(plan):
        console.print(line, highlight=False)
    if plan.unit == "loss_tokens" and plan.method == "estimate":
        console.print(ESTIMATE_NOTE, highlight=False)


def token_rows(report: MergeReport) -> list[list[str]]:
    """The loss-token mix per domain: before, target, and the train split's (the split the mix
    is planned for; eval is a stratified split taken before the plan)."""
    tok = report.tokens
    estimated = tok.method != "exact"
    before = dict(tok.before)
    after = dict(tok.after.train)
    target = report.target
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


def print_summary(report: MergeReport, console: Console | None = None) -> None:
    """Print the inputs table, the mix table, the drops and any cannot-reach warning."""
    console = console or tables.console()
    inputs = [[i.path, i.role, i.kind, f"{i.rows:,}", f"{i.bad_rows:,}"] for i in report.inputs]
    console.print(table("inputs", ["input", "role", "kind", "rows", "bad rows"], inputs))
    title = "domain mix in rows (before / target / train, eval)"
    if target_unit(report) == "loss tokens" and report.target:
        title += "; the target is of loss tokens: the next table"
    console.print(table(title, mix_header(report), mix_rows(report)))
    held = report.plan.eval
    if held.rows:
        each = ", ".join(f"{d} {n:,}" for d, n in held.rows.items())
        console.print(
            f"eval: {sum(held.rows.values()):,} rows set aside before the plan, stratified "
            f"over the {held.of_rows:,} unique rows kept ({each}); the train split is on the mix"
        )
    how = {"exact": "exact", "tokenizer": "~ counted with --tokenizer"}.get(
        report.tokens.method, "~ estimated from the text"
    )
    head = [
        "domain", "before", "before % (tokens)", mix_header(report)[4], "train",
        "train % (tokens)",
    ]  # fmt: skip
    title = f"loss tokens (before / target / train; {how})"
    console.print(table(title, head, token_rows(report)))
    if report.tokens.method == "estimate":
        console.print(ESTIMATE_NOTE, highlight=False)
    dropped = ", ".join(f"{k} {v:,}" for k, v in report.dropped.items() if v) or "none"
    console.print(f"dropped: {dropped}")
    for i in report.inputs:
        dup = i.duplicates.get("duplicate_id", 0)
        if dup and dup * 2 >= max(i.rows, 1) and i.role == "add":
            console.print(
                f"[yellow]note:[/] {dup:,} of {i.rows:,} rows of {i.path} share an id with "
                "an earlier input and were dropped; if the ids are unrelated, use --no-dedup-ids"
            )
    if report.upsampled:
        ups = ", ".join(f"{k} +{v:,}" for k, v in report.upsampled.items())
        console.print(f"repeated rows (--upsample): {ups}")
    if report.pooled_into_other:
        console.print(f"pooled into other: {', '.join(report.pooled_into_other)}")
    if report.limited_by and report.target:
        console.print(
            f"the total is bounded by the supply of: {', '.join(report.limited_by)} "
            f"(within {_pct(report.settings.tolerance)} of each target)"
        )
    if report.message:
        console.print(f"[bold yellow]warning:[/] {report.message}")
