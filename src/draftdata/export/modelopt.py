"""TensorRT Model Optimizer rows: one per generated turn, in the target's exact context.

ModelOpt's online reader (``modelopt.torch.utils.plugins.transformers_dataset``:
``ShardedDataset`` + ``LanguageDataCollator``) renders each row's ``messages`` WHOLE with the
tokenizer's chat template, passes no ``tools`` and no template kwargs, and with
``answer_only_loss`` trains the characters inside the template's ``{% generation %}`` blocks
(transformers' ``return_assistant_tokens_mask``). Three things make it train exactly what
``draftdata tokenize`` trains, in exactly the context the target saw:

- **One row per generated turn** (the history as the target saw it, then that turn), as for
  SpecForge: a template that rewrites history (Qwen3 drops earlier turns' reasoning) would
  otherwise show earlier answers in a form the target never wrote.
- **The tools in the system message.** The template is rendered without ``tools``, so the
  tools block the target saw is written into the row's system message: the text the target's
  template puts between the system turn's start and end when it renders the tools
  (``fold_tools``, derived by rendering, not by knowing the template's layout).
- **A chat template with generation tags** (``generation_template``): the target's own
  template, unchanged, as a macro, and a driver that renders a row as the target's template
  renders the turn's context with the generation prompt, then the turn (inside
  ``{% generation %}`` up to and including the end-of-turn token), then what the template
  writes after it. The last message's ``chat_template_kwargs`` (the request's template
  kwargs, e.g. ``enable_thinking: false``) reach the target's template, since ModelOpt passes
  none. Only the last message is trained: earlier assistant messages are context.

Every row is checked before it is written: transformers' ``apply_chat_template`` with that
template and ``return_assistant_tokens_mask`` (what ModelOpt calls) must give exactly the ids
and loss mask of tokenize's sample for the turn; a row that does not is left out and counted
(``export.left_out.<reason>``), as are turns cut by the token limit (a conversation row can only
say a turn ended, so the end-of-turn token the target never wrote would be trained).
"""

from __future__ import annotations

import json
import re
from typing import Any

from draftdata.errors import InputError
from draftdata.records import JsonDict
from draftdata.tokenize.template import ChatTemplate

_TAG = re.compile(r"\{%-?\s*(?:generation|endgeneration)\s*-?%\}")
_MACRO = "draftdata_target"
# Names the target's template may read that are not template kwargs: the driver's own
# arguments, Jinja's and transformers' globals.
_NOT_KWARGS = frozenset(
    {
        "messages",
        "add_generation_prompt",
        "raise_exception",
        "strftime_now",
        "range",
        "dict",
        "lipsum",
        "cycler",
        "joiner",
        "namespace",
        "true",
        "false",
        "none",
        "True",
        "False",
        "None",
        "loop",
    }
)
KWARGS_KEY = "chat_template_kwargs"  # on a row's last message: the request's template kwargs
_SENTINEL = "\x00draftdata-system\x00"


