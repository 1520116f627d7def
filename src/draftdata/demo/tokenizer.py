"""The demo tokenizer: a small byte-level BPE trained locally, saved as a Hugging Face folder.

``train_tokenizer`` trains a byte-level BPE with the ``tokenizers`` library on text we generate
here (seeded: prose, code, math, JSON, chat turns), adds the Qwen3-style control tokens and saves a
folder that ``transformers.AutoTokenizer.from_pretrained`` loads (``tokenizer_class:
PreTrainedTokenizerFast``, so older transformers and vLLM read it too) with draftdata's own
Qwen3-style chat template (``templates/qwen3_style.jinja``). ``ensure_demo_tokenizer`` trains once
per cache folder and reuses it afterwards.

It takes about a second, needs no network and no model download; it is not a production
tokenizer (the vocabulary is tiny), only a faithful stand-in with the same special-token and
template structure as Qwen3.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

from draftdata.errors import InputError

# (content, special): special tokens are skipped by decode(skip_special_tokens=True); the
# reasoning and tool tags are ordinary added tokens, as in Qwen3.
CONTROL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 4096
DEMO_TOKENIZER_VERSION = "demo-bpe/1"

# Pre-tokenization: contractions, letter runs with one leading non-letter, digits in groups of up
# to three, punctuation runs, newlines, and whitespace (the cl100k-style split).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by this are or an at from which "
    "we can has have not but all their more one will would there what about if when so "
    "model data train token drafter target server request batch queue shard prompt answer "
    "reasoning step first then next because therefore value number function return list "
    "string error file line result compute sum product prime integer equation solve check "
    "speculative decoding distillation throughput latency memory cache python rust code "
    "user assistant system tool call response weather city temperature search query"
)
_WORDS = tuple(_WORD_TEXT.split())
_UNICODE = ("naïve", "café", "über", "日本語", "数学", "привет", "Ελληνικά", "🙂", "→", "∑", "½")
_CODE = (
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "class Node:\n    def __init__(self, value):\n        self.value = value\n",
    'fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!("{:?}", v);\n}\n',
    "SELECT name, COUNT(*) FROM users WHERE age > 30 GROUP BY name;\n",
    "const xs = [1, 2, 3].map((x) => x * 2);\nconsole.log(xs);\n",
)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), rng.choice(_UNICODE))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", ".", "?", "!", ":"))


def _math(rng: random.Random) -> str:
    a, b = rng.randint(1, 999), rng.randint(1, 999)
    return f"We have {a} + {b} = {a + b}, and {a} * {b} = {a * b}. So $x^2 = {a * a}$."


def _tool_json(rng: random.Random) -> str:
    args = {"city": rng.choice(("Paris", "Tokyo", "Lima")), "days": rng.randint(1, 7)}
    return json.dumps({"name": "get_weather", "arguments": args}, ensure_ascii=False)


def synthetic_corpus(n_docs: int = 3000, seed: int = 0) -> Iterator[str]:
    """Yield ``n_docs`` seeded synthetic documents mixing prose, code, math, JSON and chat turns.

    The mix covers what draftdata's demo conversations contain, so the small vocabulary still
    compresses them; the control tokens appear in the text so training sees their context.
    """
    rng = random.Random(seed)
    for _ in range(n_docs):
        kind = rng.random()
        if kind < 0.45:
            yield " ".join(_sentence(rng) for _ in range(rng.randint(1, 6)))
        elif kind < 0.6:
            yield rng.choice(_CODE)
        elif kind < 0.75:
            yield _math(rng)
        elif kind < 0.85:
            yield f"<tool_call>\n{_tool_json(rng)}\n</tool_call>"
        else:
            yield (
                f"<|im_start|>user\n{_sentence(rng)}<|im_end|>\n<|im_start|>assistant\n"
                f"<think>\n{_sentence(rng)}\n</think>\n\n{_sentence(rng)}<|im_end|>\n"
            )


def chat_template_text() -> str:
    """The text of draftdata's Qwen3-style chat template (shipped as package data)."""
    return (
        resources.files("draftdata.demo")
        .joinpath("templates/qwen3_style.jinja")
        .read_text(encoding="utf-8")
    )


def train_tokenizer(
    out_dir: Path,
    texts: Iterable[str] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    chat_template: str | None = None,
) -> Path:
    """Train a byte-level BPE on ``texts`` (default: a synthetic corpus) and save it to ``out_dir``.

    The folder holds ``tokenizer.json``, ``tokenizer_config.json`` (``PreTrainedTokenizerFast``,
    eos ``<|im_end|>``, pad ``<|endoftext|>``, the chat template inline) and
    ``special_tokens_map.json``; ``AutoTokenizer.from_pretrained(out_dir)`` loads it offline.
    Returns ``out_dir``.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    if vocab_size < 300:
        raise InputError(f"train_tokenizer: vocab_size {vocab_size} is too small; use >= 300")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[t for t, _ in CONTROL_TOKENS],
    )
    tok.train_from_iterator(texts if texts is not None else synthetic_corpus(), trainer=trainer)
    # Re-register the control tokens with their flags (normalized=False: matched verbatim).
    tok.add_special_tokens([AddedToken(t, normalized=False) for t, s in CONTROL_TOKENS if s])
    plain = [AddedToken(t, normalized=False, special=False) for t, s in CONTROL_TOKENS if not s]
    tok.add_tokens(plain)

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": s,
        }
        for t, s in CONTROL_TOKENS
    }
    specials = [t for t, s in CONTROL_TOKENS if s and t not in (EOS_TOKEN, PAD_TOKEN)]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": specials,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "split_special_tokens": False,
        "chat_template": chat_template if chat_template is not None else chat_template_text(),
        "draftdata_version": DEMO_TOKENIZER_VERSION,
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    special_map = {
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": specials,
    }
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2) + "\n", encoding="utf-8"
    )
    return out_dir


def ensure_demo_tokenizer(cache_dir: Path) -> Path:
    """The demo tokenizer folder under ``cache_dir``, trained on first use and reused afterwards.

    Training writes to a temporary sibling folder and renames it into place, so concurrent callers
    and interrupted runs never leave a half-written tokenizer behind.
    """
    target = cache_dir / "demo-tokenizer"
    config = target / "tokenizer_config.json"
    if config.is_file():
        try:
            if json.loads(config.read_text("utf-8")).get("draftdata_version") == (
                DEMO_TOKENIZER_VERSION
            ):
                return target
        except (OSError, ValueError):
            pass
        raise InputError(
            f"{target}: not a draftdata {DEMO_TOKENIZER_VERSION} tokenizer; delete the folder so "
            "the demo can train a fresh one"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-tokenizer-", dir=cache_dir))
    train_tokenizer(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        # Another process won the race; its tokenizer is identical (seeded training).

        shutil.rmtree(tmp, ignore_errors=True)
        if not config.is_file():
            raise
    return target
