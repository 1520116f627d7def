"""The target's tokenizer and chat template, and rendering with the spans of assistant output.

``load_tokenizer(path)`` opens a Hugging Face tokenizer folder (``AutoTokenizer``, fast tokenizers
only: the stage needs character offsets). ``ChatTemplate`` renders a conversation exactly the way
``tokenizer.apply_chat_template`` does (same Jinja environment, same ``None`` dropping, the
tokenizer's special tokens as template variables), and, when the template has ``{% generation %}``
markers, also returns the character spans of the generation blocks (what transformers'
``return_assistant_tokens_mask`` is computed from).

The conversation the target saw for each turn comes from ``draftdata.shared.conversation`` (the one
rule generate sends requests by); ``TurnText`` is the turn shape that rule takes here.

This module renders text; it does not encode (``plan.py`` and ``encode.py`` do).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdata.errors import ConfigError, InputError
from draftdata.shared.tokenizer_folder import check_tokenizer_folder, first_line

JsonDict = dict[str, Any]
Span = tuple[int, int]  # [start, end) character offsets into a rendered text

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def load_tokenizer(path: str) -> Any:
    """The fast Hugging Face tokenizer in folder ``path`` (ConfigError if there is none)."""
    check_tokenizer_folder(path)
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad folder
        raise ConfigError(
            f"--tokenizer {path}: cannot load a Hugging Face tokenizer there ({first_line(exc)})"
        ) from exc
    if getattr(tok, "backend_tokenizer", None) is None:
        raise ConfigError(
            f"--tokenizer {path}: not a fast tokenizer (tokenizer.json); offsets are needed"
        )
    return tok


def read_template_file(path: str) -> str:
    """The text of a ``--chat-template`` file (a Jinja template, or a tokenizer_config.json)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--chat-template {path}: cannot read ({exc.strerror})") from exc
    if path.endswith(".json"):
        try:
            value = json.loads(text).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise ConfigError(f"--chat-template {path}: not a tokenizer_config.json") from exc
        if not isinstance(value, str):
            raise ConfigError(f"--chat-template {path}: no single chat_template string in it")
        return value
    return text


class ChatTemplate:
    """A chat template bound to a tokenizer's special tokens; renders like apply_chat_template."""

    def __init__(self, source: str, special_tokens: dict[str, Any], eot: str) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.source = source
        self.has_generation_markers = bool(_GENERATION_TAG.search(source))
        self.special_tokens = dict(special_tokens)
        self.eot = eot  # the end-of-turn text the target writes last (e.g. <|im_end|>)
        try:
            self._compiled = _compile_jinja_template(source)
        except Exception as exc:  # jinja2 syntax errors and the like
            raise ConfigError(f"chat template does not compile: {exc}") from exc

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, source: str | None = None) -> ChatTemplate:
        """The template of ``tokenizer`` (or ``source`` overriding it) with its special tokens."""
        text = source if source is not None else getattr(tokenizer, "chat_template", None)
        if isinstance(text, dict):  # several named templates: the default one
            text = text.get("default")
        if not isinstance(text, str) or not text:
            raise ConfigError(
                "the tokenizer has no chat_template; give one with --chat-template FILE"
            )
        eot = _end_of_turn(tokenizer, text)
        return cls(text, dict(tokenizer.special_tokens_map), eot)

    def render(
        self,
        messages: list[JsonDict],
        tools: list[JsonDict] | None,
        kwargs: JsonDict,
        *,
        add_generation_prompt: bool,
        track: bool = False,
    ) -> tuple[str, list[Span]]:
        """Render ``messages`` (+ ``tools``); with ``track``, also the generation-block spans.

        Mirrors ``apply_chat_template(tokenize=False)``: keys whose value is None are dropped
        from messages, reasoning is offered under its aliases, and the tokenizer's special
        tokens are template variables that ``kwargs`` may override.
        """
        from transformers.utils import chat_template_utils

        render_jinja_template: Any = chat_template_utils.render_jinja_template
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        template_kwargs = {**self.special_tokens, **kwargs}
        try:
            rendered, indices = render_jinja_template(
                conversations=[chat],
                tools=tools or None,
                chat_template=self.source,
                return_assistant_tokens_mask=track and self.has_generation_markers,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
        except Exception as exc:  # the template's own raise_exception and Jinja errors
            raise InputError(f"chat template failed on a conversation: {exc}") from exc
        spans = [(int(s), int(e)) for s, e in indices[0]] if indices else []
        return str(rendered[0]), spans

    def turn_suffix(self) -> str:
        """What the template writes after a final assistant turn's end-of-turn token (``\\n``
        in Qwen3): context, not target output, appended to token-id samples so both paths
        give the same sample as apply_chat_template."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        try:
            text, _ = self.render(probe, None, {}, add_generation_prompt=False)
        except InputError:
            return ""
        at = text.rfind(self.eot)
        return text[at + len(self.eot) :] if at >= 0 else ""


def _end_of_turn(tokenizer: Any, template: str) -> str:
    # The template's turn terminator is what the target writes last; prefer <|im_end|> when the
    # template uses it (Qwen base tokenizers name <|endoftext|> as eos), else the tokenizer's eos.
    for candidate in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"):
        if candidate in template and candidate in tokenizer.get_vocab():
            return candidate
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos:
        return eos
    raise ConfigError("cannot tell the chat template's end-of-turn token; the tokenizer has no eos")


# -- a generated turn ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnText:
    """One regenerated assistant turn as the target wrote it (text fields only)."""

    content: str | None
    reasoning: str | None
    tool_calls: list[JsonDict] | None
    finish_reason: str | None
