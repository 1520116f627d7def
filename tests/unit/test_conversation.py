"""The one conversation rule: requests, history, stops, assembly and per-turn contexts.

The property tests draw random prompt shapes (system anywhere, leading and consecutive
assistants, tool calls and results, several user turns) and check the rule's promises: every
prompt message keeps its order, each answer stands right after the message it answers, and
generate's requests, export's assembly and tokenize's per-turn contexts are one conversation.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.export.stage import export_record
from draftdata.records import Completion, Message, Turn
from draftdata.shared import conversation as conv
from draftdata.shared.conversation import (
    RULE_LEGACY,
    STOP_LENGTH,
    STOP_NO_TOOL_CALL,
    STOP_TOOL_MISMATCH,
    STOP_UNANSWERED_CALL,
    TurnPlan,
)
from draftdata.stats.conversations import completion_to_conversation
from draftdata.tokenize.plan import contexts, view_from_record


def call(name: str, cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def m(role: str, content: str = "x", **kw: Any) -> Message:
    return Message(role=role, content=content, **kw)


def answer(text: str, **kw: Any) -> Turn:
    return Turn(content=text, finish_reason=kw.pop("finish_reason", "stop"), **kw)


def shape(messages: list[Message], turns: list[Turn]) -> list[str]:
    return [f"{x.role}:{x.content}" for x in TurnPlan(messages).assemble(turns)]


def requests_of(*messages: Message, rule: int = conv.RULE) -> list[list[str]]:
    p = TurnPlan(list(messages), rule=rule)
    return [[f"{messages[i].role}:{messages[i].content}" for i in r.new] for r in p.requests]


# -- the requests ------------------------------------------------------------------------


def test_single_turn_prompts_are_one_request() -> None:
    assert requests_of(m("system", "s"), m("user", "u")) == [["system:s", "user:u"]]
    assert requests_of(m("user", "u"), m("assistant", "a")) == [["user:u"]]


def test_original_answers_are_replaced() -> None:
    got = requests_of(m("system", "s"), m("user", "u1"), m("assistant", "a1"), m("user", "u2"))
    assert got == [["system:s", "user:u1"], ["user:u2"]]


def test_every_user_turn_gets_its_own_answer() -> None:
    """Infinity-Instruct's "Name a prime." + "And a larger one?" with the answers dropped."""
    got = requests_of(m("user", "Name a prime."), m("user", "And a larger one?"))
    assert got == [["user:Name a prime."], ["user:And a larger one?"]]
    # a system message between two user turns goes with the second
    got = requests_of(m("user", "u1"), m("system", "s"), m("user", "u2"))
    assert got == [["user:u1"], ["system:s", "user:u2"]]


def test_tool_results_are_answered_after_the_targets_call() -> None:
    got = requests_of(
        m("user", "u"),
        m("assistant", "", tool_calls=[call("f", "c1"), call("g", "c2")]),
        m("tool", "r1", tool_call_id="c1"),
        m("tool", "r2", tool_call_id="c2"),
        m("assistant", "final"),
    )
    assert got == [["user:u"], ["tool:r1", "tool:r2"]]
    p = TurnPlan(
        [
            m("user", "u"),
            m("assistant", "", tool_calls=[call("f", "c1"), call("g", "c2")]),
            m("tool", "r2", tool_call_id="c2"),
            m("tool", "r1", tool_call_id="c1"),
        ]
    )
    assert p.requests[1].calls == ("g", "f")


def test_irregular_prompts_from_the_issue() -> None:
    """Before this module export wrote ``[system, answer, user]`` and ``[user, answer, answer,
    user]`` for these two prompts."""
    assert shape([m("system", "s"), m("assistant", "a"), m("user", "u")], [answer("A")]) == [
        "system:s",
        "user:u",
        "assistant:A",
    ]
    assert shape(
        [m("user", "u1"), m("assistant", "a"), m("assistant", "b"), m("user", "u2")],
        [answer("A1"), answer("A2")],
    ) == ["user:u1", "assistant:A1", "user:u2", "assistant:A2"]


