"""The summary a tokenize run prints: the per-domain table and the plain-text lines.

Shared by ``draftdata tokenize`` and ``tokenize --ray`` (``cli/tokenize.py``,
``cli/ray_options.py``) and the demo, so one run reads the same however it ran. It formats a
``TokenizeSummary``; it computes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from draftdata.support import tables
from draftdata.support.metrics import loss_warning, reasons, share

if TYPE_CHECKING:
    from draftdata.tokenize.config import TokenizeSummary


def summary_lines(summary: TokenizeSummary) -> list[str]:
    """The plain-text lines of the final summary."""
    c = summary.count
    chat = summary.settings.get("input") in ("conversations", "prompts")
    unit = "rows" if chat else "completions"
    lines = [
        f"tokenize: {c('samples')} samples from {c('completions')} {unit} "
        f"({c('path.token_ids')} with server token ids, {c('path.rendered')} rendered) "
        f"in {summary.wall_s:.1f} s -> {summary.out}; {losses(summary)}",
        f"verified {c('verified')} (non-canonical tokenization of the same text "
        f"{c('verified.noncanonical')}, ended other than by the template's end of turn "
        f"{c('verified.other_end')}, checked by decoding where the template cannot render "
        f"the reasoning split back {c('verified.decoded')}, of which answers without "
        f"</think> {c('reasoning.unclosed')}, turns cut by the token limit placed by their ids "
        f"{c('verified.cut') + c('verified.cut_trimmed')}), mismatched {c('mismatched')} "
        "(dropped), "
        f"unverifiable {c('unverifiable')}; split into per-turn samples {c('split_turns')}; "
        f"truncated {c('truncated')}",
    ]
    checked = c("verified") + c("mismatched")
    if checked:
        share = 100.0 * c("verified") / checked
        lines.append(
            f"server token ids: {share:.1f}% token-exact ({c('verified')} of {checked} "
            "verified against the chat template)"
        )
    decided = sum(c(f"thinking.{k}") for k in ("prompt_tokens", "recorded", "stated"))
    unsure = c("dropped.thinking_unknown") + c("dropped.thinking_conflict")
    if decided or unsure:
        lines.append(
            f"thinking mode left to the servers: {decided + unsure} rendered answers, from the "
            f"prompt tokens the server counted {c('thinking.prompt_tokens')}, recorded by "
            f"generate {c('thinking.recorded')}, stated (--server-thinking) "
            f"{c('thinking.stated')}; not rendered on a guess: unknown "
            f"{c('dropped.thinking_unknown')}, conflicting {c('dropped.thinking_conflict')}"
            + (
                " (--server-thinking on|off states the mode)"
                if c("dropped.thinking_unknown")
                else ""
            )
        )
    dropped = summary.dropped
    if dropped:
        lines.append("dropped: " + ", ".join(f"{k} {v}" for k, v in dropped.items()))
    if c("duplicates"):
        lines.append(
            f"not counted: {c('duplicates')} duplicate completions (an (id, sample) an earlier "
            "shard holds too: a copied shard; the first copy is tokenized, as export and stats "
            "count it)"
        )
    lines.extend(f"mismatch: {m}" for m in summary.mismatches)
    return lines


def _lost(summary: TokenizeSummary) -> tuple[int, int, int]:
    """(truncated, dropped, samples there would have been without drops)."""
    dropped = sum(summary.dropped.values())
    return summary.count("truncated"), dropped, summary.count("samples") + dropped


def losses(summary: TokenizeSummary) -> str:
    """What the summary line says was cut or left out: truncated and dropped, with shares."""
    truncated, dropped, total = _lost(summary)
    if not truncated and not dropped:
        return "none truncated or dropped"
    parts = []
    if truncated:
        limit = summary.settings.get("max_length")
        parts.append(f"truncated {truncated:,} ({share(truncated, total)}) at {limit} tokens")
    if dropped:
        parts.append(f"dropped {dropped:,} ({share(dropped, total)}: {reasons(summary.dropped)})")
    return ", ".join(parts)


def warning_line(summary: TokenizeSummary) -> str | None:
    """One warning line when more than 5% of the samples were truncated or dropped."""
    truncated, dropped, total = _lost(summary)
    advice = " and ".join(
        a
        for a, on in (
            ("raise --max-length", truncated),
            ("see the drop reasons in docs/tokenize.md", dropped),
        )
        if on
    )
    parts = []
    if truncated:
        parts.append(f"truncated {truncated:,} at {summary.settings.get('max_length')} tokens")
    if dropped:
        parts.append(f"dropped {reasons(summary.dropped)}")
    detail = ", ".join(parts)
    return loss_warning(truncated + dropped, total, "samples cut or left out", detail, advice)


def print_summary(summary: TokenizeSummary) -> None:
    """Print the per-domain table and the summary lines."""

    table = Table(title="tokenized samples by domain")
    for name in ("domain", "samples", "tokens", "loss tokens", "loss %"):
        table.add_column(name, justify="left" if name == "domain" else "right")
    for domain, d in summary.domains.items():
        share = 100.0 * d.loss_tokens / d.tokens if d.tokens else 0.0
        table.add_row(
            domain or "(none)",
            f"{d.samples:,}",
            f"{d.tokens:,}",
            f"{d.loss_tokens:,}",
            f"{share:.1f}",
        )
    console = tables.console()
    console.print(table)
    for line in summary_lines(summary):
        console.print(line, markup=False, highlight=False)
    warning = warning_line(summary)
    if warning is not None:
        tables.console(stderr=True).print(warning, markup=False, highlight=False)
