"""Token accounting for the simulator: an approximate tokenizer, or a real Hugging Face one.

Both render a conversation the way a Qwen3-style chat template does and split text into tokens
with character offsets, so the server can cap an answer at ``max_tokens``, stream it in token
chunks and return token ids:

- ``ApproxTokenizer`` (no ``--tokenizer``): one token per word (with its leading space), per
  newline and per special marker (``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``,
  ``<|im_start|>``, ``<|im_end|>``, which get Qwen3's real ids); other ids are a stable hash of
  the piece. Counts are approximate, ids are synthetic but deterministic.
- ``HFTokenizer`` (``--tokenizer DIR``): ``transformers.AutoTokenizer`` and its chat template.
  Prompt ids are the template's rendering of messages + tools + ``add_generation_prompt`` +
  ``chat_template_kwargs``; an answer's text is exactly what the template renders for that
  assistant turn after the generation prompt (``render_completion``), so prompt ids + output
  ids can be verified token-exactly against the same tokenizer downstream.

It does not decide what an answer says (``answers.py``) or how it is parsed.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any, Protocol

from draftdata.errors import ConfigError
from draftdata.shared.tokenizer_folder import check_tokenizer_folder, first_line

# Qwen3's ids for its special markers, so synthetic ids look like the real ones.
SPECIAL_IDS = {
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<think>": 151667,
    "</think>": 151668,
}
EOS_TEXT = "<|im_end|>"
_PIECE = re.compile(r"<\|im_(?:start|end)\|>|</?think>|</?tool_call>|\n| ?[^\s<]+|<|\s")
_VOCAB = 151_000


def text_of(content: Any) -> str:
    """The text of a message ``content`` (a string, None, or a list of OpenAI content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


class Tokenizer(Protocol):
    """What the server needs from a tokenizer."""

    eos_id: int

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> str:
        """The prompt text with the generation prompt appended."""
        ...

    def render_completion(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        prompt: str,
        answer: dict[str, Any],
    ) -> str:
        """The text the model generates for assistant message ``answer`` (without EOS)."""
        ...

    def encode(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids of ``text`` and, per token, the character offset where it ends."""
        ...


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    name = json.dumps(fn.get("name", ""), ensure_ascii=False)
    return f'<tool_call>\n{{"name": {name}, "arguments": {args_text}}}\n</tool_call>'


def manual_completion(answer: dict[str, Any], think_block: bool) -> str:
    """Qwen3-style text of an assistant turn: ``<think>\\n{r}\\n</think>\\n\\n{content}{calls}``."""
    content = answer.get("content") or ""
    out = ""
    if think_block:
        out = f"<think>\n{answer.get('reasoning_content') or ''}\n</think>\n\n"
    out += content
    for i, call in enumerate(answer.get("tool_calls") or []):
        if i > 0 or content:
            out += "\n"
        out += _tool_call_text(call)
    return out


class ApproxTokenizer:
    """One token per word / newline / special marker; deterministic synthetic ids."""

    eos_id = SPECIAL_IDS[EOS_TEXT]

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> str:
        """A Qwen3-like rendering (only its length and ids matter without a real tokenizer)."""
        out: list[str] = []
        if tools:
            specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            out.append(f"<|im_start|>system\n# Tools\n<tools>\n{specs}\n</tools><|im_end|>\n")
        for m in messages:
            body = text_of(m.get("content"))
            for call in m.get("tool_calls") or []:
                if isinstance(call, dict):
                    body += "\n" + _tool_call_text(call)
            out.append(f"<|im_start|>{m.get('role', 'user')}\n{body}<|im_end|>\n")
        out.append("<|im_start|>assistant\n")
        if kwargs.get("enable_thinking") is False:
            out.append("<think>\n\n</think>\n\n")
        return "".join(out)

    def render_completion(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        prompt: str,
        answer: dict[str, Any],
    ) -> str:
        """The manual Qwen3 rendering; a think block only when the answer reasons."""
        return manual_completion(answer, answer.get("reasoning_content") is not None)

    def encode(self, text: str) -> tuple[list[int], list[int]]:
        """Split into pieces; ids are Qwen3's for markers, else a crc32 of the piece."""
        ids: list[int] = []
        ends: list[int] = []
        for m in _PIECE.finditer(text):
            piece = m.group(0)
            special = SPECIAL_IDS.get(piece)
            ids.append(special if special is not None else zlib.crc32(piece.encode()) % _VOCAB)
            ends.append(m.end())
        return ids, ends


class HFTokenizer:
    """A Hugging Face tokenizer folder with a chat template (Qwen3-style expected)."""

    def __init__(self, path: str) -> None:

        check_tokenizer_folder(path)
        try:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # transformers raises many types for a bad folder
            raise ConfigError(
                f"--tokenizer {path}: cannot load a Hugging Face tokenizer there "
                f"({first_line(exc)})"
            ) from exc
        if not getattr(self._tok, "chat_template", None):
            raise ConfigError(f"--tokenizer {path}: the tokenizer has no chat_template")
        eos = self._tok.convert_tokens_to_ids(EOS_TEXT)
        if not isinstance(eos, int) or eos == self._tok.unk_token_id:
            eos = self._tok.eos_token_id
        self.eos_id = int(eos)

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> str:
        text = self._tok.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **kwargs,
        )
        return str(text)

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> str:
        """The template's rendering with ``add_generation_prompt=True``."""
        return self._render(messages, tools, kwargs, True)

    def render_completion(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        prompt: str,
        answer: dict[str, Any],
    ) -> str:
        """What the template renders for ``answer`` after ``prompt``, up to its EOS marker.

        Falls back to the manual Qwen3 rendering when the template's rendering of the whole
        conversation does not start with the prompt (a template that rewrites history).
        """
        full = self._render([*messages, answer], tools, kwargs, False)
        if full.startswith(prompt):
            rest = full[len(prompt) :]
            end = rest.rfind(EOS_TEXT)
            if end >= 0:
                return rest[:end]
        think = kwargs.get("enable_thinking") is not False and "reasoning_content" in answer
        return manual_completion(answer, think)

    def encode(self, text: str) -> tuple[list[int], list[int]]:
        """Ids and end offsets from the fast tokenizer (no special tokens added)."""
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = [int(i) for i in enc["input_ids"]]
        ends = [int(e) for _, e in enc["offset_mapping"]]
        # Offsets of added tokens can be (0, 0) in some versions; keep them monotonic.
        for i in range(1, len(ends)):
            if ends[i] < ends[i - 1]:
                ends[i] = ends[i - 1]
        return ids, ends


def load_tokenizer(path: str | None) -> Tokenizer:
    """``HFTokenizer(path)`` when a path is given, else the approximate tokenizer."""
    if path:
        return HFTokenizer(path)
    return ApproxTokenizer()