def test_legacy_rule_rebuilds_what_old_generate_sent() -> None:
    msgs = [m("user", "u1"), m("user", "u2"), m("assistant", "a"), m("system", "late")]
    assert requests_of(*msgs, rule=RULE_LEGACY) == [["user:u1", "user:u2"]]
    assert requests_of(*msgs) == [["user:u1"], ["user:u2"]]
    assert TurnPlan(msgs).tail == (3,)
    with pytest.raises(ValueError, match="unknown conversation rule"):
        TurnPlan(msgs, rule=7)


# -- history and the stop rule -----------------------------------------------------------------


def test_history_is_the_targets_own_turns() -> None:
    p = TurnPlan([m("user", "u1"), m("assistant", "orig"), m("user", "u2")])
    t0 = Turn(content=None, reasoning="think", finish_reason="stop")
    assert p.context(1, [t0]) == [m("user", "u1"), m("assistant", ""), m("user", "u2")]
    kept = p.context(1, [t0], keep_reasoning=True)
    assert kept[1] == Message(role="assistant", content="", reasoning_content="think")
    with pytest.raises(ValueError):
        p.context(1, [])


def _agent(observation_for: str = "search") -> list[Message]:
    return [
        m("system", "agent"),
        m("user", "task"),
        m("assistant", "", tool_calls=[call(observation_for, "orig-1")]),
        m("tool", "observation", tool_call_id="orig-1"),
        m("assistant", "done"),
    ]


def test_tool_result_follows_the_targets_matching_call_with_its_id() -> None:
    p = TurnPlan(_agent())
    acted = Turn(tool_calls=[call("search", "target-7")], finish_reason="tool_calls")
    assert p.stop_reason(0, acted) is None
    ctx = p.context(1, [acted])
    assert [x.role for x in ctx] == ["system", "user", "assistant", "tool"]
    assert ctx[2].tool_calls == acted.tool_calls
    assert ctx[3].tool_call_id == "target-7"  # relinked to the call the target made


@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        (Turn(content="no tools", finish_reason="stop"), STOP_NO_TOOL_CALL),
        (Turn(tool_calls=[call("browse", "t")], finish_reason="tool_calls"), STOP_TOOL_MISMATCH),
        (
            Turn(tool_calls=[call("search", "a"), call("search", "b")]),
            STOP_TOOL_MISMATCH,
        ),
        (Turn(content="cut", finish_reason="length"), STOP_LENGTH),
    ],
)
def test_a_broken_exchange_stops_the_conversation(turn: Turn, reason: str) -> None:
    p = TurnPlan(_agent())
    assert p.stop_reason(0, turn) == reason
    assert p.usable_turns([turn, answer("never")]) == 1
    # the conversation ends with the turn that broke it; the tool result is not in it
    assert [x.role for x in p.assemble([turn])] == ["system", "user", "assistant"]
    assert len(p.expand([turn, answer("x")])) == 1
    # the last turn of a conversation never stops anything
    assert p.stop_reason(1, turn) is None


def test_a_call_nothing_answers_stops_and_legacy_never_stops() -> None:
    msgs = [m("user", "u1"), m("assistant", "a"), m("user", "u2")]
    acted = Turn(tool_calls=[call("f", "c")])
    assert TurnPlan(msgs).stop_reason(0, acted) == STOP_UNANSWERED_CALL
    assert TurnPlan(msgs, rule=RULE_LEGACY).stop_reason(0, acted) is None
    cut = Turn(content="x", finish_reason="length")
    assert TurnPlan(msgs, rule=RULE_LEGACY).stop_reason(0, cut) is None


def test_unnamed_results_match_by_count() -> None:
    # no original call in the prompt (and no name on the result): any single call fits
    p = TurnPlan([m("user", "u"), m("tool", "r"), m("user", "u2")])
    assert [len(r.new) for r in p.requests] == [1, 1, 1]
    assert p.stop_reason(0, Turn(tool_calls=[call("anything", "c")])) is None
    assert p.stop_reason(0, Turn(content="no call")) == STOP_NO_TOOL_CALL
    named = TurnPlan([m("user", "u"), m("tool", "r", name="f")])
    assert named.stop_reason(0, Turn(tool_calls=[call("g", "c")])) == STOP_TOOL_MISMATCH


# -- properties over random prompt shapes ------------------------------------------------------

_ROLES = st.sampled_from(["system", "user", "assistant", "assistant_call", "tool", "user"])


