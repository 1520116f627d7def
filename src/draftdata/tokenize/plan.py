"""Which samples one completion becomes, and where their loss goes (before any encoding).

A completion of K regenerated turns is a chain of contexts: turn k was generated after prompt
``P_k`` (``conversation.TurnPlan``'s requests and the target's earlier turns, rendered with the
generation prompt). Turn k's output ``A_k`` is what the template renders after ``P_k`` for that
turn, up to and including the end-of-turn token. Turn k can share a sample with turn k+1 only
when ``P_{k+1}`` starts with ``P_k + A_k``, i.e. the next context shows turn k exactly as the
target wrote it. A template that rewrites history (Qwen3 drops the reasoning of turns before the
last user query) breaks the chain, and the completion becomes one sample per chain, the sample
named after the chain's last turn: ``<id>#<turn>`` (``turn`` indexes the completion's
``turns``). A completion that is one chain keeps its own id. Completions with ``sample`` > 0 are
``<id>#s<sample>``.

With ``per_turn`` (the trainer exports: one row per generated turn, as SpecForge's
last-turn-only training and speculators' regeneration rows expect) every usable turn is its own
sample: its context ``P_k`` then its output ``A_k``, loss on ``A_k`` only, named ``<id>#<turn>``
(a completion of one turn keeps its id).

Two planners share that rule:

- ``plan_rendered``: text and character spans of loss (``A_k`` of every turn in the chain,
  intersected with the template's ``{% generation %}`` blocks when it has them, so the mask
  equals transformers' ``return_assistant_tokens_mask`` wherever no turn was rewritten).
- ``plan_token_ids``: the server's ids, ``prompt_token_ids + output_token_ids`` of the chain's
  last turn, loss on every chain turn's output ids; the chain test compares ids.

A turn cut by max tokens (finish ``length``) never got its end-of-turn token, nor the closing
markers the template would add: the rendered planner ends such a sample at the end of the
turn's last text (its content, else its reasoning) and lets no later turn chain onto it; when it
cannot place that end it drops the turn (``unfinished_turn``). The token-id planner keeps the
served ids as they are; they are verified against the prefix of the turn's whole rendering they
spell (``RenderedSample.full``), wherever the cut fell.

In a sample built from served ids, loss is 1 on served output tokens only, each at the place
the target wrote it. Nothing the target did not write gets loss: the template's text after a
turn (``<|im_end|>`` then ``\n``) is appended, with loss 0, only after an output that ends with
the template's own end-of-turn token; an output that ends another way (another end token such
as ``<|endoftext|>``, a user stop string, a server that leaves the end token out, a cut) is
the sample's end as served. A turn that ended with another end token still chains into the
next turn's context when that context shows it closed by the template's end-of-turn token;
that token is context there (loss 0), not the target's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from draftdata.errors import InputError
from draftdata.records import sample_key
from draftdata.shared.conversation import (
    RULE,
    TurnPlan,
    message_dict,
    message_from_dict,
    turn_message,
)
from draftdata.tokenize.template import ChatTemplate, JsonDict, Span, TurnText

IdArray = npt.NDArray[np.int32]


@dataclass(slots=True)
class CompletionView:
    """The fields of one completion the tokenizer needs (decoded from its Arrow row)."""

    id: str
    sample: int
    source: str
    domain: str
    messages: list[JsonDict]
    tools: list[JsonDict] | None
    turns: list[TurnText]
    template_kwargs: JsonDict = field(default_factory=dict)
    rule: int = RULE  # the conversation rule the turns were generated under
    # per turn: (prompt ids, output ids), or None when the server did not return both
    token_ids: list[tuple[IdArray, IdArray]] | None = None
    served: bool = False  # a run's completion (a server wrote it), not a conversation row
    server_thinking: bool | None = None  # the server's default mode generate recorded
    prompt_tokens: list[int] = field(default_factory=list)  # per turn, as the server counted

    @property
    def base_id(self) -> str:
        """The sample id of a completion that stays one sample."""
        return sample_key(self.id, self.sample)


@dataclass(slots=True)
class RenderedSample:
    """A sample as text: loss on the characters of ``spans``. A sample whose last turn was
    cut also keeps that turn's whole rendering (``full``: the text with the turn as the
    template closes it, and ``full_spans``, its loss from ``cut_from`` on): the target wrote a
    prefix of it, which served ids may show further than the text alone can place."""

    id: str
    text: str
    spans: list[Span]
    full: str | None = None
    full_spans: list[Span] = field(default_factory=list)
    cut_from: int = 0


@dataclass(slots=True)
class TokenSample:
    """A sample as the server's token ids (``turns``: the completion's turns it holds)."""

    id: str
    ids: IdArray
    mask: npt.NDArray[np.int8]
    turns: tuple[int, ...] = ()


@dataclass(slots=True)
class Plan:
    """The samples of one completion, the reasons turns were dropped, and whether it split."""

    rendered: list[RenderedSample] = field(default_factory=list)
    tokens: list[TokenSample] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # counted, not drops (e.g. end.other_token)
    split: bool = False
    links: list[bool] = field(default_factory=list)  # links[k]: turn k chains into turn k+1


def _chains(links: list[bool], usable: list[bool]) -> list[list[int]]:
    # links[k]: turn k continues into turn k+1's sample; usable[k]: turn k may carry loss.
    chains: list[list[int]] = []
    current: list[int] = []
    for k, ok in enumerate(usable):
        if ok:
            current.append(k)
        if not (k < len(links) and links[k] and ok) and current:
            chains.append(current)
            current = []
    return chains


def _sample_id(view: CompletionView, last_turn: int, n_chains: int) -> str:
    return view.base_id if n_chains == 1 else f"{view.base_id}#{last_turn}"


def _group(
    view: CompletionView, links: list[bool], usable: list[bool], per_turn: bool
) -> tuple[list[list[int]], int]:
    # (chains, the count that names them): per-turn chains are named by the completion's turns
    if per_turn:
        return [[k] for k, ok in enumerate(usable) if ok], len(view.turns)
    chains = _chains(links, usable)
    return chains, len(chains)


def contexts(view: CompletionView, keep_reasoning_history: bool) -> list[list[JsonDict]] | None:
    """The message list the engine sent before each turn (``conversation.TurnPlan.expand``);
    None when the completion has more turns than the prompt has requests."""
    turn_plan = TurnPlan([message_from_dict(m) for m in view.messages], rule=view.rule)
    if len(view.turns) > len(turn_plan) or not view.turns:
        return None if view.turns else []
    expanded = turn_plan.expand(view.turns, keep_reasoning=keep_reasoning_history)
    if len(expanded) != len(view.turns):  # turns past the one that broke the conversation
        return None
    return [[message_dict(m) for m in tc.context] for tc in expanded]


def plan_rendered(
    view: CompletionView,
    template: ChatTemplate,
    *,
    keep_reasoning_history: bool = False,
    breaks: frozenset[int] = frozenset(),
    per_turn: bool = False,
    checking: bool = False,
) -> Plan:
    """Render every turn's context and output; group turns into chains (module docstring), or
    with ``per_turn`` make each turn its own sample.

    ``breaks``: turns that must not chain into the next one (verification renders a token-id
    completion with the served ids' chain breaks, so both paths name the same samples).
    ``checking``: the plan checks served ids; a cut turn whose end the text cannot place ends
    its sample at its prompt (the served ids are checked against its whole rendering).
    """
    plan = Plan()
    ctxs = contexts(view, keep_reasoning_history)
    if ctxs is None:
        plan.dropped.append("turns_mismatch")
        return plan
    if not ctxs:
        plan.dropped.append("no_turns")
        return plan
    texts: list[str] = []  # F_k: context k + turn k as the target wrote it
    gen_spans: list[list[Span]] = []
    regions: list[Span | None] = []  # A_k in F_k
    prompts: list[str] = []
    try:
        for ctx, turn in zip(ctxs, view.turns, strict=True):
            prompt, _ = template.render(
                ctx, view.tools, view.template_kwargs, add_generation_prompt=True
            )
            full, spans = template.render(
                [*ctx, message_dict(turn_message(turn, keep_reasoning=True))],
                view.tools,
                view.template_kwargs,
                add_generation_prompt=False,
                track=True,
            )
            prompts.append(prompt)
            texts.append(full)
            gen_spans.append(spans)
            regions.append(_region(prompt, full, template.eot, turn, plan, checking))
    except InputError:
        plan.dropped.append("template_error")
        return plan
    usable = [r is not None for r in regions]
    cut = [t.finish_reason == "length" for t in view.turns]
    ends = [r[1] if r is not None else 0 for r in regions]
    links = [
        usable[k]
        and not cut[k]
        and k not in breaks
        and prompts[k + 1].startswith(texts[k][: ends[k]])
        for k in range(len(texts) - 1)
    ]
    plan.links = links
    chains, named = _group(view, links, usable, per_turn)
    plan.split = len(chains) > 1
    for chain in chains:
        last = chain[-1]
        loss = [r for k in chain if (r := regions[k]) is not None]
        if template.has_generation_markers:
            loss = _intersect(gen_spans[last], loss)
        text = texts[last]
        sample = RenderedSample(id=_sample_id(view, last, named), text=text, spans=loss)
        if cut[last]:
            sample.text = text[: ends[last]]
            start = len(prompts[last])
            whole = [(start, text.find(template.eot, start) + len(template.eot))]
            if template.has_generation_markers:
                whole = _intersect(gen_spans[last], whole)
            sample.full, sample.full_spans, sample.cut_from = text, whole, start
        plan.rendered.append(sample)
    return plan


def _region(
    prompt: str, full: str, eot: str, turn: TurnText, plan: Plan, checking: bool = False
) -> Span | None:
    if not full.startswith(prompt):
        plan.dropped.append("template_prefix")
        return None
    end = full.find(eot, len(prompt))
    if end < 0:
        plan.dropped.append("no_end_of_turn")
        return None
    if turn.finish_reason == "length":
        cut = _cut_region(full, len(prompt), end, turn)
        if cut is None and checking:
            return (len(prompt), len(prompt))  # placed by the served ids (encode.cut_verdict)
        if cut is None:
            plan.dropped.append("unfinished_turn")
        return cut
    return (len(prompt), end + len(eot))


def _cut_region(full: str, start: int, eot_at: int, turn: TurnText) -> Span | None:
    # A turn cut by max tokens: the target wrote the rendered turn only up to the end of its
    # last text (the template's closing markers and end-of-turn were never generated). Content
    # of whitespace only cannot be placed (cut right after </think>, or one newline after it:
    # parsers strip those newlines): the sample ends after the reasoning, what surely was
    # written; served ids show the rest (encode.py verifies them against ``full``).
    body = full[start:eot_at]
    content = turn.content or ""
    if content.strip() and not turn.tool_calls and body.endswith(content):
        return (start, eot_at)
    reasoning = (turn.reasoning or "").strip("\n")
    if not content.strip() and reasoning and (at := body.rfind(reasoning)) >= 0:
        return (start, start + at + len(reasoning))
    return None


def _intersect(a: list[Span], b: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s1, e1 in a:
        for s2, e2 in b:
            s, e = max(s1, s2), min(e1, e2)
            if s < e:
                out.append((s, e))
    return sorted(out)


def plan_token_ids(
    view: CompletionView,
    *,
    eot_id: int | None = None,
    suffix: IdArray | None = None,
    end_ids: frozenset[int] = frozenset(),
    per_turn: bool = False,
) -> Plan:
    """Samples from the server's ids: chains by id prefix, loss on each chain turn's output
    (``per_turn``: one sample per turn, its prompt ids then its output ids).

    Loss is 1 only on served output tokens that stand where the target wrote them. A sample
    whose last output ends with ``eot_id`` gets ``suffix`` appended with loss 0 (the
    template's text after a turn, so the sample equals the rendered one); after any other
    ending nothing is appended. ``end_ids`` are the tokens that end a generation besides
    ``eot_id`` (``<|endoftext|>``): a turn ended by one chains into a next context that shows
    it closed by ``eot_id`` instead (module docstring).
    """
    plan = Plan()
    pairs = view.token_ids
    if not pairs:
        plan.dropped.append("no_turns")
        return plan
    seqs = [np.concatenate((p, o)) if len(p) else o for p, o in pairs]
    links = [
        _continues(pairs[k][0], pairs[k][1], pairs[k + 1][0], eot_id, end_ids)
        for k in range(len(pairs) - 1)
    ]
    plan.links = links
    usable = [len(o) > 0 for _, o in pairs]
    plan.dropped.extend("empty_output" for ok in usable if not ok)
    chains, named = _group(view, links, usable, per_turn)
    plan.split = len(chains) > 1
    for chain in chains:
        last = chain[-1]
        ids = seqs[last].astype(np.int32, copy=False)
        mask = np.zeros(len(ids), dtype=np.int8)
        for k in chain:
            start, out = len(pairs[k][0]), pairs[k][1]
            # 1 where the sample holds the served token itself (a later context may show
            # another end token in place of the target's own)
            mask[start : start + len(out)] = ids[start : start + len(out)] == out
        out = pairs[last][1]
        ended = _ending(out, view.turns[last] if last < len(view.turns) else None, eot_id, end_ids)
        if ended is not None:
            plan.notes.append(ended)
        if suffix is not None and len(suffix) and len(out) and int(out[-1]) == eot_id:
            ids = np.concatenate((ids, suffix.astype(np.int32, copy=False)))
            mask = np.concatenate((mask, np.zeros(len(suffix), dtype=np.int8)))
        plan.tokens.append(
            TokenSample(id=_sample_id(view, last, named), ids=ids, mask=mask, turns=tuple(chain))
        )
    return plan


def _continues(
    prompt: IdArray, out: IdArray, nxt: IdArray, eot_id: int | None, end_ids: frozenset[int]
) -> bool:
    # Turn (prompt, out) chains into the next turn when the next context starts with it as
    # served, or with its last token, another end token, shown as the template's end-of-turn.
    n = len(prompt) + len(out)
    if len(nxt) < n or not np.array_equal(nxt[: len(prompt)], prompt):
        return False
    if np.array_equal(nxt[len(prompt) : n], out):
        return True
    if eot_id is None or not len(out) or int(out[-1]) == eot_id or int(out[-1]) not in end_ids:
        return False
    return bool(np.array_equal(nxt[len(prompt) : n - 1], out[:-1]) and int(nxt[n - 1]) == eot_id)


def _ending(
    out: IdArray, turn: TurnText | None, eot_id: int | None, end_ids: frozenset[int]
) -> str | None:
    # How a stopped turn ended when not with the template's end-of-turn token (counted).
    if turn is None or turn.finish_reason not in ("stop", "tool_calls"):
        return None
    last = int(out[-1]) if len(out) else None
    if last is not None and last == eot_id:
        return None
    return "end.other_token" if last in end_ids else "end.no_token"


def view_from_record(record: Any) -> CompletionView:
    """A CompletionView of a ``records.Completion`` (tests and small callers)."""

    messages = [{k: v for k, v in msgspec.structs.asdict(m).items()} for m in record.messages]
    turns = [TurnText(t.content, t.reasoning, t.tool_calls, t.finish_reason) for t in record.turns]
    ids: list[tuple[IdArray, IdArray]] | None = None
    if record.turns and all(
        t.prompt_token_ids is not None and t.output_token_ids is not None for t in record.turns
    ):
        ids = [
            (np.asarray(t.prompt_token_ids, np.int32), np.asarray(t.output_token_ids, np.int32))
            for t in record.turns
        ]
    kwargs = record.sampling.get("chat_template_kwargs") if record.sampling else None
    return CompletionView(
        id=record.id,
        sample=record.sample,
        source=record.source,
        domain=record.domain,
        messages=messages,
        tools=record.tools,
        turns=turns,
        template_kwargs=dict(kwargs) if isinstance(kwargs, dict) else {},
        rule=record.conversation_rule,
        token_ids=ids,
        served=True,
        server_thinking=record.server_thinking,
        prompt_tokens=[t.usage.prompt_tokens for t in record.turns],
    )
