"""Token counts of chat rows: the tokens a conversation costs and the loss tokens a drafter
trains on, counted with the target's tokenizer when one is given, else estimated from the text.

A drafter's loss is summed over loss tokens, so every mix draftdata shows or plans in tokens is
counted here, in one way: ``stats`` (chat rows, runs), ``merge --mix-by tokens`` and whatever
plans from existing answers. Tokenized sets carry exact counts and do not come here.

What is counted for a conversation (``conversation_tokens``):

- **tokens**: every message's text (content, reasoning, tool calls) plus the chat template's
  frame per message (``MESSAGE_TOKENS``: ``<|im_start|>role\\n`` and ``<|im_end|>\\n``), and the
  tool specs as JSON (the template puts them in the system prompt, ``TOOLS_TOKENS`` of frame);
- **loss tokens**: what the assistant writes: its content, reasoning (plus the ``<think>`` frame,
  ``REASONING_TOKENS``) and tool calls (``TOOL_CALL_TOKENS`` of frame each), plus the end-of-turn
  token it writes last (``END_OF_TURN_TOKENS``).

The frame constants are Qwen3's template measured with its tokenizer; other templates differ by a
few tokens per message, which shares of thousands of tokens barely see.

Without a tokenizer the text's tokens are estimated (``estimate_tokens``) from four counts that
a BPE tokenizer's output follows closely: runs of ASCII letters (words: ``WORD_TOKENS`` each),
digits (Qwen-style tokenizers split numbers into digits: ``DIGIT_TOKENS`` each), ASCII
punctuation (``PUNCT_TOKENS`` each) and other characters (CJK, accents, emoji:
``OTHER_TOKENS`` each); whitespace costs nothing of its own (tokenizers fold it into the next
token). The weights were fitted against the real Qwen3 tokenizer over Python source, Markdown,
JSON, the bundled sample sources (code, math, general, tool, agent), numbers and LaTeX, each
weighted alike (``benchmarks/bench_token_estimate.py`` measures them again and prints the error
per kind of text): within about 11% of the real count on each kind. A plain characters-per-token
ratio (3.77, the mean over the chat domains) ranges from 3.0 (math) to 4.2
(tool calls) on the same text, and to 1.0 on digits and CJK, which would tilt a mix.
``OTHER_TOKENS`` is measured on the 500 most common Chinese characters (0.98 tokens each), an
upper bound for running CJK text, where common pairs merge.

**The output tokens of an answer** (``answer_tokens``, ``turn_tokens``): what every figure that
counts a run's output tokens counts (stats, the whole run's figures, generate's summary and live
rates, the pilot's forecast, the length model). The server's ``usage.completion_tokens`` when it
counted any; else the turn's output token ids (exact); else, for a server that sent no usage (or
0 for a non-empty answer), an estimate from its text, flagged as one so that a figure built on it
says so, never 0 tokens for an answer that has text.

This module reads no files but a tokenizer folder; it knows nothing of datasets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from draftdata.errors import ConfigError
from draftdata.records import JsonDict, Message, Turn

# Measured with the Qwen3 tokenizer: see the module docstring.
WORD_TOKENS = 1.19
DIGIT_TOKENS = 1.28
PUNCT_TOKENS = 0.52
OTHER_TOKENS = 0.98

# How far an estimate can be off, said wherever one is shown: the weights are fitted to Qwen3's
# tokenizer (benchmarks/bench_token_estimate.py); a tokenizer of another family splits text
# differently (one measured at 2.2x the estimate's count).
ESTIMATE_ERROR = (
    "an estimate fitted to Qwen3's tokenizer (within about 11% of its count; a tokenizer of "
    "another family can count 2x as many or more)"
)

MESSAGE_TOKENS = 5  # <|im_start|>role\n ... <|im_end|>\n
END_OF_TURN_TOKENS = 1  # <|im_end|>: the assistant writes it, so it is trained
REASONING_TOKENS = 4  # <think>\n ... \n</think>\n\n
TOOL_CALL_TOKENS = 11  # <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
TOOLS_TOKENS = 80  # the template's tool-use instructions around the specs

Method = Literal["tokenizer", "estimate"]

# byte -> class: 0 space/other control, 1 ASCII letter, 2 digit, 3 ASCII punctuation,
# 4 the first byte of a non-ASCII character, 5 a UTF-8 continuation byte
_CLASS = np.zeros(256, dtype=np.int8)
for _b in range(256):
    _c = chr(_b)
    if _b >= 0xC0:
        _CLASS[_b] = 4
    elif _b >= 0x80:
        _CLASS[_b] = 5
    elif _c.isascii() and _c.isalpha():
        _CLASS[_b] = 1
    elif _c.isdigit():
        _CLASS[_b] = 2
    elif 0x21 <= _b <= 0x7E:
        _CLASS[_b] = 3
# per byte: its cost in hundredths of a token (letters cost per word, below), and letter or not
_COST = np.zeros(256, dtype=np.int16)
_COST[_CLASS == 2] = round(100 * DIGIT_TOKENS)
_COST[_CLASS == 3] = round(100 * PUNCT_TOKENS)
_COST[_CLASS == 4] = round(100 * OTHER_TOKENS)
_LETTER = _CLASS == 1


def estimate_tokens(texts: Sequence[str]) -> npt.NDArray[np.float64]:
    """The estimated token count of each text (see the module docstring), as floats.

    One vectorised pass over all the texts' UTF-8 bytes (a few tens of MB/s).
    """
    if not texts:
        return np.zeros(0, dtype=np.float64)
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    lengths = np.fromiter((len(b) + 1 for b in encoded), dtype=np.int64, count=len(encoded))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    # a space after each text, so no word runs across two of them and none is empty
    data = np.frombuffer(b" ".join(encoded) + b" ", dtype=np.uint8)
    letter = _LETTER[data]
    word = np.empty(len(letter), dtype=bool)
    word[0] = letter[0]
    np.greater(letter[1:], letter[:-1], out=word[1:])  # a letter after a non-letter
    cost = np.add.reduceat(_COST[data], starts, dtype=np.int64)
    words = np.add.reduceat(word, starts, dtype=np.int64)
    return np.asarray(cost / 100.0 + words * WORD_TOKENS, dtype=np.float64)


class TokenCounter:
    """Counts the tokens of texts: with a tokenizer folder's tokenizer, else the estimate.

    ``method`` says which ("tokenizer" or "estimate"); ``tokenizer`` is the folder or None.
    Counters are cheap to make again in another process from the folder (``counter(folder)``).
    """

    def __init__(self, tokenizer: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.method: Method = "tokenizer" if tokenizer else "estimate"
        self._encode = _load(tokenizer) if tokenizer else None

    def count(self, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        """The token count of each text (floats: an estimate is not rounded per text)."""
        if not texts:
            return np.zeros(0, dtype=np.float64)
        if self._encode is None:
            return estimate_tokens(texts)
        return np.asarray(self._encode(list(texts)), dtype=np.float64)


@lru_cache(maxsize=4)
def counter(tokenizer: str | None = None) -> TokenCounter:
    """The TokenCounter of ``tokenizer`` (a folder) or the estimate, made once per process."""
    return TokenCounter(tokenizer)


def _load(folder: str) -> Any:
    """``encode(texts) -> [token count]`` of the tokenizer in ``folder`` (no special tokens).

    tokenizer.json is read with ``tokenizers``; a folder with only tokenizer_config.json goes
    through transformers, offline. ConfigError in one line when neither works.
    """
    path = Path(folder).expanduser()
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # the library raises plain Exception for a bad file
            line = _first_line(exc)
            raise ConfigError(f"--tokenizer {folder}: tokenizer.json unreadable ({line})") from None

        def encode(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

        return encode
    if not (path / "tokenizer_config.json").is_file():
        raise ConfigError(
            f"--tokenizer {folder}: no tokenizer.json or tokenizer_config.json in this folder; "
            "give the folder the servers load the target model from"
        )
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types; the first line says enough
        line = _first_line(exc)
        raise ConfigError(f"--tokenizer {folder}: cannot load the tokenizer ({line})") from None

    def encode_hf(texts: list[str]) -> list[int]:
        return [len(ids) for ids in hf(texts, add_special_tokens=False)["input_ids"]]

    return encode_hf


def _first_line(exc: BaseException) -> str:
    return next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)


def tool_call_text(call: JsonDict) -> str:
    """The text of one OpenAI tool call the model writes: its name and arguments."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name = fn.get("name", "") if isinstance(fn, dict) else ""
    args = fn.get("arguments", "") if isinstance(fn, dict) else ""
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return f"{name} {args}" if name else args


