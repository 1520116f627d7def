"""A merge output's report, ``merge_report.json``, as one typed record (``MergeReport``).

``draftdata merge`` writes it last (the output is complete when it exists) and readers (``stats``,
``report``, the merge summary tables) read it back. The record's fields are the file's keys in
their declared order, written and read through ``formats.MERGE_REPORT`` (indented by two, ASCII),
so the file reads byte for byte as it always has (``format: draftdata.merge-report``, version
1). A key that appears only sometimes (a token plan's ``optimal`` and ``bound``, the ``ways_out``
of a plan that keeps too little, ``jsonl_left_out``) is a field defaulting to None, left out of
the file when None.

Per-domain figures stay mappings (domain -> count or share): their keys are data. This module
holds the record and reads it; the merge stage (``merge/stage.py``) fills it in.

Readers that only show a report (``report``, ``stats``) read any merge's through
``read_any_report``: an older merge's file lacks keys later merges write (``models``,
``tokens``, ``plan``'s later keys, ...), or a key in another shape; each such field reads as its
blank (0, "", an empty mapping or list, None; a nested record's fields alike), so what the file
does hold is shown and nothing of it stops the page. ``read_report`` (merge itself: its resume
and summary tables) stays strict.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import msgspec

from draftdata.errors import InputError
from draftdata.shared.formats import MERGE_REPORT

REPORT_VERSION = 1


class PlanDomain(msgspec.Struct, kw_only=True, frozen=True):
    """One group of the plan, in the plan's unit (loss tokens or rows): what the inputs have,
    what is kept (distinct), its copies, what is dropped, its share of the output and target,
    its share were everything kept, and its rows in and out."""

    have: int
    keep: int
    copies: int
    drop: int
    share: float
    target: float | None  # None: the mix aims at nothing (no --mix)
    all_kept_share: float
    rows: int
    rows_out: int


class WayOut(msgspec.Struct, kw_only=True, frozen=True):
    """An option that keeps at least ``--min-keep``, and the share it keeps (None: the search
    went this far and found nothing but ``--allow-drop``)."""

    option: str
    kept_share: float | None


class EvalPlan(msgspec.Struct, kw_only=True, frozen=True):
    """The eval split, set aside before the plan: its rows per group, and the unique rows per
    group (kept by a plan on every row) it is stratified over."""

    rows: dict[str, int]
    kept: dict[str, int]
    of_rows: int


class MergePlan(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The plan shown before anything is written, and kept in the report."""

    unit: str  # loss_tokens or rows
    domains: dict[str, PlanDomain]
    have: int
    keep: int
    out: int
    kept_share: float
    min_keep: float
    tolerance: float
    upsample: bool
    stops: bool  # keeps less than min_keep, and --allow-drop is off: nothing is written
    note: str | None
    optimal: bool | None = None  # a token plan's: the search ran to its end
    bound: int | None = None  # a token plan's relaxation bound on the kept distinct tokens
    ways_out: list[WayOut] | None = None  # only when the plan keeps less than min_keep
    eval: EvalPlan
    estimated: bool  # loss tokens counted from text, not tokenized samples
    method: str  # exact, tokenizer or estimate


class Splits(msgspec.Struct, kw_only=True, frozen=True):
    """Per domain, the train and the eval split's counts."""

    train: dict[str, int]
    eval: dict[str, int]


class SplitRows(msgspec.Struct, kw_only=True, frozen=True):
    train: int
    eval: int


class InputReport(msgspec.Struct, kw_only=True, frozen=True):
    """One input: where, which role and kind, its rows (by domain), bad rows, duplicates by
    reason, and the target models that answered it (None: not known)."""

    path: str
    role: str
    kind: str
    rows: int
    by_domain: dict[str, int]
    bad_rows: int
    duplicates: dict[str, int]
    models: list[str] | None


class TokenCounts(msgspec.Struct, kw_only=True, frozen=True):
    """Loss tokens per domain before, available (after dedup) and after, and how they were
    counted (exact, tokenizer or estimate)."""

    method: str
    before: dict[str, int]
    available: dict[str, int]
    after: Splits


