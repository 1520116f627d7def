"""The hidden-states tiers' inputs: tokenize's samples of a simulated run (the demo tokenizer)
and a tiny random Qwen3-shaped target sized to that tokenizer, all made locally."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from tests.integration.generate.helpers import simulated_run, user_prompts
from tests.unit.hidden.helpers import tiny_qwen3


def tokenized_run(root: Path, n: int = 40) -> tuple[Path, str]:
    """tokenize's output for a simulated run of ``n`` prompts (a third multi-turn); (the
    tokenized folder, the tokenizer folder)."""
    from draftdata.tokenize.config import TokenizeConfig
    from draftdata.tokenize.stage import tokenize

    prompts = user_prompts(n, "Question {i}: what is {i} + {i}?", "p{:03d}")
    for p in prompts[::3]:
        p["messages"] += [
            {"role": "assistant", "content": "I am not sure."},
            {"role": "user", "content": "Think again, please."},
        ]
    run, tok = simulated_run(root, prompts, mean_output_tokens=40, max_tokens=160, flush_records=16)
    out = root / "tokenized"
    tokenize(TokenizeConfig(run=str(run), tokenizer=tok, out=str(out)))
    return out, tok


def target_for(tokenizer: str, folder: Path, layers: int = 8) -> Path:
    """A random Qwen3-shaped target whose vocabulary covers ``tokenizer``'s ids."""
    tok = json.loads((Path(tokenizer) / "tokenizer.json").read_text("utf-8"))
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    vocab = (max(ids) + 1 + 63) // 64 * 64
    return tiny_qwen3(folder, layers=layers, vocab=vocab)


def stats_of(root: Path) -> dict[str, tuple[int, int, int]]:
    """(inode, mtime_ns, size) of every sample file under ``root/hidden_states``."""
    folder = root / "hidden_states"
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(folder.iterdir())
        if not p.name.startswith(".")
    }


def samples_of(tokenized: Path) -> dict[str, dict[str, Any]]:
    """id -> the sample row (input_ids, loss_mask) of tokenize's output."""
    import pyarrow.parquet as pq

    rows = {}
    for p in sorted(tokenized.glob("*.parquet")):
        for r in pq.read_table(p).to_pylist():
            rows[r["id"]] = r
    return rows


def cpu_env() -> dict[str, str]:
    """The environment for a hidden-states subprocess: one thread each (2 shared cores)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def ids_array(values: list[int]) -> np.ndarray:
    """Token ids as the writers keep them."""
    return np.asarray(values, dtype=np.int64)
