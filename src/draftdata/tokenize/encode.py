"""The pure batch function of the tokenize stage: a completions table in, a samples table out.

``tokenize_table(table, ctx)`` takes an Arrow table with the completion schema (at least
``id``, ``sample``, ``source``, ``domain``, ``messages``, ``tools``, ``turns``, ``sampling``)
and returns ``(samples, counters)``: a table with the sample schema (``formats.SAMPLE_SCHEMA``:
``id``, ``source``, ``domain``, ``input_ids`` list<int32>, ``loss_mask`` list<int8>,
``num_tokens``, ``num_loss_tokens``, ``truncated``) and the batch's ``Counters``. It does no I/O;
the single-process stage (``stage.py``) and the Ray Data job (``distributed/ray_tokenize.py``)
both call it, so their samples are the same.

How a batch is tokenized:

1. Each completion is planned (``plan.py``): completions whose turns all carry server
   ``prompt_token_ids`` and ``output_token_ids`` take the token-id path (the ids are the
   sample); the others are rendered with the chat template into text + loss character spans.
   With ``ctx.verify``, token-id completions are rendered too, to check them.
2. Every rendered text of the batch is encoded in one ``encode_batch`` call (the Rust tokenizer
   runs it on all cores; no prefix is ever encoded twice). A loss span becomes token positions
   through the encoding's character offsets: every token that overlaps the span gets loss 1,
   the rule of transformers' ``return_assistant_tokens_mask``.
3. Verification compares each token-id sample with the rendered sample of the same id (the
   rendered plan keeps the served ids' chain breaks): ids and mask identical is ``verified``;
   the same text with loss on the same text in another tokenization is
   ``verified.noncanonical``; an output that ended another way than the template's
   end-of-turn token (``<|endoftext|>``, a stop string, an end token the server left out) and
   spells the rendered text up to that token is ``verified.other_end``. A served sample the
   template cannot render back because of how the server split the reasoning (an answer
   without ``</think>``: the reasoning parser puts all of it in the reasoning, which the
   template renders inside a think block the target never wrote; every answer cut while
   thinking, and models whose template opens ``<think>`` itself) is checked by decoding
   instead: each turn's served prompt ids decode to the template's rendering of its context and
   its output ids to the stored reasoning and content (think markers, special tokens,
   whitespace and undecodable bytes aside: engines differ on a marker inside an unclosed
   answer). It is ``verified.decoded`` and kept (the served ids are what the target produced;
   ``reasoning.unclosed`` counts the answers without ``</think>``). Anything else is
   ``mismatched`` (the first few are described as decoded text around the first differing
   token) and the sample is dropped (``dropped.unverified_ids``): served ids that do not decode
   to the stored text come from another tokenizer, and re-rendering them would train on a
   context the server may not have shown. A turn cut by the token limit is checked against the
   prefix of its whole rendering its served ids spell, wherever the cut fell
   (``verified.cut``; ids past what the stored turn holds are trimmed: ``verified.cut_trimmed``,
   ``cut_verdict``). A completion the renderer cannot render at all is ``unverifiable`` and
   kept.
4. Length policy: longer than ``max_length`` is cut (``truncated``) or dropped (``too_long``);
   a sample without two consecutive loss tokens is dropped (``too_few_loss_tokens``).

``TokenizeContext`` holds the loaded tokenizer and template. It pickles as its settings and
rebuilds itself (loads the tokenizer) on unpickling, so it can be shipped to worker processes or
Ray actors, or rebuilt there with ``TokenizeContext.from_config(config)``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from draftdata.errors import InputError
from draftdata.tokenize.arrow import samples_table, views_from_table
from draftdata.tokenize.config import (
    MAX_MISMATCH_EXAMPLES,
    MIN_LOSS_RUN,
    DomainTotals,
    LongPolicy,
    TokenizeConfig,
)
from draftdata.tokenize.plan import (
    CompletionView,
    IdArray,
    Plan,
    RenderedSample,
    TokenSample,
    contexts,
    plan_rendered,
    plan_token_ids,
)
from draftdata.tokenize.template import (
    ChatTemplate,
    TurnText,
    load_tokenizer,
    read_template_file,
)
from draftdata.tokenize.thinking import counted_modes, decide, left_to_server, switch_matters

COMPLETION_COLUMNS = (
    "id",
    "sample",
    "source",
    "domain",
    "messages",
    "tools",
    "turns",
    "sampling",
    "conversation_rule",
    "server_thinking",
)


@dataclass
class Counters:
    """Counts of one batch (or a whole run, merged): see ``TokenizeSummary.counts``."""

    counts: Counter[str] = field(default_factory=Counter)
    domains: dict[str, DomainTotals] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        self.counts[name] += n

    def add_sample(self, domain: str, tokens: int, loss_tokens: int) -> None:
        """Count one emitted sample under its domain."""
        d = self.domains.setdefault(domain, DomainTotals())
        d.samples += 1
        d.tokens += tokens
        d.loss_tokens += loss_tokens

    def merge(self, other: Counters) -> None:
        """Fold ``other`` into this one (mismatch examples capped)."""
        self.counts.update(other.counts)
        for name, d in other.domains.items():
            mine = self.domains.setdefault(name, DomainTotals())
            mine.samples += d.samples
            mine.tokens += d.tokens
            mine.loss_tokens += d.loss_tokens
        room = MAX_MISMATCH_EXAMPLES - len(self.mismatches)
        self.mismatches.extend(other.mismatches[: max(0, room)])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (sorted)."""
        return {
            "counts": dict(sorted(self.counts.items())),
            "domains": {k: msgspec.to_builtins(v) for k, v in sorted(self.domains.items())},
            "mismatches": list(self.mismatches),
        }


