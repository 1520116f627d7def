"""Per-turn export rows: one row per generated turn, the history as the target saw it first.

A trainer that renders a whole multi-turn conversation with a template that rewrites history
(Qwen3 drops the reasoning of turns before the last user query) trains answers in a form the
target never wrote. One row per generated turn, trained on its last turn only, avoids that for
every template (``trainer_rows`` describes the formats):

- ``specforge`` rows hold the messages the engine sent before the turn and the turn itself
  (``conversation.expand``, the one rule of what the target saw);
- ``specforge-text`` and ``speculators`` rows come from tokenize's per-turn samples
  (``TokenizeContext(per_turn=True)``): the served token ids where the server returned them,
  else the rendering with the target's chat template, so their tokens and loss mask are exactly
  the ones ``draftdata tokenize`` trains for that turn;
- ``modelopt`` rows hold the turn's context and the turn as messages (``export/modelopt.py``),
  each checked against that same sample with the chat template written beside the export, and
  left out (``export.left_out.<reason>``) when ModelOpt would train anything else.

A turn cut by the token limit (finish ``length``) has no ``specforge`` or ``modelopt`` row: a
conversation row can only say the turn ended, and the trainer would train an end-of-turn token
the target never wrote (counted as ``export.cut_turns_skipped``); the token formats keep it,
cut where the target stopped. ``specforge`` rows without a system message are counted
(``export.rows_without_system_message``): SpecForge's ``qwen3-thinking`` template gives them its
own default system prompt, a context the target never saw. This module builds rows in memory
for one batch; ``stage.py`` writes them.
"""

from __future__ import annotations

import json
from typing import Any

from draftdata.errors import ConfigError
from draftdata.export.modelopt import (
    fold_tools,
    generation_template,
    render_like_modelopt,
    with_kwargs,
)
from draftdata.records import Completion, JsonDict, sample_key
from draftdata.shared.conversation import expand, message_dict
from draftdata.shared.trainer_rows import (
    TOKENIZER_FORMATS,
    clean_message,
    modelopt_row,
    per_turn_id,
    specforge_row,
    speculators_row,
    text_row,
)
from draftdata.support.metrics import StageStats
from draftdata.tokenize.encode import TokenizeContext, tokenize_views
from draftdata.tokenize.plan import view_from_record
from draftdata.tokenize.template import read_template_file


