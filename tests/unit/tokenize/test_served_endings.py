"""Every token under loss in a sample built from served ids is a served output token.

A stand-in server (the demo tokenizer and a template) answers random conversations turn by turn
and returns ids the way real engines do: the rendered prompt, and output ids that end with the
template's end-of-turn token, with the target's other end token (``<|endoftext|>``), with the
tokens of a user stop string (the text cut before it, the ids kept, as vLLM does), without an
end token (a server that leaves it out), or cut by the token limit. The next turn's prompt is
rendered from the text history, as a server does. Whatever the endings, no token the target did
not write carries loss, and the template's text after the served output never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.records import Completion, Message, Turn
from draftdata.shared.formats import completions_table
from draftdata.tokenize.encode import TokenizeContext, tokenize_table
from draftdata.tokenize.plan import CompletionView, plan_token_ids

# A plain ChatML template (no history rewrite, no think blocks): turns chain across samples.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ENDINGS = ("eot", "endoftext", "stop_string", "no_end_token", "length")
STOP = " zq"
WORDS = st.sampled_from(["the", "model", "prime", "a", "x1", "city", "é", "日本", "\n", "sum"])
TEXT = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)


@pytest.fixture(scope="module", params=["qwen3_style", "chatml"])
def ctx(request: pytest.FixtureRequest, demo_tokenizer: Path) -> TokenizeContext:
    source = CHATML if request.param == "chatml" else None
    return TokenizeContext(str(demo_tokenizer), chat_template=source)


@dataclass
class Served:
    completion: Completion
    turns: list[tuple[list[int], list[int]]]  # (prompt ids, output ids) as served


def _enc(ctx: TokenizeContext, text: str) -> list[int]:
    return list(ctx.backend.encode(text, add_special_tokens=False).ids)


def _serve(
    ctx: TokenizeContext, users: list[str], answers: list[tuple[str, str | None, str]], cut: int
) -> Served:
    """Answer each user message in turn; ``answers``: (content, reasoning, ending)."""
    eot = ctx.eot_id
    assert eot is not None
    endoftext = ctx.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    history: list[dict[str, str | None]] = []
    messages: list[Message] = []
    turns: list[Turn] = []
    served: list[tuple[list[int], list[int]]] = []
    for user, (content, reasoning, ending) in zip(users, answers, strict=True):
        history.append({"role": "user", "content": user})
        messages.append(Message(role="user", content=user))
        prompt, _ = ctx.template.render(history, None, {}, add_generation_prompt=True)
        reasoning = reasoning if ctx.template.has_generation_markers else None
        said = content + STOP + " more" if ending == "stop_string" else content
        full, _ = ctx.template.render(
            [*history, {"role": "assistant", "content": said, "reasoning_content": reasoning}],
            None,
            {},
            add_generation_prompt=False,
        )
        body = full[len(prompt) : full.index(ctx.template.eot, len(prompt))]
        p_ids = _enc(ctx, prompt)
        finish = "stop"
        if ending == "eot":
            o_ids = [*_enc(ctx, body), eot]
        elif ending == "endoftext":
            o_ids = [*_enc(ctx, body), endoftext]
        elif ending == "stop_string":
            at = body.index(STOP)
            o_ids = _enc(ctx, body[: at + len(STOP)])  # the ids keep the stop string
        elif ending == "no_end_token":
            o_ids = _enc(ctx, body)
        else:
            o_ids = _enc(ctx, body)[: max(1, cut)]
            finish = "length"
        served.append((p_ids, o_ids))
        turns.append(
            Turn(
                content=content,
                reasoning=reasoning,
                finish_reason=finish,
                prompt_token_ids=p_ids,
                output_token_ids=o_ids,
            )
        )
        if finish == "length":
            break  # a cut turn ends the conversation
        history.append({"role": "assistant", "content": content, "reasoning_content": reasoning})
    completion = Completion(id="c", messages=messages[: len(turns)], turns=turns)
    return Served(completion, served)


def _check_loss_is_served(ctx: TokenizeContext, sample: dict[str, object], s: Served) -> None:
    ids = list(sample["input_ids"])  # type: ignore[call-overload]
    mask = list(sample["loss_mask"])  # type: ignore[call-overload]
    sid = str(sample["id"])
    last = int(sid.rsplit("#", 1)[1]) if "#" in sid else len(s.turns) - 1
    p, o = s.turns[last]
    assert ids[: len(p) + len(o)] == p + o  # the served ids, as served
    # Every loss position holds a served output token of some turn, at its own position.
    owner = {}
    for k in range(last + 1):
        pk, ok = s.turns[k]
        for j, tok in enumerate(ok):
            pos = len(pk) + j
            if pos < len(ids) and ids[pos] == tok and (k == last or pos < len(p)):
                owner[pos] = k
    stray = [i for i, m in enumerate(mask) if m and i not in owner]
    assert not stray, f"{sid}: loss on non-served tokens {ctx.decode([ids[i] for i in stray])!r}"
    # The last turn's output carries loss in full; the template's text after it never does.
    assert all(mask[len(p) : len(p) + len(o)])
    assert not any(mask[len(p) + len(o) :])
    tail = ids[len(p) + len(o) :]
    if tail:
        assert o[-1] == ctx.eot_id and tail == ctx.suffix_ids.tolist()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_loss_only_on_served_output_tokens(ctx: TokenizeContext, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 3), label="turns")
    users = data.draw(st.lists(TEXT, min_size=k, max_size=k), label="users")
    answers = data.draw(
        st.lists(
            st.tuples(TEXT, st.none() | TEXT, st.sampled_from(ENDINGS)), min_size=k, max_size=k
        ),
        label="answers",
    )
    cut = data.draw(st.integers(1, 12), label="cut")
    served = _serve(ctx, users, answers, cut)
    samples, counters = tokenize_table(completions_table([served.completion]), ctx)
    for sample in samples.to_pylist():
        _check_loss_is_served(ctx, sample, served)
    # Ids from the right tokenizer are never dropped as unverified, whatever the ending (a cut
    # turn's text is the server's decode of the cut, which this stand-in does not split).
    if any(t.finish_reason == "length" for t in served.completion.turns):
        return
    assert counters.counts.get("mismatched", 0) == 0, counters.mismatches
    assert counters.counts.get("dropped.unverified_ids", 0) == 0


def test_other_end_token_chains_with_the_end_of_turn_as_context() -> None:
    # Turn 0 ended with <|endoftext|> (11); the next context shows it closed by <|im_end|> (9).
    p0, o0 = np.array([1, 2], np.int32), np.array([4, 5, 11], np.int32)
    p1, o1 = np.array([1, 2, 4, 5, 9, 6], np.int32), np.array([7, 11], np.int32)
    view = CompletionView("c", 0, "", "", [], None, [], token_ids=[(p0, o0), (p1, o1)])
    plan = plan_token_ids(view, eot_id=9, suffix=np.array([10], np.int32), end_ids=frozenset({11}))
    (only,) = plan.tokens
    assert only.ids.tolist() == [1, 2, 4, 5, 9, 6, 7, 11]  # nothing appended after <|endoftext|>
    assert only.mask.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]  # the shown <|im_end|> is context
    # Without the end-token rule the turns do not chain: each is its own sample.
    plan = plan_token_ids(view, eot_id=9, suffix=np.array([10], np.int32))
    assert [t.id for t in plan.tokens] == ["c#0", "c#1"]
    assert plan.tokens[0].ids.tolist() == [1, 2, 4, 5, 11]


def test_thinking_off_tail_of_the_templates(ctx: TokenizeContext) -> None:
    from draftdata.tokenize.encode import thinking_off_tail

    expected = "<think>\n\n</think>\n\n" if ctx.template.has_generation_markers else ""
    assert thinking_off_tail(ctx.template) == expected  # ChatML ignores enable_thinking