@st.composite
def prompts(draw: st.DrawFn) -> list[Message]:
    roles = draw(st.lists(_ROLES, min_size=1, max_size=12))
    if "user" not in roles:
        roles.insert(draw(st.integers(0, len(roles))), "user")
    out: list[Message] = []
    for i, role in enumerate(roles):
        text = f"{role}{i}"
        if role == "assistant_call":
            names = draw(st.lists(st.sampled_from(["f", "g"]), min_size=1, max_size=2))
            calls = [call(n, f"o{i}-{j}") for j, n in enumerate(names)]
            out.append(Message(role="assistant", content=text, tool_calls=calls))
        elif role == "tool":
            out.append(Message(role="tool", content=text, tool_call_id=f"o{i - 1}-0"))
        else:
            out.append(Message(role=role, content=text))
    return out


@st.composite
def turns_for(draw: st.DrawFn, n: int) -> list[Turn]:
    out = []
    for k in range(n):
        kind = draw(st.sampled_from(["text", "text", "call_f", "call_g", "cut"]))
        if kind.startswith("call"):
            out.append(Turn(tool_calls=[call(kind[-1], f"t{k}")], finish_reason="tool_calls"))
        else:
            out.append(
                Turn(
                    content=f"A{k}",
                    reasoning=f"R{k}",
                    finish_reason="length" if kind == "cut" else "stop",
                )
            )
    return out


@settings(max_examples=300, deadline=None)
@given(data=st.data(), msgs=prompts(), rule=st.sampled_from([conv.RULE, RULE_LEGACY]))
def test_assembly_keeps_order_and_puts_each_answer_after_its_message(
    data: st.DataObject, msgs: list[Message], rule: int
) -> None:
    p = TurnPlan(msgs, rule=rule)
    turns = data.draw(turns_for(len(p)))
    out = p.assemble(turns)
    n = p.usable_turns(turns)
    answers = [x for x in out if x.role == "assistant"]
    assert len(answers) == n
    # prompt messages: no assistant ever, in prompt order, each at most once
    kept = [x for x in out if x.role != "assistant"]
    # (contents are unique per prompt message; tool results may carry a relinked id)
    positions = [next(i for i, y in enumerate(msgs) if y.content == x.content) for x in kept]
    assert positions == sorted(set(positions))
    # every request's messages appear, then its answer right after its last message
    for k in range(n):
        last = p.requests[k].new[-1]
        at = next(i for i, x in enumerate(out) if x.content == msgs[last].content)
        assert out[at + 1].role == "assistant"
        assert out[at + 1].content == (turns[k].content or "")
        # and the answer answers something: the nearest non-system message before it
        before = [x for x in out[: at + 1] if x.role != "system"]
        assert before[-1].role in ("user", "tool")
    if rule == conv.RULE and n == len(p):
        # every non-assistant prompt message is in a finished conversation
        assert len(kept) == sum(1 for x in msgs if x.role != "assistant")
        # each user message is answered before the next user message
        roles = [x.role for x in out if x.role != "system"]
        assert "user,user" not in ",".join(roles)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), msgs=prompts(), keep=st.booleans())
def test_generate_export_and_tokenize_see_one_conversation(
    data: st.DataObject, msgs: list[Message], keep: bool
) -> None:
    p = TurnPlan(msgs)
    turns = data.draw(turns_for(len(p)))
    # generate: request k's messages from the turns before it, stopping where the rule says
    sent: list[list[Message]] = []
    got: list[Turn] = []
    for k in range(len(p)):
        sent.append(p.context(k, got, keep_reasoning=keep))
        got.append(turns[k])
        if p.stop_reason(k, turns[k]) is not None:
            break
    completion = Completion(id="c", messages=msgs, turns=got)
    # tokenize: per-turn contexts equal what generate sent
    expanded = p.expand(got, keep_reasoning=keep)
    assert [tc.context for tc in expanded] == sent
    view = view_from_record(completion)
    ctxs = contexts(view, keep)
    assert ctxs is not None
    assert [[conv.message_from_dict(d) for d in ctx] for ctx in ctxs] == sent
    # export / stats / merge: the assembly continues each request's context with its turn
    full = conv.assemble(completion)
    assert completion_to_conversation(completion).messages == full
    for k, ctx in enumerate(sent):
        # with reasoning kept, every context is a prefix of the assembled conversation
        if keep:
            assert full[: len(ctx)] == ctx
        assert full[len(ctx)].content == (got[k].content or "")
    rec = export_record(completion, "openai")
    assert [x["role"] for x in rec["messages"]] == [x.role for x in full]


