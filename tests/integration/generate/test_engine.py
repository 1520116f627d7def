"""The generate engine against the simulator over real sockets: dispatch, shapes, faults."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, failures, fast_config, write_prompts

from draftdata.errors import ConfigError
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet

pytestmark = pytest.mark.integration


def sim(flavor: str = "sglang", **kw: Any) -> SimConfig:
    faults = kw.pop("faults", FaultConfig())
    base: dict[str, Any] = {
        "time_scale": 0.002,
        "mean_output_tokens": 60,
        "output_sigma": 0.3,
        "max_running": 16,
    }
    base.update(kw)
    return SimConfig(flavor=flavor, faults=faults, **base)  # type: ignore[arg-type]


def test_slow_endpoint_gets_work_in_proportion_to_speed(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 200)
    cfg = sim(
        time_scale=0.15,
        mean_output_tokens=40,
        output_sigma=0.05,
        max_running=8,
        faults=FaultConfig(slow={1: 3.0}),
    )
    with SimFleet(2, cfg) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls, hedge=False))
        served = [fleet.stats(i).served for i in range(2)]
    assert summary.completed == 200
    by_url = {e.url: e.completed for e in summary.endpoints}
    assert sorted(by_url.values()) == sorted(served)
    slow_share = served[1] / sum(served)
    # speed 1 : 1/3 -> the slow one should do about a quarter of the work
    assert 0.12 <= slow_share <= 0.36, served
    assert abs(sum(e.share for e in summary.endpoints) - 1.0) < 0.01


def test_crash_and_restart_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 400)
    faults = FaultConfig(crash_after={1: 40}, restart_after=0.2, starting_s=0.1)
    with SimFleet(3, sim(time_scale=0.1, faults=faults)) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls))
        stats = fleet.stats(1)
    assert stats.crashes == 1 and stats.restarts == 1
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (400, 0)
    assert summary.completed == 400 and not summary.failed
    ep1 = summary.endpoints[1]
    assert ep1.downs >= 1 and ep1.errors.get("connection", 0) >= 1
    assert ep1.state == "up"  # probed and re-admitted after the restart


@pytest.mark.parametrize(
    ("knob", "error_class"),
    [
        ("error_500", "server_error"),
        ("error_503", "server_error"),
        ("error_429", "rate_limited"),
        ("reset", "connection"),
        ("malformed", "malformed"),
        ("hang", "timeout"),
    ],
)
@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_retryable_faults_are_retried_and_committed(
    tmp_path: Path, knob: str, error_class: str, flavor: str
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60)
    faults = FaultConfig(server=0, retry_after_s=0, **{knob: 0.3})  # type: ignore[arg-type]
    with SimFleet(2, sim(flavor, faults=faults)) as fleet:
        summary = generate(
            fast_config(prompts, tmp_path / "run", fleet.urls, read_timeout=0.5, hedge=False)
        )
        injected = fleet.stats(0).faults.get(knob, 0)
    assert injected > 0
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (60, 0)
    assert summary.endpoints[0].errors.get(error_class, 0) >= 1
    assert summary.retries >= 1
    assert any(c.attempts > 1 for c in completions(tmp_path / "run"))


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_context_length_is_a_failure_without_retry(tmp_path: Path, flavor: str) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60)
    # a strict limit: a context-length answer to a computed or lowerable limit is first retried
    # with a smaller one (test_output_limit.py)
    strict = {"max_tokens": 256, "strict_limit": True}
    with SimFleet(1, sim(flavor, faults=FaultConfig(context_400=0.2))) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls, **strict))
        injected = fleet.stats(0).faults["context_400"]
        # resume: fatal failures are settled, nothing is sent again
        again = generate(fast_config(prompts, tmp_path / "run", fleet.urls, **strict))
    assert again.requests == 0 and again.already_done == 60
    comp, fail = check_exactly_once(str(tmp_path / "run"), set(ids))
    assert fail == injected > 0 and comp == 60 - injected
    recorded = failures(tmp_path / "run")
    assert {f.reason for f in recorded} == {"context_length"}
    assert all(f.attempts == 1 for f in recorded)
    assert summary.failed == {"context_length": injected}


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_a_limit_longer_than_the_context_is_lowered_or_refused_never_a_prompt_failure(
    tmp_path: Path, flavor: str
) -> None:
    """A limit no request can fit is the configuration's fault: each request gets the room its
    prompt leaves (counted), or with --strict-limit the command is refused before anything is
    sent or recorded. (It used to fail every prompt as context_length.)"""
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 4)
    with SimFleet(1, sim(flavor, context_length=256)) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls, max_tokens=1000))
        with pytest.raises(ConfigError, match="cannot fit the context of 256 tokens"):
            generate(
                fast_config(
                    prompts, tmp_path / "strict", fleet.urls, max_tokens=1000, strict_limit=True
                )
            )
        assert fleet.stats(0).requests == 4
    assert summary.failed == {} and summary.completed == 4 and summary.clamped == 4
    assert all(c.sampling["max_tokens"] < 256 for c in completions(tmp_path / "run"))
    assert not (tmp_path / "strict").exists()


def test_exhausted_retries(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 5)
    with SimFleet(1, sim(faults=FaultConfig(error_500=1.0))) as fleet:
        summary = generate(
            fast_config(prompts, tmp_path / "run", fleet.urls, max_attempts=3, breaker_failures=99)
        )
        assert fleet.stats(0).faults["error_500"] == 15
    recorded = failures(tmp_path / "run")
    assert summary.failed == {"exhausted_retries": 5}
    assert {f.attempts for f in recorded} == {3}
    assert all("server_error" in f.message for f in recorded)


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
@pytest.mark.parametrize("reasoning", ["on", "off"])
def test_shapes_tools_multi_turn_and_samples(tmp_path: Path, flavor: str, reasoning: str) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 30, kind="mixed")
    with SimFleet(2, sim(flavor, tool_call_rate=0.9)) as fleet:
        summary = generate(
            fast_config(prompts, tmp_path / "run", fleet.urls, reasoning=reasoning, n=2)
        )
    got = completions(tmp_path / "run")
    assert summary.completed == 60 and len(got) == 60
    assert Counter((c.id, c.sample) for c in got) == Counter((i, s) for i in ids for s in (0, 1))
    for c in got:
        kind = c.id.split("-")[0]
        assert len(c.turns) == (2 if kind == "multi" else 1)
        for t in c.turns:
            assert t.finish_reason in ("stop", "tool_calls", "length")
            assert (t.reasoning is not None) == (reasoning == "on") or t.finish_reason == "length"
            assert t.output_token_ids and len(t.output_token_ids) == t.usage.completion_tokens
            assert not (t.content or "").lstrip().startswith("<think>")
        assert c.sampling["chat_template_kwargs"] == {"enable_thinking": reasoning == "on"}
        assert c.model == "Qwen3.6-27B-sim" and c.endpoint in fleet.urls
        assert c.usage.completion_tokens == sum(t.usage.completion_tokens for t in c.turns)
    assert any(t.tool_calls for c in got if c.id.startswith("tools") for t in c.turns)
    assert not any(t.tool_calls for c in got if c.id.startswith("plain") for t in c.turns)
    # the two samples of a multi-turn prompt are independent conversations
    multi = [c for c in got if c.id.startswith("multi")]
    assert {c.sample for c in multi} == {0, 1}


def test_hedged_tail_commits_once(tmp_path: Path) -> None:
    """A 10x slow endpoint holds the tail (its first requests, sent before speeds were known,
    are far from done when the rest is); idle ones copy them; one answer wins."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 30)
    cfg = sim(
        time_scale=0.05,
        mean_output_tokens=30,
        output_sigma=0.2,
        max_running=4,
        faults=FaultConfig(slow={0: 10.0}),
    )
    with SimFleet(3, cfg) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls, hedge_min_age=0.2))
        time.sleep(0.2)  # let the server see the losers' disconnects
        cancelled = fleet.stats(0).cancelled
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (30, 0)
    assert summary.hedges >= 1 and summary.hedges_won >= 1
    assert summary.hedges == summary.hedges_won + summary.hedges_wasted
    assert cancelled >= 1  # the slow server's copy was cancelled, not left running