class TurnRows:
    """Builds the per-turn rows of one format; loads the tokenizer once when it needs one."""

    def __init__(
        self,
        fmt: str,
        *,
        include_reasoning: bool = True,
        keep_reasoning_history: bool = False,
        tokenizer: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.fmt = fmt
        self.include_reasoning = include_reasoning
        self.keep_reasoning_history = keep_reasoning_history
        self.ctx: Any = None
        self.chat_template: str | None = None  # modelopt: the template written beside the rows
        if fmt in TOKENIZER_FORMATS:
            if not tokenizer:
                raise ConfigError(
                    f"--format {fmt}: give the target's tokenizer with --tokenizer DIR "
                    "(the rows hold its tokens or its chat template's text)"
                )
            template = read_template_file(chat_template) if chat_template else None
            self.ctx = TokenizeContext(
                tokenizer,
                chat_template=template,
                keep_reasoning_history=keep_reasoning_history,
                per_turn=True,
            )
            if fmt == "modelopt":
                self.chat_template = generation_template(
                    self.ctx.template.source, self.ctx.template.eot
                )

    def rows(self, batch: list[Completion], stats: StageStats) -> list[JsonDict]:
        """The rows of ``batch``, in its order, turn by turn."""
        if self.fmt == "specforge":
            return [r for c in batch for r in self._specforge(c, stats)]
        return self._tokenized(batch, stats)

    def _specforge(self, c: Completion, stats: StageStats) -> list[JsonDict]:
        base = sample_key(c.id, c.sample)
        out = []
        for tc in expand(c, keep_reasoning=self.keep_reasoning_history):
            stats.add("export.turns")
            if tc.turn.finish_reason == "length":
                stats.add("export.cut_turns_skipped")
                continue
            if not tc.context or tc.context[0].role != "system":
                stats.add("export.rows_without_system_message")
            out.append(
                specforge_row(
                    per_turn_id(base, tc.index, len(c.turns)),
                    [message_dict(m) for m in tc.context],
                    message_dict(tc.message),
                    source=c.source,
                    domain=c.domain,
                    tools=c.tools,
                    include_reasoning=self.include_reasoning,
                )
            )
        return out

    def _tokenized(self, batch: list[Completion], stats: StageStats) -> list[JsonDict]:

        views = [view_from_record(c) for c in batch]
        table, counters = tokenize_views(views, self.ctx)  # views get their effective kwargs
        for name, n in counters.counts.items():
            if name.startswith(("dropped.", "mismatched", "verified", "unverifiable")):
                stats.add(f"export.tokenize.{name}", n)
        samples = {
            sid: (ids, mask)
            for sid, ids, mask in zip(
                table.column("id").to_pylist(),
                table.column("input_ids").to_pylist(),
                table.column("loss_mask").to_pylist(),
                strict=True,
            )
        }
        out: list[JsonDict] = []
        for c, view in zip(batch, views, strict=True):
            base = sample_key(c.id, c.sample)
            for tc in expand(c, keep_reasoning=self.keep_reasoning_history):
                stats.add("export.turns")  # each turn ends in one row or one reason
                rid = per_turn_id(base, tc.index, len(c.turns))
                if self.fmt == "modelopt":
                    row = self._modelopt(c, tc, rid, samples.get(rid), view.template_kwargs, stats)
                    if row is not None:
                        out.append(row)
                    continue
                got = samples.get(rid)
                if got is None:  # dropped by tokenize (its reasons counted above)
                    stats.add("export.left_out.no_tokenize_sample")
                    continue
                ids, mask = got
                text = self.ctx.decode(ids)
                if self.fmt == "specforge-text":
                    out.append(text_row(rid, text, source=c.source, domain=c.domain))
                    continue
                conv = [clean_message(message_dict(m)) for m in [*tc.context, tc.message]]
                out.append(
                    speculators_row(
                        base,
                        tc.index,
                        input_ids=[int(i) for i in ids],
                        loss_mask=[int(x) for x in mask],
                        conversations=conv,
                        text=text,
                        metadata=_metadata(c, tc.index),
                        source=c.source,
                        domain=c.domain,
                    )
                )
        return out

    def _modelopt(
        self,
        c: Completion,
        tc: Any,
        rid: str,
        sample: tuple[list[int], list[int]] | None,
        kwargs: JsonDict,
        stats: StageStats,
    ) -> JsonDict | None:
        # The row of one turn, or None (left out and counted) when ModelOpt reading it with the
        # written template would not train exactly tokenize's sample of the turn.

        assert self.chat_template is not None  # built with the context for modelopt
        if tc.turn.finish_reason == "length":
            stats.add("export.cut_turns_skipped")
            return None
        if sample is None:  # dropped by tokenize (its reasons: export.tokenize.dropped.*)
            stats.add("export.left_out.no_tokenize_sample")
            return None
        msgs = [_arguments_as_text(message_dict(m)) for m in [*tc.context, tc.message]]
        msgs = [{k: v for k, v in m.items() if v is not None} for m in msgs]
        folded = fold_tools(self.ctx.template, msgs, c.tools, kwargs)
        if folded is None:
            stats.add("export.left_out.tools_not_in_system")
            return None
        row_msgs = with_kwargs(folded, kwargs)
        try:
            got = render_like_modelopt(self.ctx.tokenizer, self.chat_template, row_msgs)
        except Exception:  # the template's raise_exception, Jinja errors
            stats.add("export.left_out.template_error")
            return None
        if got != (list(sample[0]), list(sample[1])):
            stats.add("export.left_out.not_token_exact")
            return None
        return modelopt_row(rid, row_msgs, source=c.source, domain=c.domain, tools=c.tools)


def _arguments_as_text(m: JsonDict) -> JsonDict:
    # Tool-call arguments as the JSON text a template writes for an object (transformers'
    # tojson), so every row gives the column one Arrow type (a loader unifies objects across
    # rows and would add other calls' keys as nulls); the row check renders this form.
    calls = m.get("tool_calls")
    if not calls:
        return m

    fixed = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
            args = json.dumps(fn.get("arguments"), ensure_ascii=False)
            call = {**call, "function": {**fn, "arguments": args}}
        fixed.append(call)
    return {**m, "tool_calls": fixed}


def _metadata(c: Completion, k: int) -> JsonDict:
    t = c.turns[k]
    usage = t.usage
    return {
        "turn": k,
        "finish_reason": t.finish_reason,
        "is_tool_call": bool(t.tool_calls),
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
        "endpoint": c.endpoint,
        "model": c.model,
        "sampling_params": dict(c.sampling),
    }
