"""Pure parts of the engine: concurrency control, prompt scanning, run settings, progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.generate.fakes import FakeClient, endpoint

from draftdata.errors import ConfigError, EmptyInputError, InputError
from draftdata.generate.config import GenerateConfig, Override, Sampling, validate
from draftdata.generate.engine.progress import Progress
from draftdata.generate.engine.work import plan, prefix_key
from draftdata.generate.preflight import endpoint_urls, run_settings
from draftdata.generate.prompts.partition import Partition, count_by_partition
from draftdata.generate.prompts.source import PromptReader, prompt_files, scan
from draftdata.generate.summary import Tally
from draftdata.records import Completion, Failure, Message, Prompt, Turn, Usage
from draftdata.shared.endpoints import Capacity, Load


def test_auto_concurrency_starts_from_capacity_and_follows_the_queue() -> None:
    ep = endpoint(0, FakeClient(), concurrency="auto", limit=32)
    assert ep.concurrency.limit == 32  # nothing reported: the configured default
    ep.set_capacity(Capacity(engine="sglang", max_running=64))
    assert ep.concurrency.limit == 64 + 4  # capacity plus a short queue (5%, at least 2)
    ep.slots.inflight = 68
    assert ep.adapt(Load(running=64, waiting=3)) is None  # waiting in the band: keep
    # too many waiting (other clients too): running + 4, which it already is
    assert ep.adapt(Load(running=64, waiting=40)) is None and ep.concurrency.limit == 68
    ep.concurrency.limit = 90
    ep.adapt(Load(running=64, waiting=3))
    assert ep.adapt(Load(running=64, waiting=30)) is None  # once may be a burst
    assert ep.adapt(Load(running=64, waiting=30)) == 81  # twice: shrink by 10%
    ep.adapt(Load(running=64, waiting=30))
    ep.adapt(Load(running=64, waiting=30))
    ep.adapt(Load(running=64, waiting=30))
    assert ep.concurrency.limit == 68  # ... but never below running + target
    ep.slots.inflight = ep.concurrency.limit
    assert ep.adapt(Load(running=64, waiting=0)) is None  # at its capacity: no point growing
    grown = ep.adapt(Load(running=50, waiting=0))  # below capacity, nothing waits: grow
    assert grown == 80  # up to capacity + a quarter (requests in transit)
    unknown = endpoint(2, FakeClient(), concurrency="auto", limit=32)
    unknown.set_capacity(Capacity(engine="vllm"))
    unknown.slots.inflight = 32
    assert unknown.adapt(Load(running=32, waiting=0)) == 40  # vLLM: found by growing
    fixed = endpoint(1, FakeClient(), concurrency=12)
    fixed.set_capacity(Capacity(engine="sglang", max_running=64))
    assert fixed.concurrency.limit == 12 and fixed.adapt(Load(running=0, waiting=50)) is None


def test_breaker_counts_only_retryable_failures_in_a_row() -> None:
    ep = endpoint(0, FakeClient(), breaker_failures=3)
    assert not ep.record_failure("timeout", retryable=True)
    assert not ep.record_failure("context_length", retryable=False)
    assert not ep.record_failure("timeout", retryable=True)
    ep.record_success(10, 5, latency=1.0)
    assert not ep.record_failure("timeout", retryable=True)
    assert not ep.record_failure("timeout", retryable=True)
    assert ep.record_failure("timeout", retryable=True)
    ep.breaker.mark_down()
    ep.breaker.mark_up(half_open=True)
    assert ep.record_failure("connection", retryable=True)  # one more failure: out again


def _prompts(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"id{i}", "messages": [{"role": "user", "content": "q"}]}))
            f.write("\n\n" if i == 3 else "\n")
    return path


def test_scan_counts_scope_and_hashes_content(tmp_path: Path) -> None:
    p = _prompts(tmp_path / "a.jsonl", 40)
    whole = scan([p], limit=None, partition=None)
    assert whole.prompts == whole.in_scope == 40
    assert scan([p], limit=10, partition=None).in_scope == 10
    parts = [scan([p], limit=None, partition=Partition(i, 3)).in_scope for i in range(3)]
    assert parts == count_by_partition(p, 3) and sum(parts) == 40
    q = _prompts(tmp_path / "b.jsonl", 41)
    assert scan([q], limit=None, partition=None).sha256 != whole.sha256
    reader = PromptReader([p], limit=None, partition="1/3")
    got = reader.take(1000)
    assert len(got) == parts[1] and reader.exhausted


def test_reader_skips_bad_lines_with_their_location(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a", "messages": [{"role": "user", "content": "q"}]}\nnot json\n')
    errors: list[str] = []
    got = PromptReader([p], on_invalid=errors.append).take(10)
    assert [x.id for x in got] == ["a"]
    assert len(errors) == 1 and errors[0].startswith(f"{p}:2: not valid JSON")


def test_reader_skips_settled_prompts_before_parsing_them(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text(
        '{"id": "a", "messages": [{"role": "user", "content": "q"}]}\n'
        '{"id": "b", "messages": "settled lines are not parsed"}\n'
        '{"id": "c", "messages": [{"role": "user", "content": "q"}]}\n'
        "not json\n"
    )
    errors: list[str] = []
    asked: list[list[str]] = []

    def settled(ids: list[str]) -> list[int]:
        asked.append(ids)
        return [2 if pid in ("b", "c") else 0 for pid in ids]

    reader = PromptReader([p], on_invalid=errors.append, settled=settled)
    assert [x.id for x in reader.take(10)] == ["a"]
    assert reader.settled_samples == 4
    assert len(errors) == 1 and errors[0].startswith(f"{p}:4:")
    assert asked == [["a", "b", "c"]]  # one done-set lookup per block, never the bad line


def test_reader_asks_the_done_set_a_block_at_a_time(tmp_path: Path) -> None:
    from draftdata.generate.prompts.source import BLOCK

    a = _prompts(tmp_path / "a.jsonl", BLOCK + 10)
    b = tmp_path / "b.jsonl"
    b.write_text('{"id": "b1", "messages": [{"role": "user", "content": "q"}]}\n')
    sizes: list[int] = []
    new = {f"id{i}" for i in range(0, BLOCK + 10, 7)} | {"b1"}

    def settled(ids: list[str]) -> list[int]:
        sizes.append(len(ids))
        return [0 if pid in new else 1 for pid in ids]

    reader = PromptReader([a, b], limit=BLOCK + 11, settled=settled)
    got = [x.id for x in reader.take(10 * BLOCK)]
    assert sizes == [BLOCK, 11]  # blocks span files; the limit ends the last one
    assert sorted(got) == sorted(new) and got[-1] == "b1" and reader.exhausted
    assert reader.read == BLOCK + 11 and reader.settled_samples == BLOCK + 11 - len(new)


def test_reader_leaves_other_partitions_lines_unparsed(tmp_path: Path) -> None:
    from draftdata.generate.prompts.partition import partition_of

    lines = [f'{{"id": "p{i}", "messages": "bad"}}' for i in range(30)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    errors: list[str] = []
    PromptReader([tmp_path / "p.jsonl"], partition="0/3", on_invalid=errors.append).take(100)
    mine = sum(partition_of(f"p{i}", 3) == 0 for i in range(30))
    assert 0 < len(errors) == mine < 30  # each bad line is reported by its own partition only


def test_prompt_files_takes_prepare_output_folders(tmp_path: Path) -> None:
    for name in ("prompts-00001.jsonl", "prompts-00000.jsonl", "rejects.jsonl"):
        (tmp_path / name).write_text("{}\n")
    assert [f.name for f in prompt_files(str(tmp_path))] == [
        "prompts-00000.jsonl",
        "prompts-00001.jsonl",
    ]
    for name in ("prompts-00001.jsonl", "prompts-00000.jsonl"):  # rejects.jsonl is no input
        (tmp_path / name).write_text("\n \n")
    with pytest.raises(EmptyInputError, match="holds nothing to read"):
        prompt_files(str(tmp_path))
    with pytest.raises(InputError, match="no such file"):
        prompt_files(str(tmp_path / "nope.jsonl"))


def test_run_settings_cover_what_changes_the_output(tmp_path: Path) -> None:
    found = scan([_prompts(tmp_path / "a.jsonl", 3)], limit=None, partition=None)
    base = GenerateConfig(prompts="p", out="o", endpoints=["http://a"])
    s0 = run_settings(base, found, "m")

    def changed(**kw: object) -> bool:
        import msgspec

        return run_settings(msgspec.structs.replace(base, **kw), found, "m") != s0

    assert changed(max_tokens=9)
    assert changed(sampling=Sampling(temperature=0.3))
    assert changed(reasoning="off")
    assert changed(overrides=[Override(domain="math", max_tokens=5)])
    assert changed(n=2)
    assert changed(extra_body={"chat_template_kwargs": {"x": 1}})
    assert run_settings(base, found, "other") != s0
    for same in (
        {"limit": 5},
        {"partition": "0/2"},
        {"endpoints": ["http://b"]},
        {"concurrency": 3},
        {"writer_id": "w"},
    ):
        assert not changed(**same), same
    assert run_settings(base, found, "m").chat_template_kwargs == {}
    on = run_settings(GenerateConfig(prompts="p", out="o", reasoning="on"), found, "m")
    assert on.chat_template_kwargs == {"enable_thinking": True}


def test_config_validation_and_endpoint_urls() -> None:
    with pytest.raises(ConfigError, match="--partition"):
        validate(GenerateConfig(prompts="p", out="o", endpoints=["http://a"], partition="2/2"))
    with pytest.raises(ConfigError, match="one or the other"):
        validate(GenerateConfig(prompts="p", out="o", endpoints=["http://a"], fleet="f.yaml"))
    cfg = GenerateConfig(endpoints=["http://a:1/v1/", "http://a:1", "http://b:2"])
    assert endpoint_urls(cfg)[0] == ["http://a:1", "http://b:2"]
    with pytest.raises(ConfigError, match="--endpoint"):
        endpoint_urls(GenerateConfig(endpoints=["localhost:30000"]))


def test_plan_per_source_settings_and_multi_turn_split() -> None:
    cfg = GenerateConfig(
        n=2,
        max_tokens=100,
        overrides=[Override(domain="math", max_tokens=7, sampling=Sampling(temperature=0.1))],
    )
    single = Prompt(id="a", domain="math", messages=[Message(role="user", content="q")])
    (job,), settled = plan(single, cfg, lambda i, s: False)
    assert job.samples == [0, 1] and job.max_tokens == 7 and job.sampling.temperature == 0.1
    assert settled == 0
    multi = Prompt(
        id="b",
        messages=[
            Message(role="user", content="1"),
            Message(role="assistant", content="x"),
            Message(role="user", content="2"),
        ],
    )
    jobs, settled = plan(multi, cfg, lambda i, s: s == 0)
    assert [j.samples for j in jobs] == [[1]] and settled == 1 and jobs[0].max_tokens == 100
    assert prefix_key(single) is None
    sys_a = Prompt(id="c", messages=[Message(role="system", content="S"), *single.messages])
    sys_b = Prompt(id="d", messages=[Message(role="system", content="S"), *multi.messages])
    assert prefix_key(sys_a) == prefix_key(sys_b) is not None


def test_progress_rates_and_eta_with_an_injected_clock() -> None:
    now = [0.0]
    counters = [0, 0, 0, 0]
    ep = endpoint(0, FakeClient())
    p = Progress([ep], lambda: tuple(counters), total=100, window=10, clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    for t in range(1, 21):
        now[0] = float(t)
        counters[:] = [t * 2, t * 2, t * 200, 0]
        p.tick()
    rw, rl, tw, _ = p.rates()
    assert rw == pytest.approx(2.0) and rl == pytest.approx(2.0)
    assert tw == pytest.approx(200.0)
    assert p.eta() == pytest.approx(30.0)  # 60 left at 2/s
    assert "40/100" in p.line()
    snap = p.snapshot()
    assert snap["done"] == 40 and snap["total"] == 100 and len(snap["series"]) == 21
    assert p.snapshot()["series"] == []


def test_tally_and_summary_lines() -> None:
    t = Tally()
    msgs = [Message(role="user", content="q")]
    t.completion(
        Completion(
            id="a",
            domain="math",
            messages=msgs,
            turns=[Turn(finish_reason="length")],
            usage=Usage(prompt_tokens=3, completion_tokens=9),
        )
    )
    t.completion(
        Completion(id="b", domain="code", messages=msgs, turns=[Turn(finish_reason="stop")])
    )
    t.failure(Failure(id="c", domain="code", reason="context_length"))
    s = t.freeze(out="run", wall_s=2.0)
    assert s.truncated == 1 and s.finish_reasons == {"length": 1, "stop": 1}
    assert s.domains["code"].failures == {"context_length": 1}
    assert s.to_dict()["output_tokens"] == 9
    text = "\n".join(s.lines())
    assert "2 completions, 1 failures (context_length 1)" in text
    assert "cut by max tokens: 1" in text and "domain math" in text