@pytest.mark.parametrize("n", [1, 2])
def test_interrupt_commits_what_finished_and_resumes(tmp_path: Path, n: int) -> None:
    """The engine's graceful stop (what SIGINT calls): committed work is kept, the rest resumes.
    With n=2 a prompt may stop with one sample settled: the reader skips only prompts whose
    samples are all settled, and the resume answers exactly the missing samples."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 200)
    stop = threading.Event()

    def on_engine(engine: Any) -> None:  # on the engine's loop, before it starts
        loop = asyncio.get_running_loop()

        def watch() -> None:  # interrupt once some answers are in (whatever the machine's load)
            while not stop.is_set() and engine.tally.completed < 20:
                time.sleep(0.01)
            if not stop.is_set():
                with contextlib.suppress(RuntimeError):  # the loop may just have closed
                    loop.call_soon_threadsafe(engine.interrupt)

        threading.Thread(target=watch, daemon=True).start()

    with SimFleet(2, sim(time_scale=0.05)) as fleet:
        cfg = fast_config(prompts, tmp_path / "run", fleet.urls, grace_seconds=0.0, n=n)
        try:
            first = generate(cfg, on_engine=on_engine)
        finally:
            stop.set()
        assert first.interrupted and 0 < first.completed < 200 * n
        assert first.remaining == 200 * n - first.completed
        second = generate(cfg)
    assert not second.interrupted
    assert second.already_done == first.completed
    assert second.completed == 200 * n - first.completed
    got = Counter((c.id, c.sample) for c in completions(tmp_path / "run"))
    assert got == Counter((i, s) for i in ids for s in range(n))
    if n == 1:
        assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (200, 0)


def test_partitions_and_limit_share_one_run(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60)
    out = tmp_path / "run"
    with SimFleet(2, sim()) as fleet:
        tried = generate(fast_config(prompts, out, fleet.urls, limit=10))
        assert tried.completed == 10 and tried.total == 10
        parts = [
            generate(fast_config(prompts, out, fleet.urls, partition=f"{i}/3", writer_id=f"w{i}"))
            for i in range(3)
        ]
    assert sum(p.completed + p.already_done for p in parts) == 60
    assert sum(p.already_done for p in parts) == 10
    assert check_exactly_once(str(out), set(ids)) == (60, 0)
    writers = {f.name.split("-")[1] for f in (out / "completions").glob("*.parquet")}
    assert {"w0", "w1", "w2"} <= writers


def test_rich_progress_and_metrics_snapshots(tmp_path: Path) -> None:
    import json

    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 40)
    with SimFleet(2, sim(time_scale=0.5)) as fleet:  # two waves of ~0.7 s
        summary = generate(
            fast_config(prompts, tmp_path / "run", fleet.urls, metrics_interval=0.3),
            live=True,
        )
    assert summary.completed == 40
    snaps = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "metrics").glob("*"))]
    assert snaps[-1]["kind"] == "summary" and snaps[-1]["completed"] == 40
    progress = [s for s in snaps if s["kind"] == "progress"]
    assert progress and set(progress[0]["endpoints"]) == set(fleet.urls)
    assert all(len(row) == 4 for s in progress for row in s["series"])


def test_endpoint_down_at_start_joins_when_it_comes_up(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 150)
    with SimFleet(2, sim(time_scale=0.2, max_running=8)) as fleet:
        fleet.crash(1)
        timer = threading.Timer(0.5, fleet.restart, args=(1,))
        timer.start()
        try:
            summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls))
        finally:
            timer.cancel()
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (150, 0)
    assert summary.endpoints[1].completed > 0 and summary.endpoints[0].completed > 0


def test_bad_prompt_lines_are_skipped_counted_and_written_to_rejects(tmp_path: Path) -> None:
    import json

    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 4)
    with prompts.open("a", encoding="utf-8") as f:
        f.write('{"id": "no-messages"}\n')
        f.write("{not json\n")
    ids += write_prompts(prompts, 2, start=10)
    with SimFleet(1, sim()) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls))
        again = generate(fast_config(prompts, tmp_path / "run", fleet.urls))  # resume
    assert summary.completed == 6 and summary.invalid_prompts == 2
    assert again.completed == 0 and again.invalid_prompts == 2
    check_exactly_once(str(tmp_path / "run"), set(ids))
    lists = sorted((tmp_path / "run" / "rejects").glob("*.jsonl"))
    assert len(lists) == 2  # one per command, never replaced
    rows = [json.loads(line) for line in lists[0].read_text().splitlines()]
    assert [r["location"] for r in rows] == [f"{prompts}:5", f"{prompts}:6"]
    assert rows[1]["line"] == "{not json"
    assert all(r["reason"] for r in rows)


def test_recovered_server_gets_its_full_share_at_once(tmp_path: Path) -> None:
    """A server down for an outage is re-admitted within a fraction of a second of answering
    again (even with a long probe_interval), and at once runs its full probed capacity.

    The outage follows the engine, not the clock: it starts once server 1 runs full, and the
    server comes back once the engine has taken it out (a timer from the test's start crashed
    it while a loaded machine was still starting the engine, or brought it back before the
    engine had noticed, and nothing was tested). "At once" is counted in dispatch passes."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 500)
    # after each dispatch pass: (time, state, inflight, limit) of server 1
    passes: list[tuple[float, str, int, int]] = []
    back: list[float] = []
    full, down = threading.Event(), threading.Event()
    with SimFleet(2, sim(time_scale=0.05, max_running=16)) as fleet:

        def outage() -> None:
            full.wait(120)
            fleet.crash(1)
            down.wait(120)  # out of the engine's fleet: now it may answer again
            fleet.restart(1)
            back.append(time.monotonic())

        def watch(engine: Any) -> None:
            d, ep = engine.dispatcher, engine.endpoints[1]
            place = d._place

            def recorded(now: float) -> None:
                place(now)
                state, inflight, limit = ep.breaker.state, ep.slots.inflight, ep.concurrency.limit
                passes.append((time.monotonic(), state, inflight, limit))
                if state == "up" and inflight >= limit - 1 and not back:
                    full.set()
                elif state == "down" and full.is_set():
                    down.set()

            d._place = recorded

        crash = threading.Thread(target=outage, daemon=True)
        crash.start()
        try:
            cfg = fast_config(prompts, tmp_path / "run", fleet.urls, probe_interval=30.0)
            summary = generate(cfg, on_engine=watch)
        finally:
            full.set()
            down.set()
            crash.join(130)
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (500, 0)
    assert summary.endpoints[1].downs == 1
    assert back, "server 1 never ran full, or was never taken out"
    out = next(i for i, p in enumerate(passes) if p[1] == "down")
    up = next((i for i in range(out, len(passes)) if passes[i][1] == "up"), None)
    assert up is not None, "never re-admitted before the run ended"
    t_up, _, inflight, limit = passes[up]
    assert t_up - back[0] < 5.0  # probed every 0.2 s at first, not every probe_interval (30 s)
    assert limit >= 16  # its probed capacity, not a ramp
    assert inflight >= limit - 1, passes[up - 1 : up + 3]  # its full share in the first pass


