"""What draftdata does with what a real engine returns: checks shared by the vLLM and SGLang tiers.

Each tier starts one server of its engine with ``fleet up`` (a tiny random Qwen3 beside
draftdata's demo tokenizer and Qwen3-style template, built by ``tiny_model.py`` with the engine's
own python) and runs these checks against it; only the launch flags and the engine's own
figures differ. The random model never closes a think block by itself: with thinking on, both
engines' qwen3 reasoning parsers put all of its text in the reasoning (the finding of the
tokenizer check); with thinking off, all of it in the content.

- ``generate_and_tokenize``: generate with server ids, tokenize, and check that every sample is
  the served prompt ids then the served output ids of its last turn, with loss exactly on
  served output tokens, nothing under loss after the served end, and no served sample dropped.
- ``cancel_frees_the_slot``: a request cancelled by draftdata (what the dispatcher does to a
  hedge's losing copy) stops using the server's slot, by the server's own counts (running plus
  waiting), while its twin, sent at the same moment for as many tokens, still runs.
- ``canary_answered``: the request the fleet check asks a server again (``recheck.py``: an
  answered request, its output limited to one token) is an answer, not a failure, with thinking
  on, off or the server's and one sample or several.
- ``capacity_line``: the endpoint line generate prints, parsed (capacity, KV cache, running
  cap, concurrency), to compare with the server's own figures.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``draftdata ARGS`` in a fresh process."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def tiny_model(python: Path, base: Path) -> Path:
    """The demo tokenizer plus random tiny Qwen3 weights in ``base/tiny-qwen3``, written by the
    engine's python (torch and transformers live there)."""
    from draftdata.demo.tokenizer import ensure_demo_tokenizer

    model = base / "tiny-qwen3"
    shutil.copytree(ensure_demo_tokenizer(base / "cache"), model)
    res = subprocess.run(  # -P: the script's folder would shadow the stdlib's tokenize
        [str(python), "-P", str(HERE / "tiny_model.py"), str(model)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return model


def write_prompts(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_completions(run: Path) -> list[dict[str, Any]]:
    shards = sorted((run / "completions").glob("*.parquet"))
    return pq.ParquetDataset(shards).read().to_pylist() if shards else []


class Tokenized:
    """What one ``generate`` then ``tokenize`` produced."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        summary: dict[str, Any],
        samples: list[dict[str, Any]],
        log: str,
    ) -> None:
        self.log = log  # generate's output
        self.rows = rows
        self.summary = summary
        self.counts: dict[str, int] = summary["counts"]
        self.samples = samples
        self.turns = {r["id"]: r["turns"] for r in rows}


def generate_and_tokenize(
    fleet: Path, model: Path, tmp: Path, rows: list[dict[str, Any]], *gen_args: str
) -> Tokenized:
    """Generate ``rows`` on ``fleet`` with the server's token ids (``--token-ids on``: refused
    at start by an engine that cannot return them), tokenize with the model's tokenizer, and
    check every sample against the served ids (``check_samples_are_served``)."""
    prompts = write_prompts(tmp / "prompts.jsonl", rows)
    run = tmp / "run"
    gen = run_cli(
        "generate", "--prompts", str(prompts), "--fleet", str(fleet), "--out", str(run),
        "--token-ids", "on", "--progress", "plain", *gen_args,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stdout + gen.stderr
    done = read_completions(run)
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows), gen.stderr
    for r in done:
        for t in r["turns"]:
            assert t["prompt_token_ids"] and t["output_token_ids"], (r["id"], t)
    out = tmp / "tokenized"
    tok = run_cli("tokenize", str(run), "--tokenizer", str(model), "--out", str(out))
    assert tok.returncode == 0, tok.stdout + tok.stderr
    summary = json.loads((out / "summary.json").read_text())
    shards = sorted(out.glob("*.parquet"))
    samples = pq.ParquetDataset(shards).read().to_pylist() if shards else []
    result = Tokenized(done, summary, samples, gen.stdout + gen.stderr)
    check_samples_are_served(result)
    return result


def check_samples_are_served(t: Tokenized) -> None:
    """Every sample is served ids: its last turn's prompt ids then output ids, loss only on
    served output tokens (of the turns it chains), none after the served end; no served sample
    is dropped for not matching a re-rendering."""
    c = t.counts
    assert c.get("mismatched", 0) == 0 and c.get("dropped.unverified_ids", 0) == 0, t.summary
    assert c["path.token_ids"] == c["completions"] == len(t.rows), c
    for s in t.samples:
        base, _, turn = s["id"].partition("#")
        turns = t.turns[base]
        last = int(turn) if turn else len(turns) - 1
        p, o = turns[last]["prompt_token_ids"], turns[last]["output_token_ids"]
        ids, mask = s["input_ids"], s["loss_mask"]
        assert ids[: len(p) + len(o)] == p + o, s["id"]
        assert all(mask[len(p) : len(p) + len(o)]), s["id"]
        assert not any(mask[len(p) + len(o) :]), s["id"]
        # loss before the last turn: only on earlier turns' served outputs, where they stand
        served = set()
        for k in range(last):
            pk, ok = turns[k]["prompt_token_ids"], turns[k]["output_token_ids"]
            if ids[: len(pk) + len(ok)] == pk + ok:
                served.update(range(len(pk), len(pk) + len(ok)))
        stray = [i for i in range(len(p)) if mask[i] and i not in served]
        assert not stray, (s["id"], stray[:5])


def thinking_on(fleet: Path, model: Path, tmp: Path, *, max_tokens: int) -> Tokenized:
    """12 prompts with thinking on and no grammar: the random model never writes </think>, so
    the engine's qwen3 parser puts each answer all in the reasoning; the ``cut`` domain (every
    fourth) is cut by a 6-token limit, while thinking."""
    config = tmp / "gen.yaml"
    config.write_text(json.dumps({"overrides": [{"domain": "cut", "max_tokens": 6}]}))
    rows = [
        {
            "id": f"t{i}",
            "domain": "cut" if i % 4 == 3 else "general",
            "messages": [{"role": "user", "content": f"Think about case {i}."}],
        }
        for i in range(12)
    ]
    return generate_and_tokenize(
        fleet, model, tmp, rows, "--reasoning", "on", "--max-tokens", str(max_tokens),
        "--config", str(config),
    )  # fmt: skip


def check_thinking_on(t: Tokenized) -> None:
    """Answers without </think> (all reasoning) and answers cut while thinking keep every
    served sample: checked by decoding the served ids against the stored text."""
    turns = [r["turns"][0] for r in t.rows]
    unclosed = [x for x in turns if x["reasoning"] and not x["content"]]
    assert len(unclosed) >= 8, turns  # all the text in the reasoning, as the parser puts it
    cut = [x for r, x in zip(t.rows, turns, strict=True) if r["domain"] == "cut"]
    assert len(cut) == 3 and all(x["finish_reason"] == "length" for x in cut), cut
    assert all(x["reasoning"] and not x["content"] for x in cut)  # cut while thinking
    c = t.counts
    assert c["samples"] + c.get("dropped.too_few_loss_tokens", 0) == 12, c
    assert c["verified.decoded"] >= 8 and c["reasoning.unclosed"] >= 8, c
    assert c["verified"] + c.get("unverifiable", 0) == 12, c


def thinking_off_multi_turn(fleet: Path, model: Path, tmp: Path) -> Tokenized:
    """Thinking off (``chat_template_kwargs``): the text is content and the served prompt ends
    with the empty think block. Two-turn prompts are regenerated: the second request shows the
    target's own first answer, not the dataset's, and each sample is its turn's served ids.

    The random model rarely ends a turn by itself and a cut turn ends a conversation, so the
    digits 8 and 9 (frequent in its text) are stop strings: turns end with ``stop``."""
    rows: list[dict[str, Any]] = []
    for i in range(6):
        messages = [{"role": "user", "content": f"First question {i}?"}]
        if i % 2:
            messages += [
                {"role": "assistant", "content": "(the dataset's own answer)"},
                {"role": "user", "content": f"And a follow-up {i}?"},
            ]
        rows.append({"id": f"m{i}", "messages": messages})
    config = tmp / "gen.yaml"
    config.write_text(json.dumps({"sampling": {"stop": ["8", "9"]}}))
    t = generate_and_tokenize(
        fleet, model, tmp, rows, "--reasoning", "off", "--max-tokens", "32", "--config",
        str(config),
    )  # fmt: skip
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    two = 0
    for r in t.rows:
        multi = int(r["id"][1:]) % 2 == 1
        turns = r["turns"]
        # a multi-turn prompt stops early only at a turn cut by the token limit
        assert len(turns) == (2 if multi and turns[0]["finish_reason"] != "length" else 1), r
        for turn in turns:
            assert not turn["reasoning"], turn
            prompt = tok.decode(turn["prompt_token_ids"], skip_special_tokens=False)
            assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), prompt
        if len(turns) == 2:
            two += 1
            second = tok.decode(turns[1]["prompt_token_ids"], skip_special_tokens=False)
            assert "(the dataset's own answer)" not in second  # regenerated
            first = "".join((turns[0]["content"] or "").split())
            assert first in "".join(second.split())  # the target's own first answer
    assert two >= 2, [r["turns"] for r in t.rows]
    return t


PAIRS = 12  # pairs cancel_frees_the_slot tries (a pair the twin ends first is inconclusive)


def cancel_frees_the_slot(url: str, engine: str, model: str, max_tokens: int) -> float:
    """Send two identical long requests, cancel one as the dispatcher cancels a hedge's losing
    copy (its task), and return how long the server took to drop it from its own counts (running
    plus waiting) while the twin still ran. A pair whose twin ends before that can be seen (a
    loaded machine) is inconclusive and sent again, five times at most."""
    return asyncio.run(_cancel_frees_the_slot(url, engine, model, max_tokens))


async def _cancel_frees_the_slot(url: str, engine: str, model: str, max_tokens: int) -> float:
    import aiohttp

    from draftdata.generate.config import Sampling
    from draftdata.generate.engine.client import EndpointClient
    from draftdata.generate.engine.request import Request
    from draftdata.records import Message
    from draftdata.shared.endpoints import probe_load

    request = Request(
        model=model,
        messages=[Message(role="user", content="Count to a thousand.")],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.0),
        extra_body={"ignore_eos": True},
    )

    async def held(session: aiohttp.ClientSession) -> int:
        # running + waiting: a request the server preempted into its queue still holds a place
        load = await probe_load(session, url, engine)
        assert load is not None, f"{url} reports no load"
        return load.running + load.waiting

    class TooShort(Exception):
        """The twin ended before the check could tell: inconclusive, tried again."""

    async def until(
        session: aiohttp.ClientSession,
        want: int,
        limit: float,
        kept: asyncio.Task[Any] | None = None,
    ) -> float:
        t0 = time.monotonic()
        while (n := await held(session)) != want:
            if kept is not None and kept.done():
                raise TooShort
            assert time.monotonic() - t0 < limit, f"{url}: holds {n} requests, waited for {want}"
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    async with (
        EndpointClient(url) as loser,
        EndpointClient(url) as twin,
        aiohttp.ClientSession() as session,
    ):
        # a pair is too quick to watch when the twin ends before the server looks at the lost
        # copy's connection (SGLang: every few seconds), as a loaded machine or a fast one
        # makes it: up to PAIRS pairs
        for _ in range(PAIRS):
            await until(session, 0, 60)
            lost = asyncio.create_task(loser.chat(request))
            kept = asyncio.create_task(twin.chat(request))
            try:
                await until(session, 2, 60, kept)
                lost.cancel()
                freed = await until(session, 1, 60, kept)
                if kept.done():
                    raise TooShort
            except TooShort:
                for task in (lost, kept):
                    task.cancel()
                await asyncio.gather(lost, kept, return_exceptions=True)
                continue
            kept.cancel()
            await asyncio.gather(lost, kept, return_exceptions=True)
            await until(session, 0, 60)
            # the clients stay usable: the cancelled one's connection was dropped, not poisoned
            await loser.chat(request.with_max_tokens(2))
            return freed
        raise AssertionError(
            f"{url}: in {PAIRS} pairs of {max_tokens}-token requests the twin ended before the "
            "server dropped the cancelled copy: it kept its slot, or the requests are too short"
        )


_CAPACITY = re.compile(
    r"endpoint (?P<url>\S+): (?P<engine>\w+), model (?P<model>\S+), capacity (?P<capacity>\d+) "
    r"\(KV cache (?P<kv>\d+) tokens / ~(?P<held>\d+) a request, running cap (?P<cap>\w+)\), "
    r"concurrency (?P<concurrency>\d+) \(auto\)"
)


def capacity_line(stderr: str) -> dict[str, Any]:
    """The figures of generate's endpoint line (capacity from the KV cache)."""
    m = _CAPACITY.search(stderr)
    assert m is not None, f"no capacity line with a KV cache in:\n{stderr[-3000:]}"
    out: dict[str, Any] = m.groupdict()
    for k in ("capacity", "kv", "held", "concurrency"):
        out[k] = int(out[k])
    out["cap"] = None if out["cap"] == "none" else int(out["cap"])
    return out


def canary_answered(url: str, model: str) -> None:
    """``Caller.ask_again`` against the engine at ``url`` serving ``model`` (module docstring):
    a canary that failed there would decide nothing, and a fleet that changed mid-run would
    again record each of its remaining prompts as failed."""
    from draftdata.generate.config import GenerateConfig
    from draftdata.generate.engine.caller import Caller
    from draftdata.generate.engine.client import EndpointClient
    from draftdata.generate.engine.endpoint import Endpoint
    from draftdata.generate.engine.work import plan
    from draftdata.records import Message, Prompt

    prompt = Prompt(id="p", messages=[Message(role="user", content="Say something.")])

    async def ask(reasoning: str, n: int) -> None:
        config = GenerateConfig(
            prompts="p", out="o", endpoints=[url], reasoning=reasoning, n=n, model=model
        )
        (job,), _ = plan(prompt, config, lambda *_: False)
        client = EndpointClient(url)
        try:
            ep = Endpoint(
                url, client, index=0, concurrency=1, default_concurrency=1, breaker_failures=3
            )
            caller = Caller(config, model=model)
            await caller.ask_again(job, ep)
            # a conversation's canary is its last request, with the target's turn before it
            history = [
                Message(role="user", content="Say something."),
                Message(role="assistant", content="Something."),
                Message(role="user", content="Again."),
            ]
            await caller.ask_again(job, ep, history)
        finally:
            await client.close()

    for reasoning, n in [("on", 1), ("off", 2), ("server", 3)]:
        asyncio.run(ask(reasoning, n))
