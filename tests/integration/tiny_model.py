"""Write a tiny random-weight Qwen3 model beside a tokenizer folder (run with an engine's python).

    ENGINE_PYTHON -P tests/integration/tiny_model.py MODEL_DIR   (-P: its folder holds tokenize/)

MODEL_DIR must already hold the tokenizer files (tokenizer.json, tokenizer_config.json); this
script adds config.json, generation_config.json and model.safetensors sized to that tokenizer.
It imports torch and transformers, which live in the engines' environments (vLLM, SGLang), not
in draftdata's; it downloads nothing. Hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 32 (CPU
attention supports head_dim 32): about 0.5 MB of weights, enough for an engine to serve real
(random) tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(model_dir: Path) -> None:
    """Build the model sized to the tokenizer in ``model_dir`` and save it there."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = json.loads((model_dir / "tokenizer.json").read_text("utf-8"))
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    vocab = max(ids) + 1
    vocab = (vocab + 63) // 64 * 64
    cfg_tok = json.loads((model_dir / "tokenizer_config.json").read_text("utf-8"))
    by_content = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    eos = by_content[cfg_tok["eos_token"]]
    pad = by_content.get(cfg_tok.get("pad_token") or "", eos)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(model_dir))
    # As the real Qwen3's generation config: both <|im_end|> and <|endoftext|> end a turn, so
    # the random model ends turns both ways (tokenize must not append after <|endoftext|>).
    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text("utf-8"))
    endoftext = by_content.get("<|endoftext|>")
    gen["eos_token_id"] = [eos] + ([endoftext] if endoftext not in (None, eos) else [])
    gen_path.write_text(json.dumps(gen, indent=2))
    print(f"tiny qwen3 written to {model_dir} (vocab {vocab})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