def test_old_export_rule_disagreed() -> None:
    """Export now goes through the rule: an answer never precedes the question it answers."""
    c = Completion(
        id="c",
        messages=[m("system", "s"), m("assistant", "a"), m("user", "u")],
        turns=[answer("A")],
    )
    rec = export_record(c, "openai")
    assert [x["role"] for x in rec["messages"]] == ["system", "user", "assistant"]


# -- completions written before the rule (completion/1) ------------------------------------------


def test_completion_1_shards_keep_the_rule_they_were_generated_under() -> None:
    """An old shard (no ``conversation_rule`` column) is read as rule 1: its one turn answered
    ``[u1, u2]`` together, and export and tokenize rebuild exactly that request."""
    import pyarrow as pa

    from draftdata.errors import FormatVersionError
    from draftdata.shared.formats import (
        COMPLETION_SCHEMA,
        FORMAT_KEY,
        check_format,
        completion_row,
        iter_completions,
    )
    from draftdata.tokenize.arrow import views_from_table

    c = Completion(id="old", messages=[m("user", "u1"), m("user", "u2")], turns=[answer("A")])
    old_fields = [
        f
        for f in COMPLETION_SCHEMA
        if f.name not in ("stop_reason", "conversation_rule", "server_thinking")
    ]
    old_schema = pa.schema(old_fields, metadata={FORMAT_KEY: b"completion/1"})
    row = {k: v for k, v in completion_row(c).items() if k in old_schema.names}
    table = pa.Table.from_pylist([row], schema=old_schema)
    check_format(table.schema, "completion/3", "old.parquet")  # still readable
    with pytest.raises(FormatVersionError):
        check_format(pa.schema([], metadata={FORMAT_KEY: b"completion/9"}), "completion/3", "x")
    (read,) = iter_completions(table)
    assert read.conversation_rule == RULE_LEGACY
    assert [x.content for x in conv.assemble(read)] == ["u1", "u2", "A"]
    (view,) = views_from_table(table)
    assert contexts(view, False) == [
        [conv.message_dict(m("user", "u1")), conv.message_dict(m("user", "u2"))]
    ]
    # the same completion written today follows the current rule: u1 is answered on its own
    assert [x.content for x in conv.assemble(c)] == ["u1", "A"]


def test_the_rule_has_one_home_and_tokenize_does_not_import_generate() -> None:
    """tokenize reads the rule from ``draftdata.shared.conversation`` (not from generate), and the
    rule depends on nothing of the project but the records."""
    import ast
    from pathlib import Path

    import draftdata

    root = Path(draftdata.__file__).parent

    def imports(path: Path) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        return out

    for path in (root / "tokenize").glob("*.py"):
        assert not any(m.startswith("draftdata.generate") for m in imports(path)), path.name
    own = {m for m in imports(root / "shared" / "conversation.py") if m.startswith("draftdata")}
    assert own == {"draftdata.records"}


_PLAIN_ROLES = st.sampled_from(["system", "user", "system", "assistant", "tool", "developer"])


@settings(max_examples=300, deadline=None)
@given(
    roles=st.one_of(
        st.lists(_PLAIN_ROLES, max_size=6),
        st.lists(st.just("system"), max_size=4).map(lambda r: [*r, "user"]),
    ),
    shared=st.booleans(),
)
def test_the_single_request_fast_path_cuts_as_the_general_rule(
    roles: list[str], shared: bool
) -> None:
    # ``_cut`` answers system+user prompts without the general cutter: the same requests and
    # tail for every role sequence (also when one Message object appears several times)
    pool: dict[str, Message] = {}
    msgs = [
        pool.setdefault(r, Message(role=r, content=r)) if shared else Message(role=r, content=r)
        for r in roles
    ]
    assert conv._cut(msgs) == conv._cut_general(msgs)
