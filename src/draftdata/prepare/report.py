"""The prepare report: ``prepare_report.json`` (versioned) and a readable ``prepare_report.md``.

The JSON holds, per source, rows read, rejected by reason, duplicates by kind, usable and taken
(per domain), and per domain the existing and new counts with shares before and after and the
target; with expected lengths (``lengths.py``) also each domain's expected tokens (per new row,
existing, new, shares before and after), what the mix counts (``mix_by``) and where the lengths
came from (``lengths``). It carries ``format: draftdata.prepare_report/1`` and no timestamps
or timings, so the same inputs and seed give the same bytes. ``plan_rows`` renders the plan for
``--plan-only`` and the CLI summary. This module only formats; it computes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from draftdata.shared.mix import Plan, off_target


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _tok(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def take_note(plan: Plan) -> str | None:
    """One line when sources' fixed ``take:`` hold the mix off its target (more than a point
    on some domain): how many prompts they fix and the shares that result, in the plan's unit;
    None when the mix acts or there is none."""
    missed = off_target(plan)
    if not plan.fixed or not missed:
        return None
    unit = "expected loss tokens" if plan.mix_by == "tokens" else "rows"
    shares = ", ".join(
        f"{r.domain} {_pct(r.tokens_after if plan.mix_by == 'tokens' else r.after)} "
        f"(target {_pct(r.target)})"
        for r in plan.domains
        if r.target is not None
    )
    return (
        f"mix: the sources' fixed `take:` decide {plan.fixed:,} of the {plan.total_new:,} new "
        f"prompts and hold the mix off its target; the shares of {unit} are {shares}; give "
        "`max_take:` instead of `take:` (and a `budget:`) to let the mix plan them"
    )


def plan_rows(plan: Plan) -> list[list[str]]:
    """Table rows: domain, existing, before, new, available, after, target; with the expected
    tokens known (``plan_header``), also tokens per new row, existing and new tokens, and the
    token shares before and after."""
    tokens = has_tokens(plan)
    rows = []
    for d in plan.domains:
        row = [
            d.domain,
            f"{d.existing:,}",
            _pct(d.before),
            f"{d.new:,}",
            f"{d.available:,}",
            _pct(d.after),
            _pct(d.target),
        ]
        if tokens:
            row += [
                _tok(d.tokens_per_row),
                _tok(d.existing_tokens),
                _tok(d.new_tokens),
                _pct(d.tokens_before),
                _pct(d.tokens_after),
            ]
        rows.append(row)
    existing = sum(d.existing for d in plan.domains)
    avail = sum(d.available for d in plan.domains)
    total = ["total", f"{existing:,}", "", f"{plan.total_new:,}", f"{avail:,}", "", ""]
    if tokens:
        ex = sum(d.existing_tokens or 0.0 for d in plan.domains)
        new = sum(d.new_tokens or 0.0 for d in plan.domains)
        total += ["", _tok(ex), _tok(new), "", ""]
    rows.append(total)
    return rows


def has_tokens(plan: Plan) -> bool:
    """Whether the plan carries expected tokens (lengths were known)."""
    return any(d.tokens_per_row is not None for d in plan.domains)


PLAN_HEADER = ["domain", "existing", "before", "new", "available", "after", "target"]
TOKEN_HEADER = ["tok/new row", "existing tok", "new tok", "tok before", "tok after"]


def plan_header(plan: Plan) -> list[str]:
    """The plan table's header: in a plan in tokens the target is a token share."""
    head = list(PLAN_HEADER)
    if plan.mix_by == "tokens":
        head[-1] = "target (tokens)"
    return head + (TOKEN_HEADER if has_tokens(plan) else [])


SOURCE_HEADER = ["source", "read", "rejected", "duplicates", "usable", "taken"]


def source_rows(report: dict[str, Any]) -> list[list[str]]:
    """Table rows per source: name, read, rejected, duplicates, usable, taken."""
    return [
        [
            s["name"],
            f"{s['read']:,}",
            f"{sum(s['rejected'].values()):,}",
            f"{sum(s['duplicates'].values()):,}",
            f"{s['usable']:,}",
            f"{s['taken']:,}",
        ]
        for s in report["sources"]
    ]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def to_markdown(report: dict[str, Any], plan: Plan) -> str:
    """The human-readable report: sources, rejects and duplicates, and the domain mix."""
    parts = [
        "# prepare report",
        "",
        f"{report['totals']['taken']:,} prompts written in {len(report['shards'])} shard(s) "
        f"from {report['totals']['read']:,} rows read (seed {report['seed']}, budget "
        f"{report['budget'] if report['budget'] is not None else 'all'}).",
        "",
        "## Sources",
        "",
        _md_table(SOURCE_HEADER, source_rows(report)),
        "",
        "## Rejected rows and duplicates",
        "",
    ]
    detail = []
    for s in report["sources"]:
        for reason, n in s["rejected"].items():
            detail.append([s["name"], "rejected", reason, f"{n:,}"])
        for kind, n in s["duplicates"].items():
            detail.append([s["name"], "duplicate", kind, f"{n:,}"])
    parts.append(
        _md_table(["source", "what", "reason / kind", "rows"], detail) if detail else "None."
    )
    parts += ["", "## Domain mix (existing + new)", ""]
    lengths = report.get("lengths")
    if lengths:
        parts += [
            f"Planned in {plan.mix_by}; expected tokens of a new prompt's answer per domain "
            f"from {lengths['source']}.",
            "",
            *[f"- {n}" for n in lengths.get("notes") or []],
            *([""] if lengths.get("notes") else []),
        ]
    parts += [_md_table(plan_header(plan), plan_rows(plan)), ""]
    if report.get("mix_note"):
        parts += [f"Note: {report['mix_note']}.", ""]
    if report["shortfall"]:
        parts += [
            f"The sources could not fill the budget: {report['shortfall']:,} prompts short.",
            "",
        ]
    return "\n".join(parts)


def encode_report(report: dict[str, Any]) -> bytes:
    """Stable JSON bytes of the report (sorted keys, two-space indent, trailing newline)."""
    return (json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