def _mixed_prompts(path: Path, n: int) -> None:
    import json

    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            d = ("math", "tool")[(i * 7 // 3) % 2]
            row = {
                "id": f"m{i}",
                "domain": d,
                "messages": [{"role": "user", "content": f"{d} q{i}"}],
            }
            f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("order", ["length", "file"])
def test_long_domain_goes_first_and_resume_seeds_the_estimate(tmp_path: Path, order: str) -> None:
    """Against the simulator with per-domain lengths: once learnt, the long domain is sent
    first (file order with the off switch); a resumed run starts from its own history."""
    prompts = tmp_path / "p.jsonl"
    _mixed_prompts(prompts, 160)
    cfg = sim(time_scale=0.0005, max_running=4, mean_output_tokens_for={"math": 400, "tool": 10})
    lines: list[str] = []
    with SimFleet(1, cfg) as fleet:
        first = fast_config(prompts, tmp_path / "run", fleet.urls, order=order, limit=40)
        generate(first, log=lines.append)
        summary = generate(
            fast_config(prompts, tmp_path / "run", fleet.urls, order=order, concurrency=2),
            log=lines.append,
        )
    assert summary.completed == 120
    assert any("known from 40 committed answers of the run" in line for line in lines)
    got = sorted(completions(tmp_path / "run"), key=lambda c: c.created - c.latency_s)
    resumed = [c.domain for c in got if int(c.id[1:]) >= 40]
    k = resumed.count("math")
    if order == "length":
        assert resumed[:k].count("math") >= 0.9 * k  # math first, from the start (seeded)
    else:
        assert resumed[:k].count("math") < 0.7 * k


def test_hostile_prompt_lines_are_rejects_and_every_valid_line_is_generated(
    tmp_path: Path,
) -> None:
    import json

    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 24)
    body = prompts.read_bytes().splitlines(keepends=True)
    hostile = [
        b'{"id": "deep", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
        b"[" * 5000 + b"\n",
        b'{"id": "orphan", "messages": [{"role": "user", "content": "q"}, '
        b'{"role": "tool", "content": "r"}]}\n',
        b'{"id": "meta-deep", "messages": [{"role": "user", "content": "q"}], "meta": {"x": '
        + b"[" * 300
        + b"]" * 300
        + b"}}\n",
        b"\xff\xfe\x00garbage\n",
    ]
    mixed = [body[0], *hostile[:2], *body[1:12], *hostile[2:], *body[12:]]
    prompts.write_bytes(b"\xef\xbb\xbf" + b"".join(mixed))  # the mark many Windows tools write
    with SimFleet(1, sim()) as fleet:
        summary = generate(fast_config(prompts, tmp_path / "run", fleet.urls))
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (24, 0)
    assert summary.completed == 24 and summary.invalid_prompts == len(hostile)
    rows = [
        json.loads(line)
        for f in (tmp_path / "run" / "rejects").glob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    linenos = [int(r["location"].rpartition(":")[2]) for r in rows]
    assert linenos == [2, 3, 15, 16, 17]
    reasons = [r["reason"] for r in rows]
    assert "nesting deeper than" in reasons[0] and "tool message without" in reasons[2]


def test_a_server_that_stops_answering_is_taken_out_and_its_requests_moved(
    tmp_path: Path,
) -> None:
    """A server that answered, then wedged (a deadlocked engine: /health still passes, every
    request it holds and gets makes no progress): once it has answered none for
    ``stall_after`` while the others answered plenty, it is taken out, its requests requeued
    uncharged elsewhere, and the run ends without waiting for the read timeout. It held its
    requests until the read timeout (an hour by default), then its health check re-admitted
    it and it wedged the next ones."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 400)
    lines: list[str] = []
    with SimFleet(3, sim(time_scale=0.05, max_running=16)) as fleet:

        def wedge_when_warm() -> None:
            deadline = time.monotonic() + 60
            while fleet.stats(1).served < 10 and time.monotonic() < deadline:
                time.sleep(0.02)
            fleet.wedge(1)

        wedger = threading.Thread(target=wedge_when_warm, daemon=True)
        wedger.start()
        cfg = fast_config(prompts, tmp_path / "run", fleet.urls, stall_after=1.0, read_timeout=60)
        t0 = time.monotonic()
        summary = generate(cfg, log=lines.append, handle_signals=False)
        took = time.monotonic() - t0
        wedger.join(5)
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (400, 0)
    said = [x for x in lines if "stopped answering" in x]
    assert said and fleet.urls[1] in said[0], lines
    assert summary.endpoints[1].downs >= 1 and summary.failures == 0
    assert took < 15, took  # not the read timeout (60 s), nor the tail hedge at 1.5x the cap
