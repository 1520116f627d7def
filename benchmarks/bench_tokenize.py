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
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from draftdata.demo.tokenizer import ensure_demo_tokenizer, synthetic_corpus
from draftdata.records import Completion, Message, Turn
from draftdata.shared.formats import completions_table
from draftdata.tokenize.encode import TokenizeContext, tokenize_table
from draftdata.tokenize.plan import plan_rendered, view_from_record

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


class Clock:
    """Wall and CPU seconds (CPU counts every thread of this process: a load-robust figure)."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def time(self, fn: Any, *args: Any) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        return out


def _baseline(hf: Any, items: list[Completion]) -> list[Any]:
    out = []
    for c in items:
        t = c.turns[0]
        convo: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in c.messages]
        convo.append({"role": "assistant", "content": t.content, "reasoning_content": t.reasoning})
        out.append(
            hf.apply_chat_template(
                convo, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="500 completions of ~1K tokens")
    parser.add_argument("--n", type=int, default=None, help="number of completions")
    parser.add_argument(
        "--baseline-n", type=int, default=None, help="completions the per-sample baseline runs"
    )
    args = parser.parse_args(argv)
    n = args.n or (500 if args.quick else 5000)
    scale = 0.35 if args.quick else 1.2
    base_n = min(n, args.baseline_n or n)

    raw, ours, base, ids_path, verify = Clock(), Clock(), Clock(), Clock(), Clock()
    tokens = base_tokens = 0
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = ensure_demo_tokenizer(Path(tmp))
        ctx = TokenizeContext(str(tok_dir))
        fast = TokenizeContext(str(tok_dir), verify=False)
        items = make_completions(n, scale)
        # Batch by batch, every path in turn, so a machine whose load changes over the run
        # slows all of them alike; outputs are compared untimed.
        for lo in range(0, n, BATCH):
            chunk = items[lo : lo + BATCH]
            table = completions_table(chunk)
            texts = [
                s.text
                for c in chunk
                for s in plan_rendered(view_from_record(c), ctx.template).rendered
            ]
            encs = raw.time(lambda t: ctx.backend.encode_batch(t, add_special_tokens=False), texts)
            samples, _ = ours.time(tokenize_table, table, ctx)
            id_table = completions_table(with_token_ids(chunk, samples))
            by_ids, _ = ids_path.time(tokenize_table, id_table, fast)
            checked, counters = verify.time(tokenize_table, id_table, ctx)
            got_ids = samples.column("input_ids").to_pylist()
            got_masks = samples.column("loss_mask").to_pylist()
            assert [e.ids for e in encs] == got_ids, "raw encode differs from the rendered path"
            assert by_ids.equals(samples), "token-id path differs from the rendered path"
            assert checked.equals(samples) and counters.counts["verified"] == len(chunk)
            tokens += sum(len(x) for x in got_ids)
            if lo < base_n:
                part = chunk[: base_n - lo]
                outs = base.time(_baseline, ctx.tokenizer, part)
                for i, o in enumerate(outs):
                    assert list(o["input_ids"]) == got_ids[i], "baseline ids differ"
                    assert list(o["assistant_masks"]) == got_masks[i], "baseline mask differs"
                base_tokens += sum(len(o["input_ids"]) for o in outs)

    def line(name: str, c: Clock, toks: int, note: str) -> str:
        return (
            f"{name:<32} {c.wall:8.2f} s wall {toks / c.wall / 1e3:8,.0f}K tok/s | "
            f"{c.cpu:8.2f} s CPU {toks / c.cpu / 1e3:8,.0f}K tok/CPU-s | {note}"
        )

    def rate_ratio(c: Clock, toks: int, attr: str) -> float:
        return (toks / getattr(c, attr)) / (tokens / getattr(raw, attr))

    print(
        f"bench_tokenize: {n} completions, {tokens:,} tokens ({tokens / n:,.0f}/sample), "
        f"demo BPE, batches of {BATCH}, load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs"
    )
    print(line("raw encode_batch (offsets)", raw, tokens, "the limit"))
    print(
        line(
            "rendered path (tokenize_table)",
            ours,
            tokens,
            f"{ours.wall / raw.wall:.2f}x raw wall, {ours.cpu / raw.cpu:.2f}x raw CPU "
            "(target <= 1.25x)",
        )
    )
    print(
        line(
            "per-sample apply_chat_template",
            base,
            base_tokens,
            f"{rate_ratio(base, base_tokens, 'wall'):.2f}x raw rate wall, "
            f"{rate_ratio(base, base_tokens, 'cpu'):.2f}x CPU"
            + (f" (on {base_n} completions)" if base_n < n else ""),
        )
    )
    print(
        line(
            "token-id path (--no-verify)",
            ids_path,
            tokens,
            f"{rate_ratio(ids_path, tokens, 'wall'):.1f}x raw rate wall, "
            f"{rate_ratio(ids_path, tokens, 'cpu'):.1f}x CPU (target >= 5x)",
        )
    )
    print(
        line(
            "token-id path + verify",
            verify,
            tokens,
            f"{verify.wall / raw.wall:.2f}x raw wall, {verify.cpu / raw.cpu:.2f}x raw CPU",
        )
    )
    print("identical ids and masks: rendered == raw == apply_chat_template == token-id path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
