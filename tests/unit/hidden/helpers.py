"""A tiny random Qwen3-shaped target written locally (no hub), and sample rows for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.shared.formats import SAMPLE_SCHEMA


def tiny_qwen3(folder: Path, *, layers: int = 8, vocab: int = 256, seed: int = 0) -> Path:
    """A random-weight Qwen3 (hidden 64, ``layers`` decoder layers, bf16 weights) in
    ``folder``; its folder."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    # random init leaves the norms at 1; spread them so pre- and post-norm tell apart
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 2.0)
    model.save_pretrained(str(folder))
    return folder


def sample_rows(
    n: int, *, vocab: int = 256, seed: int = 0, lo: int = 3, hi: int = 90
) -> list[dict[str, Any]]:
    """``n`` tokenized samples of random lengths in [lo, hi), loss on their second half."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = int(rng.integers(lo, hi))
        ids = rng.integers(0, vocab, t).tolist()
        mask = [0] * (t // 2) + [1] * (t - t // 2)
        rows.append(
            {"id": f"s{i:04d}", "source": "src", "domain": "general", "input_ids": ids,
             "loss_mask": mask, "num_tokens": t, "num_loss_tokens": sum(mask), "truncated": False}
        )  # fmt: skip
    return rows


def write_samples(folder: Path, rows: list[dict[str, Any]], shards: int = 1) -> Path:
    """``rows`` as tokenized sample parquet (SAMPLE_SCHEMA) in ``folder``; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    per = max(1, -(-len(rows) // shards))
    for k in range(0, len(rows), per):
        table = pa.Table.from_pylist(rows[k : k + per], schema=SAMPLE_SCHEMA)
        pq.write_table(table, folder / f"part-{k // per:05d}.parquet")
    return folder
