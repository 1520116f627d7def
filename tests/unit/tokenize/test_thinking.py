"""Which thinking mode a served answer is rendered in, when its request left it to the server.

The shape (generated): one or two turns, each written in thinking on or off; the prompt tokens
the server counted for each turn (as a server renders with the tokenizer's own
``apply_chat_template``, the oracle), or none; the mode generate recorded (the true one, the
other one, or none); the mode the user states, or none. tokenize renders the answer in its true
mode, or drops it and says why; it never renders it in a mode no evidence gives:

- counted tokens decide; a recorded mode they contradict, or turns counted in both modes, is a
  conflict (dropped);
- without counts the recorded mode decides, then the stated one; with neither, unknown (dropped).
  (A stated mode is the user's word: a wrong one renders wrong or fails to render.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.records import Completion, Message, Turn, Usage
from draftdata.shared.conversation import TurnPlan
from draftdata.shared.formats import completions_table
from draftdata.sim.tokens import HFTokenizer
from draftdata.tokenize.encode import TokenizeContext, tokenize_table

EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def ctx(demo_tokenizer: Path) -> TokenizeContext:
    return TokenizeContext(str(demo_tokenizer))


@pytest.fixture(scope="module")
def server(demo_tokenizer: Path) -> HFTokenizer:
    return HFTokenizer(str(demo_tokenizer))


def _answer(mode: bool, k: int) -> Turn:
    return Turn(content=f"Answer {k}.", reasoning=f"Think {k}." if mode else None)


def _served(
    server: HFTokenizer, modes: list[bool], counted: bool, recorded: bool | None
) -> Completion:
    """A completion whose turn ``k`` was written with thinking ``modes[k]``, with the prompt
    tokens the server counted (``counted``) and the mode generate recorded."""
    messages = [Message(role="user", content="What is 2+2?")]
    if len(modes) > 1:
        messages += [
            Message(role="assistant", content="(original)"),
            Message(role="user", content="And twice that?"),
        ]
    plan = TurnPlan(messages)
    turns = [_answer(m, k) for k, m in enumerate(modes)]
    out = []
    for k, (mode, turn) in enumerate(zip(modes, turns, strict=True)):
        sent = [_msg(m) for m in plan.context(k, turns)]
        text = server.render_prompt(sent, None, {"enable_thinking": mode})
        tokens = len(server.encode(text)[0]) if counted else 0
        out.append(Turn(**{**_fields(turn), "usage": Usage(prompt_tokens=tokens)}))
    return Completion(id="c", messages=messages, turns=out, server_thinking=recorded)


def _msg(m: Message) -> dict[str, object]:
    return {k: v for k, v in _fields(m).items() if v is not None}


def _fields(s: object) -> dict[str, object]:
    return {f: getattr(s, f) for f in s.__struct_fields__}  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    modes=st.lists(st.booleans(), min_size=1, max_size=2),
    counted=st.booleans(),
    recorded=st.sampled_from(["true", "other", "none"]),
    stated=st.none() | st.booleans(),
)
def test_an_answer_is_rendered_in_its_own_mode_or_dropped_with_the_reason(
    ctx: TokenizeContext,
    server: HFTokenizer,
    modes: list[bool],
    counted: bool,
    recorded: str,
    stated: bool | None,
) -> None:
    true = modes[0] if len(set(modes)) == 1 else None  # None: the turns differ
    rec = {"true": true, "other": None if true is None else not true, "none": None}[recorded]
    if true is None and recorded != "none":
        rec = modes[0]  # a label for turns written in two modes: right for one of them only
    if not counted and recorded == "other":
        return  # a wrong record and nothing to check it by: no evidence tells (documented)
    c = _served(server, modes, counted, rec)
    ctx.server_thinking = stated
    try:
        table, counters = tokenize_table(completions_table([c]), ctx)
    finally:
        ctx.server_thinking = None
    counts = counters.counts
    if counted and (true is None or (rec is not None and rec != true)):
        assert counts["dropped.thinking_conflict"] == 1 and table.num_rows == 0
        return
    if counted:
        assert counts["thinking.prompt_tokens"] == 1
        mode = true
    elif true is None and rec is not None:
        return  # turns in two modes, labelled one: nothing the run holds can tell
    elif rec is not None:
        assert counts["thinking.recorded"] == 1
        mode = rec
    elif stated is not None:  # the user's word; a wrong one may not even render (dropped)
        assert counts["thinking.stated"] == 1
        mode = stated
        if stated != true:
            return
    else:
        assert counts["dropped.thinking_unknown"] == 1 and table.num_rows == 0
        return
    assert mode is not None
    samples = table.to_pylist()
    assert samples, counts
    for row in samples:
        ids, mask = row["input_ids"], row["loss_mask"]
        prompt = ctx.decode(ids[: mask.index(1)])
        loss = ctx.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert prompt.endswith(EMPTY_THINK) == (not mode)
        assert "<think>\n\n</think>" not in loss


def test_a_request_that_chose_its_mode_needs_no_evidence(
    ctx: TokenizeContext, server: HFTokenizer
) -> None:
    """``enable_thinking`` in the request decides: nothing is dropped without evidence."""
    c = _served(server, [False], counted=False, recorded=None)
    chose = Completion(
        **{**_fields(c), "sampling": {"chat_template_kwargs": {"enable_thinking": False}}}
    )
    table, counters = tokenize_table(completions_table([chose]), ctx)
    assert table.num_rows == 1 and not any(k.startswith("thinking") for k in counters.counts)
