"""The summary a ``hidden-states`` command prints: what is in the set, what this command wrote,
and the verification per captured layer (and fp8's error against bf16)."""

from __future__ import annotations

from draftdata.hidden.bill import human_bytes, human_count
from draftdata.hidden.config import HiddenSummary, LayerCheck
from draftdata.support.tables import console, table


def _layer_rows(layers: list[LayerCheck]) -> list[list[str]]:
    return [
        [lc.layer, f"{lc.max_abs:.4g}", f"{lc.max_rel:.3%}", f"{lc.rms_rel:.3%}"] for lc in layers
    ]


def print_summary(s: HiddenSummary) -> None:
    """Print ``s`` as tables on stdout."""
    out = console()
    done = s.planned - s.remaining
    rows = [
        ["set", s.out],
        ["format / dtype", f"{s.trainer_format} / {s.dtype}"],
        ["layers", s.layers],
        ["engine", f"{s.engine} on {', '.join(s.devices)}"],
        ["samples done", f"{done:,} / {s.planned:,}" + ("" if s.remaining else " (complete)")],
        ["tokens", f"{s.tokens:,}"],
        ["written now", f"{s.written:,} samples, {s.tokens_written:,} tokens"],
        ["bytes written now", human_bytes(s.bytes_written)],
        ["bytes in the set", f"{human_bytes(s.bytes_total)} (bill {human_bytes(s.bill_bytes)})"],
        ["rate", f"{human_count(s.tokens_per_s)} tok/s"],
    ]
    if s.already_there:
        rows.append(["already there (not rewritten)", f"{s.already_there:,}"])
    if s.dropped:
        rows.append(["left out", ", ".join(f"{k} {v:,}" for k, v in sorted(s.dropped.items()))])
    if s.truncated:
        rows.append(["cut to --max-length", f"{s.truncated:,}"])
    if s.compression_ratio is not None:
        rows.append(["gzip: stored / raw", f"{s.compression_ratio:.3f}"])
    out.print(table("hidden-states", ["", ""], rows))
    if s.verification is not None:
        v = s.verification
        title = (
            f"verified: {v.samples} samples one at a time, tolerance {v.tolerance:.1%} rms "
            f"({'passed' if v.passed else 'FAILED'})"
        )
        out.print(table(title, ["layer", "max abs", "max rel", "rms rel"], _layer_rows(v.layers)))
    if s.fp8_error:
        out.print(
            table(
                "fp8 (e4m3, a scale per token) against bf16",
                ["layer", "max abs", "max rel", "rms rel"],
                _layer_rows(s.fp8_error),
            )
        )
