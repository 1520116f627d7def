"""`--reasoning server --token-ids off`: each answer is rendered in the thinking mode its own
server wrote it in, whatever the fleet and the resumes did (issue 31).

The shape: servers whose templates default to thinking on or off (the simulator's
``default_thinking``) × two endpoints with any pair of defaults, or one endpoint whose default
changes between a run and its resume (a server restarted with other kwargs, unseen by generate).
For every case and every sample: the prompt ends with the empty ``<think>\\n\\n</think>\\n\\n``
exactly when the answering server's default was off, and no empty think block is ever under loss
(the target never wrote one). Nothing is dropped: each answer's mode is known, from what generate
probed on its endpoint and from the prompt tokens the server counted; and from either alone
(the run copied without the other). A run that holds neither is not rendered on a guess: every
answer is dropped and counted, unless the user states the mode (``--server-thinking``).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.records import Usage
from draftdata.sim.config import FaultConfig, SimConfig
from draftdata.sim.run import SimFleet
from draftdata.store.read import iter_completions
from draftdata.store.run import Run
from draftdata.tokenize.config import TokenizeConfig
from draftdata.tokenize.encode import TokenizeContext
from draftdata.tokenize.stage import tokenize
from draftdata.tokenize.summary import summary_lines

pytestmark = pytest.mark.integration

EMPTY_THINK = "<think>\n\n</think>\n\n"
N = 12
MODES = list(itertools.product([True, False], repeat=2))


def _prompts(path: Path) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Q {i}?"}]}) + "\n"
            for i in range(N)
        )
    )
    return path


def _generate(prompts: Path, out: Path, urls: list[str], limit: int | None = None) -> int:
    summary = generate(
        GenerateConfig(
            prompts=str(prompts),
            endpoints=urls,
            out=str(out),
            progress="plain",
            max_tokens=200,
            token_ids="off",
            limit=limit,
        ),
        handle_signals=False,
        log=lambda _line: None,
    )
    return summary.completed


def _copy(run: Path, out: Path, *, usage: bool, recorded: bool) -> Path:
    """``run`` without the prompt token counts (``usage``) or the recorded modes."""
    with Run.open(str(out), settings={"copy": True}) as copy:
        for c in iter_completions(str(run)):
            if not usage:
                turns = [msgspec.structs.replace(t, usage=Usage()) for t in c.turns]
                c = msgspec.structs.replace(c, turns=turns, usage=Usage())
            if not recorded:
                c = msgspec.structs.replace(c, server_thinking=None)
            copy.add_completion(c)
    return out


def _loss_ok(tokenizer: Path, out: Path, thinking_of: dict[str, bool]) -> None:
    ctx = TokenizeContext(str(tokenizer))
    rows = [r for p in sorted(out.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert sorted(r["id"] for r in rows) == sorted(thinking_of)
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        first = mask.index(1)
        prompt = ctx.decode(ids[:first])
        loss = ctx.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert prompt.endswith(EMPTY_THINK) == (not thinking_of[row["id"]]), (row["id"], prompt)
        assert "<think>\n\n</think>" not in loss, (row["id"], loss)


def _check(run: Path, tokenizer: Path, root: Path, thinking_of: dict[str, bool]) -> None:
    """Tokenize ``run`` and copies of it with less evidence (module docstring)."""
    for usage, recorded in [(True, True), (True, False), (False, True), (False, False)]:
        name = f"u{usage:d}r{recorded:d}"
        source = (
            run if usage and recorded else _copy(run, root / name, usage=usage, recorded=recorded)
        )
        out = root / f"tok-{name}"
        summary = tokenize(TokenizeConfig(run=str(source), tokenizer=str(tokenizer), out=str(out)))
        if not usage and not recorded:  # nothing tells: dropped and counted, never guessed
            assert summary.count("samples") == 0
            assert summary.dropped == {"thinking_unknown": N}, summary.counts
            said = [x for x in summary_lines(summary) if x.startswith("thinking mode")]
            assert said and f"unknown {N}," in said[0] and "--server-thinking" in said[0]
            modes = set(thinking_of.values())
            if len(modes) == 1:  # the user knows the one mode: stated, it is rendered so
                stated = tokenize(
                    TokenizeConfig(
                        run=str(source),
                        tokenizer=str(tokenizer),
                        out=str(root / "stated"),
                        server_thinking=modes.pop(),
                    )
                )
                assert stated.count("thinking.stated") == N
                assert stated.settings["server_thinking"] in (True, False)
                _loss_ok(tokenizer, root / "stated", thinking_of)
            continue
        assert summary.count("samples") == N, summary.counts
        assert not summary.dropped, summary.counts
        _loss_ok(tokenizer, out, thinking_of)
        source_of = "prompt_tokens" if usage else "recorded"
        assert summary.count(f"thinking.{source_of}") == N, summary.counts


@pytest.mark.parametrize(("first", "second"), MODES)
def test_two_endpoints_with_their_own_defaults(
    demo_tokenizer: Path, tmp_path: Path, first: bool, second: bool
) -> None:
    sim = SimConfig(
        tokenizer=str(demo_tokenizer),
        time_scale=0,
        mean_output_tokens=30,
        default_thinking={0: first, 1: second},
    )
    run = tmp_path / "run"
    with SimFleet(2, sim) as fleet:
        assert _generate(_prompts(tmp_path / "p.jsonl"), run, fleet.urls) == N
        mode = {fleet.urls[0]: first, fleet.urls[1]: second}
    answered = {c.id: mode[c.endpoint] for c in iter_completions(str(run))}
    _check(run, demo_tokenizer, tmp_path, answered)


@pytest.mark.parametrize(("before", "after"), MODES)
def test_a_resume_on_a_server_whose_default_changed(
    demo_tokenizer: Path, tmp_path: Path, before: bool, after: bool
) -> None:
    sim = SimConfig(
        tokenizer=str(demo_tokenizer),
        time_scale=0,
        mean_output_tokens=30,
        default_thinking={0: before},
    )
    run, prompts = tmp_path / "run", _prompts(tmp_path / "p.jsonl")
    with SimFleet(1, sim) as fleet:
        assert _generate(prompts, run, fleet.urls, limit=N // 2) == N // 2
        fleet.set_default_thinking(0, after)  # restarted with other kwargs: generate never saw it
        assert _generate(prompts, run, fleet.urls) == N - N // 2
    answered = {f"p{i}": before if i < N // 2 else after for i in range(N)}
    _check(run, demo_tokenizer, tmp_path, answered)


@pytest.mark.parametrize(("before", "after"), MODES)
def test_a_server_restarted_mid_run_with_another_default(
    demo_tokenizer: Path, tmp_path: Path, before: bool, after: bool
) -> None:
    """The server crashes mid-run and comes back with another default: generate sees the
    connection errors, probes it again when it is back, and records no answer in a mode it
    was not written in (an answer it cannot place is recorded as unknown)."""
    faults = FaultConfig(crash_after={0: 8}, restart_after=1.0, starting_s=0.1)
    sim = SimConfig(
        tokenizer=str(demo_tokenizer),
        time_scale=0.05,
        mean_output_tokens=30,
        default_thinking={0: before},
        faults=faults,
    )
    run, prompts = tmp_path / "run", _prompts(tmp_path / "p.jsonl")
    crashed_at: list[float] = []
    with SimFleet(1, sim) as fleet:
        done = threading.Event()

        def switch() -> None:  # while it is down: it comes back with the other default
            while not done.is_set() and not fleet.stats(0).crashes:
                time.sleep(0.005)
            crashed_at.append(time.time())
            fleet.set_default_thinking(0, after)

        watcher = threading.Thread(target=switch)
        watcher.start()
        try:
            assert _generate(prompts, run, fleet.urls) == N
        finally:
            done.set()
            watcher.join()
        assert fleet.stats(0).restarts == 1
    answered = {
        c.id: before if c.created < crashed_at[0] else after for c in iter_completions(str(run))
    }
    recorded = {c.id: c.server_thinking for c in iter_completions(str(run))}
    assert all(m is None or m == answered[i] for i, m in recorded.items()), (recorded, answered)
    assert any(m is not None for m in recorded.values())
    summary = tokenize(
        TokenizeConfig(run=str(run), tokenizer=str(demo_tokenizer), out=str(tmp_path / "tok"))
    )
    assert summary.count("samples") == N and not summary.dropped, summary.counts
    _loss_ok(demo_tokenizer, tmp_path / "tok", answered)
