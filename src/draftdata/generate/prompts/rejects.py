"""Prompt lines that are not prompts: the console summary, the run's list, and the wrong-file stop.

``Rejects`` collects the invalid lines of one command. On the console it shows the first
``SHOWN`` (``FILE:LINE: what is wrong``), then says once that the rest are counted, and at the
end one line of counts by reason (``reason_class``: the message without its positions and
values, so 3,200 rows missing the same field are one reason); never one line per row. The rows
go to the run as ``rejects/<writer>.jsonl`` (``{location, reason, line}``), created once when
the command ends.

``check_schema`` looks at the first lines before anything is recorded: when none of the first
``SAMPLE`` lines (or of a shorter file) is a prompt, the file is in another schema (SpecForge or
ShareGPT ``conversations``, Alpaca, ...), and generate stops with one line that names the count,
the most common reason, what the rows look like and the ``prepare`` schema that converts them.
A file whose first lines hold at least one prompt goes on: its bad lines are rejects.

It reads only the first lines of the files; the run's own reading is ``source.py``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftdata.errors import InputError
from draftdata.generate.prompts.source import PromptFile
from draftdata.records import decode_json_line, parse_prompt
from draftdata.store.prompts import iter_prompt_lines

SHOWN = 5  # invalid lines shown one by one on the console; the rest are counted
SAMPLE = 64  # the first lines looked at for a file in another schema
MAX_LINE_CHARS = 4000  # of a rejected line kept in the run's list


def reason_class(reason: str) -> str:
    """``reason`` without what differs from row to row (message positions, quoted values,
    parenthesised details), so rows that fail the same way count as one reason."""
    r = re.sub(r"\[\d+\]", "[]", reason)
    r = re.sub(r"\s*\(.*\)\s*$", "", r)
    r = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", r)
    return r.strip()[:120] or reason[:120]


class Rejects:
    """Invalid prompt lines of one command (see the module docstring)."""

    def __init__(self, log: Callable[[str], None] | None = None) -> None:
        self.rows: list[dict[str, str]] = []
        self.reasons: Counter[str] = Counter()
        self.log = log

    def add(self, message: str, raw: bytes) -> None:
        """Record one bad line (``message`` starts with ``FILE:LINE:``)."""
        location, _, reason = message.partition(": ")
        reason = reason or message
        text = raw.decode("utf-8", errors="replace").rstrip("\n")[:MAX_LINE_CHARS]
        self.rows.append({"location": location, "reason": reason, "line": text})
        self.reasons[reason_class(reason)] += 1
        if self.log is None:
            return
        if len(self.rows) <= SHOWN:
            self.log(f"generate: invalid prompt line {message}")
        elif len(self.rows) == SHOWN + 1:
            self.log(
                "generate: more invalid prompt lines: not shown one by one; counted by reason "
                "at the end"
            )

    def summary(self, key: str | None) -> str:
        """One line: how many lines were skipped, by reason, and where the list is."""
        by = "; ".join(f"{r} {n:,}" for r, n in self.reasons.most_common(5))
        more = len(self.reasons) - 5
        if more > 0:
            by += f"; {more} other reason(s)"
        where = f"; the lines are in {key}" if key else ""
        return f"generate: {len(self.rows):,} invalid prompt lines skipped ({by}){where}"

    def write(self, run: Any) -> str | None:
        """Write the rows into ``run``'s store; return the object's URL (None when empty)."""
        if not self.rows:
            return None
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.rows).encode()
        taken = set(run.store.list("rejects/"))
        key = f"rejects/{run.writer_id}.jsonl"
        n = 1
        while key in taken:  # the same --writer-id again: never replace the earlier list
            n += 1
            key = f"rejects/{run.writer_id}-{n}.jsonl"
        run.store.put_new(key, body)
        return str(run.store.key_url(key))


# (what the rows look like, the prepare schema that reads them), by the keys of a row
def _looks_like(row: Any) -> tuple[str, str] | None:
    if not isinstance(row, dict):
        return None
    turns = row.get("conversations")
    if isinstance(turns, list):
        first = next((t for t in turns if isinstance(t, dict)), {})
        if "from" in first or "value" in first:
            return "ShareGPT rows (`conversations` of from/value)", "sharegpt"
        return "SpecForge rows (`conversations` of role/content)", "openai"
    if "instruction" in row:
        return "Alpaca rows (instruction/input/output)", "alpaca"
    if "question" in row:
        return "question/answer rows", "question_answer"
    if "query" in row:
        return "query/response rows", "query_response"
    return None


def _shown(f: PromptFile) -> str:
    return str(Path(f).resolve()) if isinstance(f, Path) else f


def check_schema(files: list[PromptFile], limit: int | None = None) -> None:
    """InputError (one line) when none of the first ``SAMPLE`` lines in scope is a prompt
    (module docstring); nothing when a prompt is among them. Files that hold nothing are
    refused before (``source.prompt_files``: ``EmptyInputError``)."""
    seen = 0
    reasons: Counter[str] = Counter()
    first: tuple[PromptFile, int, bytes] | None = None
    cap = SAMPLE if limit is None else min(SAMPLE, limit)
    if cap <= 0:
        return
    for f in files:
        for lineno, line in iter_prompt_lines(f):
            if seen >= cap:
                break
            seen += 1
            try:
                parse_prompt(line, f"{f}:{lineno}")
            except InputError as exc:
                reasons[reason_class(str(exc).partition(": ")[2])] += 1
                first = first or (f, lineno, line)
                continue
            return  # a prompt among the first lines: the file is a prompts file
        if seen >= cap:
            break
    if first is None:  # a prompt among them, or none read (an empty input: prompt_files)
        return
    f, lineno, line = first
    reason, _ = reasons.most_common(1)[0]
    head = (
        f"generate: --prompts: none of the first {seen:,} lines is a prompt (`id` + "
        f"`messages`; {reason}, first at {f}:{lineno})"
    )
    try:
        looks = _looks_like(decode_json_line(line))
    except ValueError:
        looks = None
    if looks is None:
        raise InputError(
            f"{head}; convert the file with `draftdata prepare CONFIG` (docs/prepare.md lists "
            "the source schemas) and pass prepare's output folder to --prompts; nothing was "
            "recorded"
        )
    what, schema = looks
    raise InputError(
        f"{head}: they look like {what}; convert them with `draftdata prepare CONFIG --out "
        f"prompts/`, CONFIG holding `sources: [{{name: mine, schema: {schema}, path: "
        f"{_shown(f)}}}]`, then pass --prompts prompts/; nothing was recorded"
    )