def conversation_tokens(
    conversations: Sequence[tuple[Sequence[Message], Sequence[JsonDict] | None]],
    count: TokenCounter | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(tokens, loss tokens) of each (messages, tools) conversation, rounded to integers.

    See the module docstring for what each counts. ``count`` defaults to the estimate. All texts
    go to the counter in one call, so a batch of conversations costs one tokenizer call.
    """
    n = len(conversations)
    texts: list[str] = []
    owner: list[int] = []  # text -> conversation
    is_loss: list[bool] = []
    frame_all = np.zeros(n, dtype=np.float64)
    frame_loss = np.zeros(n, dtype=np.float64)

    def add(text: str | None, row: int, loss: bool) -> None:
        if text:
            texts.append(text)
            owner.append(row)
            is_loss.append(loss)

    for row, (messages, tools) in enumerate(conversations):
        if tools:
            add(json.dumps(list(tools), ensure_ascii=False, sort_keys=True), row, False)
            frame_all[row] += TOOLS_TOKENS
        for m in messages:
            out = m.role == "assistant"
            frame_all[row] += MESSAGE_TOKENS
            add(m.content, row, out)
            if m.reasoning_content:
                add(m.reasoning_content, row, out)
                frame_all[row] += REASONING_TOKENS
                frame_loss[row] += REASONING_TOKENS if out else 0
            for call in m.tool_calls or ():
                add(tool_call_text(call), row, out)
                frame_all[row] += TOOL_CALL_TOKENS
                frame_loss[row] += TOOL_CALL_TOKENS if out else 0
            if out:
                frame_loss[row] += END_OF_TURN_TOKENS
    counts = (count or counter()).count(texts)
    total = frame_all.copy()
    loss = frame_loss.copy()
    if texts:
        rows = np.asarray(owner, dtype=np.int64)
        np.add.at(total, rows, counts)
        mask = np.asarray(is_loss, dtype=bool)
        np.add.at(loss, rows[mask], counts[mask])
    return np.rint(total).astype(np.int64), np.rint(loss).astype(np.int64)


def answer_tokens(
    counted: int | None,
    ids: Sequence[int] | None,
    texts: Sequence[str],
    *,
    calls: int = 0,
    reasoning: bool = False,
    count: TokenCounter | None = None,
) -> tuple[int, bool]:
    """(output tokens, estimated) of one answered turn (module docstring): ``counted`` (the
    server's usage) when above 0, else the length of its output token ``ids``, else its
    ``texts`` (content, reasoning, tool calls) counted by ``count`` (default: the estimate)
    with the template's frame around them (``calls`` tool calls, a ``reasoning`` block),
    ``estimated`` True (the server did not count them). An answer with no text is 0."""
    if counted is not None and counted > 0:
        return int(counted), False
    if ids:
        return len(ids), False
    texts = [t for t in texts if t]
    if not texts:
        return 0, False
    frame = END_OF_TURN_TOKENS + TOOL_CALL_TOKENS * calls + REASONING_TOKENS * reasoning
    counts = (count or counter()).count(texts)
    return max(1, round(float(counts.sum()) + frame)), True


def turn_tokens(turn: Turn, count: TokenCounter | None = None) -> tuple[int, bool]:
    """``answer_tokens`` of one ``Turn``."""
    calls = turn.tool_calls or []
    texts = [turn.content or "", turn.reasoning or "", *(tool_call_text(c) for c in calls)]
    return answer_tokens(
        turn.usage.completion_tokens,
        turn.output_token_ids,
        texts,
        calls=len(calls),
        reasoning=bool(turn.reasoning),
        count=count,
    )


def turns_tokens(turns: Sequence[Turn], count: TokenCounter | None = None) -> tuple[int, bool]:
    """(output tokens, any estimated) of a completion's turns, each counted by ``turn_tokens``."""
    total, estimated = 0, False
    for t in turns:
        n, est = turn_tokens(t, count)
        total += n
        estimated |= est
    return total, estimated


def completion_tokens(
    counted: int, turns: Sequence[Turn], count: TokenCounter | None = None
) -> tuple[int, bool]:
    """(output tokens, any estimated) of a completion: its usage's count (``counted``, the sum
    over its turns) when above 0, else its turns counted by ``turns_tokens``."""
    if counted > 0:
        return counted, False
    return turns_tokens(turns, count)
