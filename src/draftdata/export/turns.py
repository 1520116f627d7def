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
  the ones ``draftdata tokenize`` trains for that turn.

A turn cut by the token limit (finish ``length``) has no ``specforge`` row: a conversation row
can only say the turn ended, and the trainer would train an end-of-turn token the target never
wrote (counted as ``export.cut_turns_skipped``); the token formats keep it, cut where the target
stopped. This module builds rows in memory for one batch; ``export.py`` writes them.
"""

from __future__ import annotations

from typing import Any

from draftdata.conversation import expand, message_dict
from draftdata.metrics import StageStats
from draftdata.records import Completion, JsonDict, sample_key
from draftdata.trainer_rows import (
    clean_message,
    per_turn_id,
    specforge_row,
    speculators_row,
    text_row,
)


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
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.fmt = fmt
        self.include_reasoning = include_reasoning
        self.keep_reasoning_history = keep_reasoning_history
        self.ctx: Any = None
        if fmt in ("specforge-text", "speculators"):
            from draftdata.errors import ConfigError
            from draftdata.tokenize.batch import TokenizeContext
            from draftdata.tokenize.template import read_template_file

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
                template_kwargs=template_kwargs,  # the servers' defaults the run recorded
                per_turn=True,
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
            if tc.turn.finish_reason == "length":
                stats.add("export.cut_turns_skipped")
                continue
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
        from draftdata.tokenize.batch import tokenize_views
        from draftdata.tokenize.plan import view_from_record

        table, counters = tokenize_views([view_from_record(c) for c in batch], self.ctx)
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
        for c in batch:
            base = sample_key(c.id, c.sample)
            for tc in expand(c, keep_reasoning=self.keep_reasoning_history):
                rid = per_turn_id(base, tc.index, len(c.turns))
                got = samples.get(rid)
                if got is None:  # dropped by tokenize (counted above)
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
