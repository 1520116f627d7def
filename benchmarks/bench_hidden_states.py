"""Benchmark: ``draftdata hidden-states`` on the CPU against a plain batched ``model(...)`` loop.

A random-weight Qwen3-shaped target (hidden 256, 8 layers, vocab 4,096; made here, nothing
downloaded) and ``--samples`` random tokenized samples of 32 to 640 tokens. Both sides see the
same samples in the same length-sorted batches under the same token budget:

- **plain loop**: ``AutoModelForCausalLM`` (what a script would load), right-padded batches with
  an attention mask, ``model(input_ids, attention_mask=..., output_hidden_states=True)``, each
  sample's rows of the four captured layers copied to the CPU; nothing written;
- **draftdata**: ``hidden_states`` with the transformers engine into a local folder
  (``--format speculators``, bf16): forward passes, encoding, create-only commits (fsync per
  file), then ``--verify 8``.

Printed: tokens/s of each (draftdata's rate over its run phase, the one its summary reports,
and end to end with model load, plan and verification), their ratio (target >= 0.9), bytes per
token written, the bill's forecast against the bytes written (target within 2%), and the
lossless compression of the written states (gzip level 1 and 6, zstd level 3) with fp8's error
against bf16. The target's weights are random: its activations are not a trained model's (no
outlier channels), so the compression ratios say what these bytes give, not what a real
target's will; see docs/hidden-states.md.

    python benchmarks/bench_hidden_states.py                  # 300 samples
    python benchmarks/bench_hidden_states.py --samples 100    # quicker
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.hidden.config import HiddenConfig
from draftdata.hidden.plan import batches
from draftdata.hidden.stage import hidden_states
from draftdata.hidden.writer import SampleRow
from draftdata.shared.formats import SAMPLE_SCHEMA

LAYERS = (2, 4, 5)  # eagle3 for 8 layers
VOCAB = 4096


def make_target(folder: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(folder))
    return folder


def make_samples(folder: Path, n: int) -> list[SampleRow]:
    rng = np.random.default_rng(0)
    rows, samples = [], []
    for i in range(n):
        t = int(rng.integers(32, 640))
        ids = rng.integers(0, VOCAB, t)
        mask = np.r_[np.zeros(t // 3, np.int64), np.ones(t - t // 3, np.int64)]
        samples.append(
            SampleRow(row=i, id=f"b{i:05d}", input_ids=ids.astype(np.int64), loss_mask=mask)
        )
        rows.append({"id": f"b{i:05d}", "source": "bench", "domain": "general",
                     "input_ids": ids.tolist(), "loss_mask": mask.tolist(), "num_tokens": t,
                     "num_loss_tokens": int(mask.sum()), "truncated": False})  # fmt: skip
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA), folder / "part-00000.parquet")
    return samples


def plain_loop(model_dir: Path, samples: list[SampleRow], budget: int) -> tuple[float, int]:
    """Seconds and tokens of the plain batched loop (after the model is loaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    t0 = time.perf_counter()
    tokens = 0
    for batch in batches(samples, budget):
        width = max(len(s.input_ids) for s in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, s in enumerate(batch):
            ids[i, : len(s.input_ids)] = torch.from_numpy(s.input_ids)
            mask[i, : len(s.input_ids)] = 1
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            hs = out.hidden_states
            n = len(hs) - 1
            picked = torch.stack([hs[i] for i in LAYERS] + [hs[n]], dim=2)
            for i, s in enumerate(batch):
                picked[i, : len(s.input_ids)].to(torch.bfloat16).cpu()
                tokens += len(s.input_ids)
    return time.perf_counter() - t0, tokens


def compression(folder: Path) -> dict[str, float]:
    """stored/raw of the written sample files' bytes, per codec."""
    raw = b"".join(p.read_bytes() for p in sorted((folder / "hidden_states").iterdir()))
    return {
        "gzip-1": len(gzip.compress(raw, 1)) / len(raw),
        "gzip-6": len(gzip.compress(raw, 6)) / len(raw),
        "zstd-3": len(pa.Codec("zstd", compression_level=3).compress(raw, asbytes=True)) / len(raw),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hidden-") as tmp:
        root = Path(tmp)
        model = make_target(root / "target")
        samples = make_samples(root / "tokenized", args.samples)
        load = os.getloadavg()[0]
        plain_s, plain_tokens = plain_loop(model, samples, args.batch_tokens)
        plain_rate = plain_tokens / plain_s
        t0 = time.perf_counter()
        config = HiddenConfig(tokenized=str(root / "tokenized"), model=str(model),
                              out=str(root / "set"), format="speculators", gpus="cpu",
                              batch_tokens=args.batch_tokens, progress=False)  # fmt: skip
        s = hidden_states(config, log=None)
        e2e = time.perf_counter() - t0
        fp8 = hidden_states(
            HiddenConfig(**{**{f: getattr(config, f) for f in config.__struct_fields__},
                            "out": str(root / "fp8"), "dtype": "fp8", "pilot": 40}),
            log=None,
        )  # fmt: skip
        comp = compression(root / "set")
        print(f"samples {s.planned:,}, tokens {s.tokens:,}, load average {load:.1f} at start")
        print(f"plain batched model(...) loop: {plain_rate:,.0f} tok/s ({plain_s:.1f} s)")
        print(f"draftdata hidden-states, run phase: {s.tokens_per_s:,.0f} tok/s; "
              f"ratio {s.tokens_per_s / plain_rate:.2f} (target >= 0.9)")  # fmt: skip
        e2e_rate = s.tokens / e2e
        print(f"draftdata hidden-states, end to end (load, plan, verify): {e2e_rate:,.0f} tok/s "
              f"({e2e:.1f} s); ratio {e2e_rate / plain_rate:.2f}")  # fmt: skip
        print(f"bytes/token written: {s.bytes_total / s.tokens:,.1f} "
              f"(4 layers x 256 x bf16 = 2,048 + 8 for the token id)")  # fmt: skip
        off = (s.bill_bytes - s.bytes_total) / s.bytes_total
        print(f"forecast {s.bill_bytes:,} B vs written {s.bytes_total:,} B: {off:+.3%} "
              "(target within 2%)")  # fmt: skip
        v = s.verification
        assert v is not None
        worst = max(v.layers, key=lambda lc: lc.rms_rel)
        print(
            f"verification: {v.samples} samples, worst layer {worst.layer} rms {worst.rms_rel:.3%}"
        )
        print("compression of the written files (stored/raw): "
              + ", ".join(f"{k} {r:.3f}" for k, r in comp.items()))  # fmt: skip
        if fp8.fp8_error:
            print("fp8 e4m3 (a scale per token) against bf16, rms per layer: "
                  + ", ".join(f"{lc.layer} {lc.rms_rel:.2%}" for lc in fp8.fp8_error))  # fmt: skip


if __name__ == "__main__":
    main()
