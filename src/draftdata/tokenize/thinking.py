"""The thinking mode a served answer was written in, where its request left it to the server.

A run generated with ``reasoning: server`` sent no ``enable_thinking``: each server applied its
own default, and servers differ (two endpoints, a server restarted with other kwargs between a
run and its resume). An answer rendered in the wrong mode trains on a form the target never
wrote: a thinking-off prompt's empty ``<think>\\n\\n</think>\\n\\n`` put under loss, or a
thinking-on answer's think block moved into the prompt. Served token ids tell the mode
themselves (``encode._served_thinking_off``); for a rendered answer ``decide`` looks at the
evidence the run holds, per answer:

- the prompt tokens the server counted for each turn (``usage.prompt_tokens``) against the
  rendering of that turn's context in each mode: one match is the mode;
- the mode generate recorded with the answer (``Completion.server_thinking``, known when its
  endpoint's mode was probed and did not change while it answered:
  ``generate/answers/thinking.py``);
- else the mode the user states (``tokenize --server-thinking``).

Two pieces of evidence that disagree (turns counted in different modes, or counted in another
mode than recorded) are ``conflict``; no evidence at all is ``unknown``: both are dropped and
counted, never rendered on a guess. This module decides; ``encode.py`` renders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from draftdata.errors import InputError
from draftdata.tokenize.plan import CompletionView
from draftdata.tokenize.template import ChatTemplate, JsonDict

Source = Literal["prompt_tokens", "recorded", "stated"]
Encode = Callable[[list[str]], list[int]]  # texts -> their token counts, as a prompt encodes
Drop = Literal["conflict", "unknown"]


def switch_matters(template: ChatTemplate) -> bool:
    """Whether ``enable_thinking`` changes the template's generation prompt at all."""
    if "enable_thinking" not in template.source:
        return False
    probe = [{"role": "user", "content": "x"}]
    try:
        on, _ = template.render(probe, None, {"enable_thinking": True}, add_generation_prompt=True)
        off, _ = template.render(
            probe, None, {"enable_thinking": False}, add_generation_prompt=True
        )
    except InputError:
        return False
    return on != off


def left_to_server(view: CompletionView) -> bool:
    """Whether ``view`` is a served answer whose request left the thinking mode to the server."""
    return view.served and "enable_thinking" not in view.template_kwargs


def counted_modes(
    view: CompletionView, ctxs: list[list[JsonDict]], template: ChatTemplate, encode: Encode
) -> list[bool | None]:
    """Per turn, the mode whose rendering of the turn's context (``ctxs``: ``plan.contexts``)
    has exactly the prompt tokens the server counted (None: no count, or both or neither
    rendering match)."""
    counts = view.prompt_tokens
    if not ctxs or not counts:
        return []
    texts: list[str] = []
    asked: list[int] = []
    for k, (ctx, count) in enumerate(zip(ctxs, counts, strict=False)):
        if count <= 0:
            continue
        try:
            for mode in (True, False):
                texts.append(
                    template.render(
                        ctx,
                        view.tools,
                        {**view.template_kwargs, "enable_thinking": mode},
                        add_generation_prompt=True,
                    )[0]
                )
        except InputError:
            return []
        asked.append(k)
    out: list[bool | None] = [None] * len(ctxs)
    lengths = encode(texts) if texts else []
    for i, k in enumerate(asked):
        on, off = lengths[2 * i], lengths[2 * i + 1]
        count = counts[k]
        if on != off and count in (on, off):
            out[k] = count == on
    return out


def decide(
    view: CompletionView,
    counted: list[bool | None],
    stated: bool | None,
) -> tuple[bool, Source] | Drop:
    """The mode to render ``view`` in and where it came from, or why it is dropped (module
    docstring). ``counted``: ``counted_modes``; ``stated``: the user's ``--server-thinking``."""
    seen = {m for m in counted if m is not None}
    if len(seen) > 1:
        return "conflict"  # turns written in both modes: no one rendering is the target's
    recorded = view.server_thinking
    if seen:
        mode = seen.pop()
        if recorded is not None and recorded != mode:
            return "conflict"
        return mode, "prompt_tokens"
    if recorded is not None:
        return recorded, "recorded"
    if stated is not None:
        return stated, "stated"
    return "unknown"