def template_variables(source: str) -> list[str]:
    """The names ``source`` reads from outside (template kwargs, tools, special tokens)."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    ast = env.parse(_TAG.sub("", source))
    return sorted(meta.find_undeclared_variables(ast) - _NOT_KWARGS)


def generation_template(source: str, eot: str) -> str:
    """The target's template ``source`` with the last assistant message's output in
    ``{% generation %}`` tags (module docstring); renders every other input as ``source``.

    The source is kept byte for byte inside a macro (any generation tags it had are dropped:
    only the driver's one block marks the trained output)."""
    names = template_variables(source)
    params = ", ".join(["messages", "add_generation_prompt", *names])

    def call(messages: str, gen: str) -> str:
        args = [messages, gen]
        args += [f"(kw.{n} if kw.{n} is defined and kw.{n} is not none else {n})" for n in names]
        return f"{_MACRO}({', '.join(args)})"

    body = _TAG.sub("", source)
    eot_lit = _literal(eot)
    gen = "(add_generation_prompt is defined and add_generation_prompt)"
    return (
        "{#- draftdata: the target's chat template (the macro below, unchanged) with the output "
        "of the last assistant message in generation tags, for answer_only_loss; the last "
        f"message's {KWARGS_KEY} are the template kwargs of its request. -#}}\n"
        f"{{% macro {_MACRO}({params}) %}}{body}{{% endmacro %}}"
        "{%- set kw = {} -%}"
        "{%- if messages and messages[-1].role == 'assistant' "
        f"and messages[-1].{KWARGS_KEY} is mapping -%}}"
        f"{{%- set kw = messages[-1].{KWARGS_KEY} -%}}"
        "{%- endif -%}"
        f"{{%- if messages and messages[-1].role == 'assistant' and not {gen} -%}}"
        f"{{%- set dd_head = {call('messages[:-1]', 'true')} -%}}"
        f"{{%- set dd_whole = {call('messages', 'false')} -%}}"
        "{%- if dd_whole[:dd_head|length] != dd_head -%}"
        "{{- raise_exception('draftdata: the turn does not follow its generation prompt') -}}"
        "{%- endif -%}"
        "{%- set dd_rest = dd_whole[dd_head|length:] -%}"
        f"{{%- set dd_end = dd_rest.find({eot_lit}) -%}}"
        "{%- if dd_end < 0 -%}"
        "{{- raise_exception('draftdata: the turn has no end-of-turn token') -}}"
        "{%- endif -%}"
        f"{{%- set dd_end = dd_end + {len(eot)} -%}}"
        "{{- dd_head -}}{% generation %}{{- dd_rest[:dd_end] -}}{% endgeneration %}"
        "{{- dd_rest[dd_end:] -}}"
        "{%- else -%}"
        f"{{{{- {call('messages', gen)} -}}}}"
        "{%- endif -%}"
    )


def _literal(text: str) -> str:

    return json.dumps(text)  # a JSON string is a Jinja string literal


def fold_tools(
    template: ChatTemplate,
    messages: list[JsonDict],
    tools: list[JsonDict] | None,
    kwargs: JsonDict,
) -> list[JsonDict] | None:
    """``messages`` with ``tools`` written into the system message (added when there is none)
    so that rendering them WITHOUT tools gives exactly the text the target's template renders
    with them; ``messages`` unchanged when there are no tools; None when no system message
    can carry them (the template puts the tools elsewhere)."""
    if not tools:
        return messages
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    try:
        want, _ = template.render(messages, tools, kwargs, add_generation_prompt=False)
        probe, _ = template.render(
            [{"role": "system", "content": _SENTINEL}, *rest], None, kwargs,
            add_generation_prompt=False,
        )  # fmt: skip
    except InputError:
        return None
    if probe.count(_SENTINEL) != 1:
        return None
    before, after = probe.split(_SENTINEL)
    if not (want.startswith(before) and want.endswith(after)):
        return None
    if len(want) < len(before) + len(after):
        return None
    system = want[len(before) : len(want) - len(after)]
    folded = [{"role": "system", "content": system}, *rest]
    try:
        got, _ = template.render(folded, None, kwargs, add_generation_prompt=False)
    except InputError:
        return None
    return folded if got == want else None


def with_kwargs(messages: list[JsonDict], kwargs: JsonDict) -> list[JsonDict]:
    """The row's messages with the request's template kwargs on the last (trained) one."""
    if not kwargs:
        return messages
    return [*messages[:-1], {**messages[-1], KWARGS_KEY: dict(kwargs)}]


def render_like_modelopt(tokenizer: Any, template: str, messages: list[JsonDict]) -> Any:
    """(input_ids, assistant mask) as ModelOpt's ``LanguageDataCollator`` computes them with
    ``answer_only_loss`` (``apply_chat_template`` with ``return_assistant_tokens_mask``)."""
    out = tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=False,
        return_assistant_tokens_mask=True,
    )
    return list(out["input_ids"]), list(out["assistant_masks"])