class TokenizeContext:
    """The loaded tokenizer and chat template plus the policy of one tokenize run."""

    def __init__(
        self,
        tokenizer_path: str,
        *,
        chat_template: str | None = None,
        max_length: int | None = None,
        long: LongPolicy = "truncate",
        verify: bool = True,
        keep_reasoning_history: bool = False,
        server_thinking: bool | None = None,
        per_turn: bool = False,
    ) -> None:
        self.tokenizer_path = tokenizer_path
        self.chat_template_source = chat_template
        self.max_length = max_length
        self.long = long
        self.verify = verify
        self.keep_reasoning_history = keep_reasoning_history
        # the servers' default thinking mode the user states, for answers the run cannot tell
        self.server_thinking = server_thinking
        self.per_turn = per_turn  # one sample per generated turn (the trainer exports)
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.backend = self.tokenizer.backend_tokenizer
        self.template = ChatTemplate.for_tokenizer(self.tokenizer, chat_template)
        eot_id = self.tokenizer.convert_tokens_to_ids(self.template.eot)
        self.eot_id: int | None = eot_id if isinstance(eot_id, int) else None
        self.end_ids = end_token_ids(self.tokenizer, tokenizer_path) - {self.eot_id}
        self.thinking_off_tail = thinking_off_tail(self.template)
        self.thinking_off_tail_tokens = len(
            self.backend.encode(self.thinking_off_tail, add_special_tokens=False).ids
        )
        self.thinking_switch = switch_matters(self.template)
        suffix = self.template.turn_suffix()
        self.suffix_ids = np.asarray(
            self.backend.encode(suffix, add_special_tokens=False).ids if suffix else [],
            dtype=np.int32,
        )

    @classmethod
    def from_config(cls, config: TokenizeConfig) -> TokenizeContext:
        """Load the tokenizer and template that ``config`` names (``--chat-template`` read here).

        ``keep_reasoning_history`` None counts as False; ``stage.tokenize`` resolves it from
        the run's manifest before building the context.
        """
        template = read_template_file(config.chat_template) if config.chat_template else None
        return cls(
            config.tokenizer,
            chat_template=template,
            max_length=config.max_length,
            long=config.long,
            verify=config.verify,
            keep_reasoning_history=bool(config.keep_reasoning_history),
            server_thinking=config.server_thinking,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_context, (self._settings(),))

    def _settings(self) -> dict[str, Any]:
        return {
            "tokenizer_path": self.tokenizer_path,
            "chat_template": self.chat_template_source,
            "max_length": self.max_length,
            "long": self.long,
            "verify": self.verify,
            "keep_reasoning_history": self.keep_reasoning_history,
            "server_thinking": self.server_thinking,
            "per_turn": self.per_turn,
        }

    def prompt_lengths(self, texts: list[str]) -> list[int]:
        """Token counts of rendered prompts, encoded as a server encodes them."""
        encs = self.backend.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encs]

    def decode(self, ids: IdArray | list[int]) -> str:
        """Token ids back to text, special tokens shown."""
        return str(self.backend.decode([int(i) for i in ids], skip_special_tokens=False))


