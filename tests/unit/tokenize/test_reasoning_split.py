"""Served ids whose reasoning split the template cannot render back are kept, checked by decoding.

With thinking on, the engines' qwen3 reasoning parser puts an answer without ``</think>`` all in
the reasoning (vLLM ``reasoning``, SGLang ``reasoning_content``): every answer cut while
thinking, a model that never closes its think block, and one whose template opens ``<think>``
in the generation prompt (the output then starts inside the block). The template renders such a
turn inside a ``<think>\\n...\\n</think>\\n\\n`` block the target never wrote, so the served ids
and the rendering differ. The served ids are what the target produced: tokenize keeps them when
they decode to the stored text (``verified.decoded``, ``reasoning.unclosed``), and still drops
ids that do not (another tokenizer's ids).

A stand-in server (the demo tokenizer and its Qwen3-style template) answers random multi-turn
conversations: it renders the context draftdata sends (``plan.contexts``), and writes each
answer in one of the shapes below, then splits it as the qwen3 parser does.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.generate.answers.parse import split_think
from draftdata.records import Completion, Message, Turn
from draftdata.shared.formats import completions_table
from draftdata.tokenize.encode import TokenizeContext, tokenize_table
from draftdata.tokenize.plan import contexts, view_from_record

SHAPES = (
    "closed",
    "unclosed",
    "opened_by_template",
    "cut_thinking",
    "lone_byte",
    "think_inside",
    "foreign",
    "doubled_think",
)
WRONG = ("foreign", "doubled_think")  # ids that are not what the stored text says
WORDS = st.sampled_from(["the", "model", "prime", "a", "x1", "city", "é", "日本", "sum", "9"])
TEXT = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)


@pytest.fixture(scope="module")
def ctx(demo_tokenizer: Path) -> TokenizeContext:
    return TokenizeContext(str(demo_tokenizer))


def _enc(ctx: TokenizeContext, text: str) -> list[int]:
    return list(ctx.backend.encode(text, add_special_tokens=False).ids)


def _served(
    ctx: TokenizeContext, users: list[str], answers: list[tuple[str, str, str]]
) -> Completion:
    """The completion a thinking-on server returns for ``users``, each answer (reasoning,
    content, shape) written in its shape and split by the qwen3 parser."""
    eot = ctx.eot_id
    assert eot is not None
    messages = [Message(role="user", content=u) for u in users]
    turns: list[Turn] = []
    for k, (reasoning, content, shape) in enumerate(answers):
        written = {
            "closed": f"<think>\n{reasoning}\n</think>\n\n{content}",
            "unclosed": f"{reasoning} {content}",  # never closes: all of it is reasoning
            "opened_by_template": f"{reasoning}\n</think>\n\n{content}",
            "cut_thinking": f"<think>\n{reasoning}",
            "lone_byte": f"{reasoning} {content}",
            # the model writes <think> inside its reasoning; the parser leaves it in the text
            "think_inside": f"{reasoning}<think>{content}",
            "foreign": f"<think>\n{reasoning}\n</think>\n\n{content}",
            "doubled_think": f"<think>\n{reasoning}\n</think>\n\n{content}",
        }[shape]
        cut = shape == "cut_thinking"
        # the parser: text before </think> (after <think>) is reasoning; without </think>,
        # with thinking on, all of it (vLLM 0.32 and SGLang 0.5.23 on the random model)
        if "</think>" in written:
            r, c = split_think(written)
        else:
            r, c = written.removeprefix("<think>"), ""
        r = r.strip("\n")
        out_ids = _enc(ctx, written) + ([] if cut else [eot])
        if shape == "foreign":  # another tokenizer's ids for the same text
            out_ids = [(i + 7) % (eot - 1) for i in out_ids]
        if shape == "doubled_think":  # one served token changed: a second <think>
            out_ids = [out_ids[0], *out_ids]
        if shape == "lone_byte":  # a byte that is no UTF-8 alone: the text shows nothing
            lone = ctx.backend.token_to_id("Ã")  # byte 0xC3
            assert lone is not None
            out_ids = [lone, *out_ids]  # before a word: it spoils no other character
        turn = Turn(
            content=c.lstrip("\n") or None,
            reasoning=r or None,
            finish_reason="length" if cut else "stop",
        )
        view = view_from_record(
            Completion(id="c", messages=messages[: k + 1], turns=[*turns, turn])
        )
        ctxs = contexts(view, False)
        assert ctxs is not None
        prompt, _ = ctx.template.render(ctxs[k], None, {}, add_generation_prompt=True)
        turns.append(
            msgspec.structs.replace(
                turn, prompt_token_ids=_enc(ctx, prompt), output_token_ids=out_ids
            )
        )
        if cut:
            break
    return Completion(id="c", messages=messages[: len(turns)], turns=turns)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_served_ids_are_kept_whatever_the_reasoning_split(
    ctx: TokenizeContext, data: st.DataObject
) -> None:
    n = data.draw(st.integers(1, 3))
    users = [data.draw(TEXT) for _ in range(n)]
    answers = [
        (data.draw(TEXT), data.draw(TEXT), data.draw(st.sampled_from(SHAPES))) for _ in users
    ]
    completion = _served(ctx, users, answers)
    table, counters = tokenize_table(completions_table([completion]), ctx)
    counts = counters.counts
    samples = table.to_pylist()
    shapes = [a[2] for a in answers[: len(completion.turns)]]
    foreign = any(s in WRONG for s in shapes)
    if not foreign:
        # every served sample is kept; none is called a mismatch
        assert counts.get("mismatched", 0) == 0, (shapes, counters.mismatches)
        assert counts.get("dropped.unverified_ids", 0) == 0
        assert counts.get("verified", 0) == len(samples) + counts.get(
            "dropped.too_few_loss_tokens", 0
        )
    unclosed = [
        t
        for t, s in zip(completion.turns, shapes, strict=True)
        if s in ("unclosed", "cut_thinking", "lone_byte", "think_inside")
        and "</think>" not in (t.reasoning or "")
    ]
    if not foreign and any(s == "unclosed" for s in shapes):
        assert counts.get("verified.decoded", 0) >= 1
        assert counts.get("reasoning.unclosed", 0) >= 1 or not unclosed
    by_turn = {k: t for k, t in enumerate(completion.turns)}
    for s in samples:
        sid = str(s["id"])
        last = int(sid.rsplit("#", 1)[1]) if "#" in sid else len(completion.turns) - 1
        turn = by_turn[last]
        p, o = turn.prompt_token_ids or [], turn.output_token_ids or []
        ids, mask = list(s["input_ids"]), list(s["loss_mask"])
        # the sample is the served prompt ids then the served output ids, loss on the output
        assert ids[: len(p) + len(o)] == p + o
        assert all(mask[len(p) : len(p) + len(o)])
        assert shapes[last] not in WRONG  # ids that do not spell the text are never written
    if foreign:
        assert counts.get("mismatched", 0) >= 1


def test_an_answer_without_think_close_is_kept_not_dropped(ctx: TokenizeContext) -> None:
    """The finding on vLLM with thinking on: all 40 answers without ``</think>`` were dropped
    as "another tokenizer" and tokenize exited 1."""
    completions = [
        _served(ctx, [f"question {i}"], [(f"some words {i}", "", "unclosed")]) for i in range(5)
    ]
    for c in completions:
        assert c.turns[0].content is None and c.turns[0].reasoning
    table, counters = tokenize_table(completions_table(completions), ctx)
    assert table.num_rows == 5
    c = counters.counts
    assert c["verified"] == c["verified.decoded"] == c["reasoning.unclosed"] == 5
    assert c.get("mismatched", 0) == 0
    for row, comp in zip(table.to_pylist(), completions, strict=True):
        t = comp.turns[0]
        assert row["input_ids"][: len(t.prompt_token_ids or [])] == t.prompt_token_ids
        served = np.asarray((t.prompt_token_ids or []) + (t.output_token_ids or []))
        assert np.array_equal(np.asarray(row["input_ids"][: len(served)]), served)
