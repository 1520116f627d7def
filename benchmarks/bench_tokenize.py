"""Benchmark: the tokenize stage's batch function against the limits it is measured by.

On N synthetic completions of realistic length (default 5,000 of ~3K tokens: a ~300-token
prompt, ~1.5K tokens of reasoning and ~1.2K of answer, text drawn from the demo tokenizer's
corpus generator, seeded), with the demo BPE tokenizer (trained locally) and its Qwen3-style
generation-marker template:

- raw: ``encode_batch`` (with offsets) of exactly the texts our rendered path renders: the limit;
- rendered: ``tokenize_table`` on the completions (decode the Arrow table, render, one batched
  encode, masks from offsets, length checks, the samples table). Target: within 1.25x of raw;
- per-sample baseline: ``apply_chat_template(tokenize=True, return_dict=True,
  return_assistant_tokens_mask=True)`` per completion, printed beside;
- token-id path: ``tokenize_table`` on the same completions carrying server token ids (no
  encoding; ``--no-verify``). Target: >= 5x the raw rate.

Every path's ids (and masks) are asserted identical to the rendered path's before any figure
is printed. Run: ``.venv/bin/python benchmarks/bench_tokenize.py [--quick] [--n N]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from draftdata.formats import completions_table
from draftdata.records import Completion, Message, Turn
from draftdata.tokenize.batch import TokenizeContext, tokenize_table
from draftdata.tokenize.plan import plan_rendered, view_from_record
from draftdata.tokenize.train import ensure_demo_tokenizer, synthetic_corpus

BATCH = 256


def _text(rng: random.Random, docs: list[str], chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        d = rng.choice(docs)
        out.append(d)
        size += len(d) + 1
    return " ".join(out)


def make_completions(n: int, scale: float, seed: int = 0) -> list[Completion]:
    """``n`` single-turn completions; ``scale`` 1.0 is ~3K tokens each with the demo BPE."""
    rng = random.Random(seed)
    docs = [d for d in synthetic_corpus(4000, seed=seed + 1) if "<|im_" not in d]
    out = []
    for i in range(n):
        prompt = _text(rng, docs, int(1000 * scale))
        reasoning = _text(rng, docs, int(5200 * scale))
        answer = _text(rng, docs, int(4200 * scale))
        out.append(
            Completion(
                id=f"c{i}",
                domain=("math", "code", "general")[i % 3],
                messages=[
                    Message(role="system", content="You are a careful assistant."),
                    Message(role="user", content=prompt),
                ],
                turns=[Turn(content=answer, reasoning=reasoning, finish_reason="stop")],
            )
        )
    return out


def with_token_ids(items: list[Completion], samples: pa.Table) -> list[Completion]:
    """The same completions carrying the ids a server would return (from the rendered run)."""
    by_id = {
        r["id"]: (r["input_ids"], r["loss_mask"])
        for r in samples.select(["id", "input_ids", "loss_mask"]).to_pylist()
    }
    out = []
    for c in items:
        ids, mask = by_id[c.id]
        start = mask.index(1)
        end = len(mask) - mask[::-1].index(1)
        t = c.turns[0]
        turn = Turn(
            content=t.content,
            reasoning=t.reasoning,
            finish_reason=t.finish_reason,
            prompt_token_ids=ids[:start],
            output_token_ids=ids[start:end],
        )
        out.append(Completion(id=c.id, domain=c.domain, messages=c.messages, turns=[turn]))
    return out


def _tables(items: list[Completion]) -> list[pa.Table]:
    return [completions_table(items[i : i + BATCH]) for i in range(0, len(items), BATCH)]


def _run(tables: list[pa.Table], ctx: TokenizeContext) -> tuple[float, pa.Table]:
    start = time.perf_counter()
    parts = [tokenize_table(t, ctx)[0] for t in tables]
    elapsed = time.perf_counter() - start
    return elapsed, pa.concat_tables(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="500 completions of ~1K tokens")
    parser.add_argument("--n", type=int, default=None, help="number of completions")
    parser.add_argument("--baseline-n", type=int, default=None, help="completions for baseline")
    args = parser.parse_args(argv)
    n = args.n or (500 if args.quick else 5000)
    scale = 0.35 if args.quick else 1.0
    base_n = min(n, args.baseline_n or n)

    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = ensure_demo_tokenizer(Path(tmp))
        ctx = TokenizeContext(str(tok_dir))
        fast = TokenizeContext(str(tok_dir), verify=False)
        items = make_completions(n, scale)
        tables = _tables(items)

        # Our rendered path, end to end on Arrow tables.
        t_ours, ours = _run(tables, ctx)
        tokens = int(pa.compute.sum(ours.column("num_tokens")).as_py())
        ids_ours = ours.column("input_ids").to_pylist()
        masks_ours = ours.column("loss_mask").to_pylist()

        # The limit: one batch encode (offsets included) of the very texts we render.
        texts = []
        for c in items:
            texts.extend(s.text for s in plan_rendered(view_from_record(c), ctx.template).rendered)
        start = time.perf_counter()
        encs = []
        for i in range(0, len(texts), BATCH):
            encs.extend(ctx.backend.encode_batch(texts[i : i + BATCH], add_special_tokens=False))
        t_raw = time.perf_counter() - start
        assert [e.ids for e in encs] == ids_ours, "raw encode differs from the rendered path"

        # The per-sample baseline.
        hf = ctx.tokenizer
        start = time.perf_counter()
        for i, c in enumerate(items[:base_n]):
            t = c.turns[0]
            convo: list[dict[str, Any]] = [
                {"role": m.role, "content": m.content} for m in c.messages
            ]
            convo.append(
                {"role": "assistant", "content": t.content, "reasoning_content": t.reasoning}
            )
            out = hf.apply_chat_template(
                convo,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            assert list(out["input_ids"]) == ids_ours[i], f"{c.id}: baseline ids differ"
            assert list(out["assistant_masks"]) == masks_ours[i], f"{c.id}: baseline mask differs"
        t_base = (time.perf_counter() - start) * n / base_n

        # The token-id path.
        id_tables = _tables(with_token_ids(items, ours))
        t_ids, by_ids = _run(id_tables, fast)
        assert by_ids.equals(ours), "token-id path differs from the rendered path"
        # The same with verification on (renders + encodes to check every sample).
        t_ver, verified = _run(id_tables, ctx)
        assert verified.equals(ours)

    def rate(seconds: float) -> str:
        return f"{tokens / seconds / 1e3:,.0f}K tokens/s"

    print(
        f"bench_tokenize: {n} completions, {tokens:,} tokens ({tokens / n:,.0f}/sample), "
        f"demo BPE, batches of {BATCH}"
    )
    print(f"raw encode_batch (offsets):      {t_raw:7.2f} s  {rate(t_raw)}  (the limit)")
    print(
        f"rendered path (tokenize_table):  {t_ours:7.2f} s  {rate(t_ours)}  "
        f"{t_ours / t_raw:.2f}x raw time (target <= 1.25x)"
    )
    print(
        f"per-sample apply_chat_template:  {t_base:7.2f} s  {rate(t_base)}  "
        f"{t_raw / t_base:.2f}x the raw rate"
        + (f" (measured on {base_n}, scaled)" if base_n < n else "")
    )
    print(
        f"token-id path (--no-verify):     {t_ids:7.2f} s  {rate(t_ids)}  "
        f"{t_raw / t_ids:.1f}x the raw rate (target >= 5x)"
    )
    print(
        f"token-id path + verify:          {t_ver:7.2f} s  {rate(t_ver)}  "
        f"{t_ver / t_raw:.2f}x raw time"
    )
    print("identical ids and masks: rendered == raw == apply_chat_template == token-id path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