class MergeSettings(msgspec.Struct, kw_only=True, frozen=True):
    tolerance: float
    eval_fraction: float
    upsample: bool
    max_repeat: int
    dedup_ids: bool
    format: str
    mix_by: str
    min_keep: float
    allow_drop: bool
    tokenizer: str | None
    allow_models: bool


class MergeReport(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """``merge_report.json``. Agreed keys: format, version, target, before, after, inputs,
    dropped, seed; the rest is detail: ``mix_by`` (the unit the mix was planned in, that of
    ``achieved``), ``plan`` (what the plan showed), ``tokens``. No clocks or output paths, so
    two merges of the same inputs and seed write the same bytes."""

    format: str  # MERGE_REPORT.format
    version: int  # REPORT_VERSION
    target: dict[str, float]
    before: dict[str, int]
    after: Splits
    inputs: list[InputReport]
    models: list[str]
    dropped: dict[str, int]  # reason -> rows, in merge's order of reasons
    seed: int
    data: str  # tokenized or conversations
    rows: SplitRows
    available: dict[str, int]
    achieved: dict[str, float]
    aimed: dict[str, float]
    reachable: bool
    missing: list[str]
    limited_by: list[str]
    message: str | None
    mix_by: str
    plan: MergePlan
    tokens: TokenCounts
    pooled_into_other: list[str]
    upsampled: dict[str, int]
    copy_ids: str  # how a copy's id is made: never an input row's id
    settings: MergeSettings
    bad_row_examples: list[str]
    files: dict[str, list[str]]  # train, eval and a trainer format's JSONL -> keys
    jsonl_left_out: dict[str, dict[str, int]] | None = None  # format -> reason -> rows


def dump_report(report: MergeReport) -> bytes:
    """The bytes of ``merge_report.json``."""
    return MERGE_REPORT.dump(report)


def read_report(raw: bytes, where: str) -> MergeReport:
    """``merge_report.json`` read from ``raw`` (at ``where``): InputError or FormatVersionError
    (one line) when it is not one."""
    return MERGE_REPORT.read(raw, where, MergeReport)


def read_any_report(raw: bytes, where: str) -> MergeReport:
    """Any merge's ``merge_report.json`` read from ``raw`` (at ``where``), older ones too: a
    field the file lacks, or holds in a shape that does not read as the field's type, is the
    field's blank (module docstring); a list or mapping of records keeps the elements that are
    objects. InputError or
    FormatVersionError (one line) only when it is no merge report (not a JSON object, another
    ``format``)."""
    doc = MERGE_REPORT.load(raw, where)
    try:
        report: MergeReport = _lenient(doc, MergeReport)
    except (msgspec.ValidationError, TypeError) as exc:  # pragma: no cover - blanks always read
        raise InputError(f"{where}: {exc}") from exc
    return report


def _lenient(value: Any, kind: Any) -> Any:
    """``value`` as ``kind`` (a type of this module's records), or ``kind``'s blank where it
    does not read as one; a record field by field, a list element by element."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        src = value if isinstance(value, dict) else {}
        fields = {}
        for f in msgspec.structs.fields(kind):
            if f.encode_name in src:
                fields[f.name] = _lenient(src[f.encode_name], f.type)
            elif f.default is not msgspec.NODEFAULT:
                fields[f.name] = f.default
            else:
                fields[f.name] = _blank(f.type)
        return kind(**fields)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list and _is_record(args[0]):
        items = value if isinstance(value, list) else []
        return [_lenient(item, args[0]) for item in items if isinstance(item, dict)]
    if origin is dict and _is_record(args[1]):
        pairs = value if isinstance(value, dict) else {}
        return {k: _lenient(v, args[1]) for k, v in pairs.items() if isinstance(v, dict)}
    record = [a for a in args if _is_record(a)]
    if origin in (typing.Union, types.UnionType) and record and value is not None:
        return _lenient(value, record[0]) if isinstance(value, dict) else None  # Record | None
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError:
        return _blank(kind)


def _is_record(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def _blank(kind: Any) -> Any:
    """What a field of type ``kind`` reads as when the file does not hold it."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(kind):
        return None
    if _is_record(kind):
        return _lenient({}, kind)
    return {dict: {}, list: [], str: "", int: 0, float: 0.0, bool: False}[origin or kind]