# Tokens that end a generation in common chat vocabularies (Qwen's base eos <|endoftext|>,
# Llama's <|eot_id|> / <|end_of_text|>, Gemma's <end_of_turn>, …), where the vocabulary has them.
_END_TOKENS = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<eos>",
    "</s>",
)


def end_token_ids(tokenizer: Any, path: str) -> frozenset[int]:
    """Ids that may end a served output: the tokenizer's eos, the usual end tokens of its
    vocabulary, and ``eos_token_id`` of a ``generation_config.json`` beside the tokenizer."""
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in _END_TOKENS if t in vocab)
    gen = Path(path) / "generation_config.json"
    if gen.is_file():
        try:
            value = json.loads(gen.read_text("utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            value = None
        values = value if isinstance(value, list) else [value]
        ids.update(v for v in values if isinstance(v, int))
    return frozenset(ids)


def _rebuild_context(settings: dict[str, Any]) -> TokenizeContext:
    path = settings.pop("tokenizer_path")
    return TokenizeContext(path, **settings)


# -- encoding and masks --------------------------------------------------------------------------


def _span_tokens(enc: Any, start: int, end: int) -> tuple[int, int] | None:
    # [first, last] tokens overlapping characters [start, end), found through the offsets at the
    # two ends only (a token shared by split multi-byte characters is widened to its neighbours).
    n = len(enc)
    first = enc.char_to_token(start)
    last = enc.char_to_token(end - 1)
    if first is None or last is None:
        return _span_tokens_scan(enc.offsets, start, end)
    while first > 0 and enc.token_to_chars(first - 1)[1] > start:
        first -= 1
    while last + 1 < n and enc.token_to_chars(last + 1)[0] < end:
        last += 1
    return first, last


def _span_tokens_scan(
    offsets: list[tuple[int, int]], start: int, end: int
) -> tuple[int, int] | None:
    hits = [i for i, (s, e) in enumerate(offsets) if e > start and s < end]
    return (hits[0], hits[-1]) if hits else None


def loss_mask(enc: Any, spans: list[tuple[int, int]]) -> npt.NDArray[np.int8]:
    """1 on every token of ``enc`` that overlaps one of the character ``spans``."""
    mask = np.zeros(len(enc), dtype=np.int8)
    for start, end in spans:
        if end <= start:
            continue
        hit = _span_tokens(enc, start, end)
        if hit is not None:
            mask[hit[0] : hit[1] + 1] = 1
    return mask


def encode_rendered(
    ctx: TokenizeContext, samples: list[RenderedSample]
) -> list[tuple[IdArray, npt.NDArray[np.int8]]]:
    """Ids and loss masks of rendered samples: one batched encode, masks from offsets."""
    if not samples:
        return []
    encs = ctx.backend.encode_batch([s.text for s in samples], add_special_tokens=False)
    return [
        (np.asarray(enc.ids, dtype=np.int32), loss_mask(enc, s.spans))
        for enc, s in zip(encs, samples, strict=True)
    ]


# -- verification ----------------------------------------------------------------------------------


def describe_mismatch(
    ctx: TokenizeContext, sample_id: str, served: IdArray, rendered: IdArray, window: int = 8
) -> str:
    """One line: where the server's ids and the rendered ids first differ, as decoded text."""
    n = min(len(served), len(rendered))
    diff = np.flatnonzero(served[:n] != rendered[:n])
    at = int(diff[0]) if len(diff) else n
    before = ctx.decode(served[max(0, at - window) : at])
    return (
        f"{sample_id}: token {at} (served {len(served)}, rendered {len(rendered)}): "
        f"...{before!r} then served {ctx.decode(served[at : at + window])!r} "
        f"vs rendered {ctx.decode(rendered[at : at + window])!r}"
    )


def _loss_text(
    ctx: TokenizeContext, ids: IdArray, mask: npt.NDArray[np.int8], upto: int | None = None
) -> str:
    # The text under loss, end-of-turn tokens left out: a served sample never has loss on an
    # end-of-turn token the target did not write (one shown in a later context), the rendered
    # one always has, and both still have to agree on every other token.
    ids, mask = ids[:upto], mask[:upto]
    keep = mask.astype(bool)
    if ctx.eot_id is not None:
        keep &= ids != ctx.eot_id
    return ctx.decode(ids[keep])


def verdict(
    ctx: TokenizeContext,
    served: IdArray,
    served_mask: npt.NDArray[np.int8],
    rendered: IdArray,
    rendered_mask: npt.NDArray[np.int8],
) -> str | None:
    """How a served sample matches the rendered one: ``verified`` (the same ids and loss),
    ``verified.noncanonical`` (the same text and loss text, tokenized another way),
    ``verified.other_end`` (the served output ended another way than the template's
    end-of-turn token and spells the rendered text up to it; a stop string's text after it
    carries loss), or None (mismatched)."""
    same_ids = np.array_equal(served, rendered)
    if same_ids and np.array_equal(served_mask, rendered_mask):
        return "verified"
    s_loss = _loss_text(ctx, served, served_mask)
    if same_ids and s_loss == _loss_text(ctx, rendered, rendered_mask):
        return "verified"  # loss differs only on end-of-turn tokens the target did not write
    s_text = ctx.decode(served)
    if s_text == ctx.decode(rendered) and s_loss == _loss_text(ctx, rendered, rendered_mask):
        # The served ids spell exactly the rendered conversation, and the loss covers the same
        # text, but the target chose another tokenization of it than a fresh encode would
        # (e.g. "em" + "ory" where the BPE merges "emory"). The served ids are what the target
        # produced, so the sample is token-exact; the count shows how often.
        return "verified.noncanonical"
    eot = ctx.eot_id
    loss = np.flatnonzero(rendered_mask)
    if eot is None or not len(loss) or int(rendered[loss[-1]]) != eot:
        return None
    if len(served) and int(served[-1]) == eot:
        return None
    if len(served) and int(served[-1]) in ctx.end_ids:
        served, served_mask = served[:-1], served_mask[:-1]
    upto = int(loss[-1])
    body = ctx.decode(rendered[:upto])
    s_body = ctx.decode(served)
    if not s_body.startswith(body):
        return None
    extra = s_body[len(body) :]
    if (
        _loss_text(ctx, served, served_mask)
        == _loss_text(ctx, rendered, rendered_mask, upto) + extra
    ):
        return "verified.other_end"
    return None


def cut_verdict(ctx: TokenizeContext, sample: TokenSample, cut: RenderedSample) -> str | None:
    """How a sample whose last turn was cut by the token limit verifies against that turn's
    whole rendering (``cut.full``), of which the target wrote a prefix: ``verified.cut`` when
    the served ids spell a prefix of it at least as long as the rendered cut, with loss on the
    same text (the ids show where the cut fell, right after ``</think>`` or inside the
    template's closing newlines, where the stored text cannot); ``verified.cut_trimmed`` when
    they spell that much and then text the stored turn lost (a parser that drops a tool call
    cut half-way): the sample is trimmed in place to the served ids the rendering vouches for.
    None: mismatched."""
    assert cut.full is not None
    ids, mask = sample.ids, sample.mask
    text = ctx.decode(ids)
    keep = len(ids)
    if not cut.full.startswith(text):  # the longest run of served ids the rendering spells
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cut.full.startswith(ctx.decode(ids[:mid])):
                lo = mid
            else:
                hi = mid - 1
        keep = lo
        text = ctx.decode(ids[:keep])
    if len(text) < len(cut.text) or not cut.text or not cut.full.startswith(cut.text):
        return None
    upto = len(text)
    spans = [s for s in cut.spans if s[1] <= cut.cut_from]
    spans += [(a, min(b, upto)) for a, b in cut.full_spans if a < upto]
    ((want, want_mask),) = encode_rendered(ctx, [RenderedSample(cut.id, text, spans)])
    if not verdict(ctx, ids[:keep], mask[:keep], want, want_mask):
        return None
    if keep == len(ids):
        return "verified.cut"
    sample.ids, sample.mask = ids[:keep], mask[:keep]
    return "verified.cut_trimmed"


THINK_MARKERS = ("<think>", "</think>")


def _squash(text: str) -> str:
    # think markers, whitespace and U+FFFD aside: engines treat a marker inside an unclosed
    # answer differently (vLLM's qwen3 parser drops every <think> of the reasoning, SGLang's
    # keeps them), parsers strip newlines around the reasoning, and a server's incremental
    # detokenizer shows a byte token that is not valid UTF-8 (a random or a cut answer)
    # differently from a whole decode, or not at all
    for marker in (*THINK_MARKERS, "\ufffd"):
        text = text.replace(marker, "")
    return "".join(text.split())


def _served_text(ctx: TokenizeContext, out: IdArray) -> str:
    """Output ids as the server's detokenizer shows them: end tokens and special tokens left
    out (a random model may write <|im_start|> mid-answer; the stored text does not have it)."""
    ends = ctx.end_ids | ({ctx.eot_id} if ctx.eot_id is not None else set())
    n = len(out)
    while n and int(out[n - 1]) in ends:
        n -= 1
    return str(ctx.backend.decode([int(i) for i in out[:n]], skip_special_tokens=True))


def unrenderable_split(text: str) -> bool:
    """Whether an answer's think block is one the template cannot render back: no
    ``</think>`` (cut while thinking, never closed: all reasoning for the parser), or no
    leading ``<think>`` (the template's generation prompt opened it). A well-formed
    ``<think>...</think>`` answer renders back, and is checked against the rendering only."""
    return THINK_MARKERS[1] not in text or not text.lstrip().startswith(THINK_MARKERS[0])


def output_spells(ctx: TokenizeContext, out: IdArray, turn: TurnText) -> bool:
    """Whether served output ids decode to what the turn stored: its reasoning, then its content
    (then its tool calls' names), think markers, special tokens, whitespace and undecodable
    bytes aside. Text after the content is allowed only where a stop string ended the turn
    (servers leave its text out and keep its token)."""
    body = _squash(_served_text(ctx, out))
    reasoning, content = _squash(turn.reasoning or ""), _squash(turn.content or "")
    if not body.startswith(reasoning + content):
        return False
    rest = body[len(reasoning) + len(content) :]
    if turn.tool_calls:
        names = [str((c.get("function") or c).get("name", "")) for c in turn.tool_calls]
        return all(_squash(name) in rest for name in names)
    return not rest or turn.finish_reason == "stop"


def decodes_as_stored(ctx: TokenizeContext, view: CompletionView, turns: tuple[int, ...]) -> bool:
    """Whether the served ids of ``turns`` are the stored conversation in our tokenizer, each
    turn an answer whose think block the template cannot render back (``unrenderable_split``):
    its prompt ids decode to the template's rendering of the context it was sent, and its output
    ids spell its stored text (``output_spells``)."""
    pairs = view.token_ids
    ctxs = contexts(view, ctx.keep_reasoning_history)
    if pairs is None or not ctxs or not turns:
        return False
    for k in turns:
        if k >= len(pairs) or k >= len(ctxs):
            return False
        try:
            prompt, _ = ctx.template.render(
                ctxs[k], view.tools, view.template_kwargs, add_generation_prompt=True
            )
        except InputError:
            return False
        out = pairs[k][1]
        if not unrenderable_split(_served_text(ctx, out)):
            return False  # a well-formed think block: the rendering decides
        if ctx.decode(pairs[k][0]) != prompt or not output_spells(ctx, out, view.turns[k]):
            return False
    return True


def _unclosed(ctx: TokenizeContext, view: CompletionView, turns: tuple[int, ...]) -> bool:
    """Whether one of ``turns`` is reasoning whose served output has no ``</think>``."""
    pairs = view.token_ids or []
    return any(
        view.turns[k].reasoning and THINK_MARKERS[1] not in ctx.decode(pairs[k][1])
        for k in turns
        if k < len(pairs)
    )


def _verify(
    ctx: TokenizeContext,
    view: CompletionView,
    plan: Plan,
    rendered: list[tuple[RenderedSample, IdArray, npt.NDArray[np.int8]]],
    counters: Counters,
    *,
    check_dropped_unfinished: bool,
) -> set[str]:
    """Count each token-id sample's verdict; returns the ids of the mismatched ones."""
    if not rendered or check_dropped_unfinished:
        counters.add("unverifiable", len(plan.tokens))
        return set()
    by_id = {r.id: (ids, mask) for r, ids, mask in rendered}
    cut_of = {r.id: r for r, _, _ in rendered if r.full is not None}
    failed: set[str] = set()
    for t in plan.tokens:
        got = by_id.get(t.id)
        found = verdict(ctx, t.ids, t.mask, *got) if got is not None else None
        if found is None and (cut := cut_of.get(t.id)) is not None:
            found = cut_verdict(ctx, t, cut)
        if found is None and decodes_as_stored(ctx, view, t.turns):
            found = "verified.decoded"  # a reasoning split the template cannot render back
            if _unclosed(ctx, view, t.turns):
                counters.add("reasoning.unclosed")
        if found is not None:
            counters.add("verified")
            if found != "verified":
                counters.add(found)
            continue
        counters.add("mismatched")
        failed.add(t.id)
        if len(counters.mismatches) < MAX_MISMATCH_EXAMPLES:
            if got is None:
                line = f"{t.id}: the rendered conversation splits into other samples"
            elif np.array_equal(got[0], t.ids):
                line = f"{t.id}: same ids, loss masks differ"
            else:
                line = describe_mismatch(ctx, t.id, t.ids, got[0])
            counters.mismatches.append(line)
    return failed


# -- the batch function ----------------------------------------------------------------------------


def thinking_off_tail(template: ChatTemplate) -> str:
    """What ``enable_thinking: false`` adds after the template's generation prompt (Qwen3:
    ``<think>\\n\\n</think>\\n\\n``); "" when the switch changes nothing at the end."""
    if "enable_thinking" not in template.source:
        return ""
    probe = [{"role": "user", "content": "x"}]
    try:
        default, _ = template.render(probe, None, {}, add_generation_prompt=True)
        off, _ = template.render(
            probe, None, {"enable_thinking": False}, add_generation_prompt=True
        )
    except InputError:
        return ""
    tail = off[len(default) :] if off.startswith(default) else ""
    return "" if not tail or default.endswith(tail) else tail


def _served_thinking_off(ctx: TokenizeContext, view: CompletionView) -> bool:
    """Whether a completion whose requests left the thinking mode to the server (no
    ``enable_thinking``) was served with thinking off: its first served prompt ends with what
    thinking-off adds after the generation prompt (``generate/answers/thinking.py``). Only the last
    few prompt tokens are decoded."""
    tail = ctx.thinking_off_tail
    if not tail or view.token_ids is None or "enable_thinking" in view.template_kwargs:
        return False
    prompt = view.token_ids[0][0]
    return ctx.decode(prompt[-(ctx.thinking_off_tail_tokens + 2) :]).endswith(tail)


def _thinking_known(ctx: TokenizeContext, view: CompletionView, counters: Counters) -> bool:
    """Set the thinking mode of a rendered served answer whose request left it to the server
    (``thinking.py``); False (counted as a drop) when it is not known."""
    if view.token_ids is not None or not ctx.thinking_switch or not left_to_server(view):
        return True
    ctxs = contexts(view, ctx.keep_reasoning_history)
    if ctxs is None:
        return True  # turns that do not fit the prompt: the plan drops it for that
    counted = counted_modes(view, ctxs, ctx.template, ctx.prompt_lengths)
    found = decide(view, counted, ctx.server_thinking)
    if isinstance(found, str):
        counters.add(f"dropped.thinking_{found}")
        return False
    mode, source = found
    view.template_kwargs = {**view.template_kwargs, "enable_thinking": mode}
    counters.add(f"thinking.{source}")
    return True


def _has_loss_run(mask: npt.NDArray[np.int8]) -> bool:
    if len(mask) < MIN_LOSS_RUN:
        return False
    return bool(np.any(mask[1:] & mask[:-1]))


def tokenize_views(views: list[CompletionView], ctx: TokenizeContext) -> tuple[pa.Table, Counters]:
    """``tokenize_table`` on already decoded completions."""
    counters = Counters()
    plans: list[tuple[CompletionView, Plan, Plan | None]] = []
    to_encode: list[RenderedSample] = []
    for view in views:
        counters.add("completions")
        if _served_thinking_off(ctx, view):
            view.template_kwargs = {**view.template_kwargs, "enable_thinking": False}
            counters.add("thinking_off_from_served_ids")
        if not _thinking_known(ctx, view, counters):
            continue
        if view.token_ids is not None:
            counters.add("path.token_ids")
            tokens = plan_token_ids(
                view,
                eot_id=ctx.eot_id,
                suffix=ctx.suffix_ids,
                end_ids=ctx.end_ids,
                per_turn=ctx.per_turn,
            )
            check = (
                plan_rendered(
                    view,
                    ctx.template,
                    keep_reasoning_history=ctx.keep_reasoning_history,
                    breaks=frozenset(k for k, ok in enumerate(tokens.links) if not ok),
                    per_turn=ctx.per_turn,
                    checking=True,
                )
                if ctx.verify
                else None
            )
            plans.append((view, tokens, check))
            if check is not None:
                to_encode.extend(check.rendered)
        else:
            counters.add("path.rendered")
            rendered = plan_rendered(
                view,
                ctx.template,
                keep_reasoning_history=ctx.keep_reasoning_history,
                per_turn=ctx.per_turn,
            )
            plans.append((view, rendered, None))
            to_encode.extend(rendered.rendered)
    encoded = iter(encode_rendered(ctx, to_encode))

    out_ids: list[IdArray] = []
    out_masks: list[npt.NDArray[np.int8]] = []
    rows: list[tuple[str, str, str, bool]] = []  # (id, source, domain, truncated)
    for view, plan, check in plans:
        for reason in plan.dropped:
            counters.add(f"dropped.{reason}")
        for note in plan.notes:
            counters.add(note)
        if plan.split:
            counters.add("split_turns")
        candidates: list[tuple[str, IdArray, npt.NDArray[np.int8]]]
        if view.token_ids is not None:
            failed: set[str] = set()
            if check is not None:
                checked = [(r, *next(encoded)) for r in check.rendered]
                failed = _verify(
                    ctx,
                    view,
                    plan,
                    checked,
                    counters,
                    check_dropped_unfinished="unfinished_turn" in check.dropped,
                )
                if failed:  # never written with ids that do not verify (module docstring)
                    counters.add("dropped.unverified_ids", len(failed))
            candidates = [(t.id, t.ids, t.mask) for t in plan.tokens if t.id not in failed]
        else:
            candidates = [(r.id, *next(encoded)) for r in plan.rendered]
        for sample_id, ids, mask in candidates:
            truncated = False
            if ctx.max_length is not None and len(ids) > ctx.max_length:
                if ctx.long == "drop":
                    counters.add("dropped.too_long")
                    continue
                ids, mask = ids[: ctx.max_length], mask[: ctx.max_length]
                truncated = True
            if not _has_loss_run(mask):
                counters.add("dropped.too_few_loss_tokens")
                continue
            if truncated:
                counters.add("truncated")
            counters.add("samples")
            out_ids.append(ids)
            out_masks.append(mask)
            rows.append((sample_id, view.source, view.domain, truncated))
            counters.add_sample(view.domain, len(ids), int(mask.sum()))
    return samples_table(rows, out_ids, out_masks), counters


def tokenize_table(table: pa.Table, ctx: TokenizeContext) -> tuple[pa.Table, Counters]:
    """A completions table -> (samples table with ``formats.SAMPLE_SCHEMA``, its Counters).

    Pure: no I/O. Rows keep the input order; a completion becomes zero, one or (history-
    rewriting templates, multi-turn) several samples. See the module docstring for the rules.
    """
    return tokenize_views(views_from_table(table), ctx)
