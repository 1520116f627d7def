"""A configured output limit that does not fit the context is a configuration error, never the
prompts' failure (issue 23).

- The gen.yaml of docs/generate.md runs as written on the 8K context of the simulator (and of
  ``fleet up``'s presets); the one the README used to show (``max_tokens: 8192``, math 16384)
  is lowered per request, said once at the start and counted in one summary line, and
  ``--strict-limit`` refuses it before anything is sent or recorded.
- Over random contexts, limits and prompt lengths (a generated test): a prompt fails only when
  it alone leaves no room in the context; every request fits; the lowered ones are counted.
- A run an older draftdata filled with ``context_length`` failures (made here with
  ``--strict-limit``) takes the fixed limit with the same command: no --allow-config-change,
  no --retry-failed, and its failures are answered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.integration.generate.helpers import completions, failures, fast_config

from draftdata.cli import main
from draftdata.errors import ConfigError
from draftdata.generate.engine.limits import MIN_LIMIT
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.sim.tokens import ApproxTokenizer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
CONTEXT = 8192  # the simulator's and fleet up's preset context


def sim(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "time_scale": 0.0,
        "mean_output_tokens": 300,
        "output_sigma": 0.5,
        "max_running": 32,
    }
    base.update(kw)
    return SimConfig(**base)


def documented_gen_yaml() -> str:
    """The ``# gen.yaml`` block of docs/generate.md, as a user copies it."""
    text = (ROOT / "docs" / "generate.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(# gen\.yaml\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/generate.md shows one gen.yaml"
    return blocks[0]


def write_prompts(path: Path, n: int, words: int = 20) -> list[str]:
    ids = []
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            domain, source = [("math", "metamath"), ("code", "code"), ("tool", "hermes")][i % 3]
            text = f"Question {i}: " + "word " * words
            row = {"id": f"q{i}", "source": source, "domain": domain}
            row["messages"] = [{"role": "user", "content": text}]
            f.write(json.dumps(row) + "\n")
            ids.append(f"q{i}")
    return ids


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


def test_the_documented_gen_yaml_runs_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = tmp_path / "gen.yaml"
    gen.write_text(documented_gen_yaml(), encoding="utf-8")
    ids = write_prompts(tmp_path / "p.jsonl", 30)
    with SimFleet(1, sim(context_length=CONTEXT)) as fleet:
        fleet.write(tmp_path / "fleet.yaml")
        argv = ["generate", "-c", str(gen), "-p", str(tmp_path / "p.jsonl")]
        argv += ["-f", str(tmp_path / "fleet.yaml"), "-o", str(tmp_path / "run")]
        code, out, err = cli([*argv, "--progress", "off"], capsys)
    assert code == 0, err
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (30, 0)
    assert "cannot fit" not in err and "output limit:" not in out


def test_a_limit_the_context_cannot_hold_is_lowered_or_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's old gen.yaml: every prompt used to be a fatal context_length failure
    (exit 0); now each request gets the room its prompt leaves, said once at the start and
    once in the summary, and --strict-limit refuses it in one line before any request."""
    gen = tmp_path / "gen.yaml"
    gen.write_text(
        'max_tokens: 8192\nreasoning: "on"\noverrides:\n  - domain: math\n    max_tokens: 16384\n',
        encoding="utf-8",
    )
    ids = write_prompts(tmp_path / "p.jsonl", 24)
    with SimFleet(1, sim(context_length=CONTEXT)) as fleet:
        argv = ["generate", "-c", str(gen), "-p", str(tmp_path / "p.jsonl"), "-e", fleet.urls[0]]
        code, out, err = cli([*argv, "-o", str(tmp_path / "run"), "--progress", "off"], capsys)
        strict_code, _, strict_err = cli(
            [*argv, "-o", str(tmp_path / "strict"), "--strict-limit"], capsys
        )
        sent = fleet.stats(0).requests
    assert code == 0, err
    assert failures(tmp_path / "run") == []
    assert check_exactly_once(str(tmp_path / "run"), set(ids)) == (24, 0)
    (start,) = [x for x in err.splitlines() if "cannot fit the context" in x]
    assert "max_tokens 8192" in start and "math: 16384" in start and "--strict-limit" in start
    (line,) = [x for x in out.splitlines() if "output limit:" in x]
    assert "24 of 24 requests" in line
    for c in completions(tmp_path / "run"):
        assert c.usage.prompt_tokens + c.sampling["max_tokens"] < CONTEXT
    assert strict_code == 1 and len(strict_err.strip().splitlines()) == 1
    assert "cannot fit the context of 8192" in strict_err and "--strict-limit" in strict_err
    assert sent == 24 and not (tmp_path / "strict").exists()


def sim_prompt_tokens(text: str) -> int:
    """The prompt tokens the simulator counts for one user message (its own tokenizer)."""
    tok = ApproxTokenizer()
    ids, _ = tok.encode(tok.render_prompt([{"role": "user", "content": text}], None, {}))
    return len(ids)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    context=st.integers(min_value=128, max_value=6000),
    limit=st.integers(min_value=1, max_value=20_000),
    words=st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=12),
    flavor=st.sampled_from(["sglang", "vllm"]),
)
def test_random_contexts_limits_and_prompts_never_fail_for_the_limit(
    tmp_path_factory: pytest.TempPathFactory,
    context: int,
    limit: int,
    words: list[int],
    flavor: str,
) -> None:
    tmp = tmp_path_factory.mktemp("limits")
    texts = {f"w{i}": "word " * n for i, n in enumerate(words)}
    with (tmp / "p.jsonl").open("w", encoding="utf-8") as f:
        for pid, text in texts.items():
            f.write(json.dumps({"id": pid, "messages": [{"role": "user", "content": text}]}))
            f.write("\n")
    config = sim(context_length=context, flavor=flavor, mean_output_tokens=200)
    with SimFleet(1, config) as fleet:
        cfg = fast_config(tmp / "p.jsonl", tmp / "run", fleet.urls, max_tokens=limit)
        summary = generate(cfg, log=lambda _line: None)
    failed = {f.id for f in failures(tmp / "run")}
    for pid in failed:  # only a prompt that leaves no room of its own
        assert sim_prompt_tokens(texts[pid]) + MIN_LIMIT + 1 >= context, pid
    assert {f.reason for f in failures(tmp / "run")} <= {"context_length"}
    got = completions(tmp / "run")
    assert {c.id for c in got} | failed == set(texts)
    for c in got:
        sent = c.sampling["max_tokens"]
        assert sent <= limit and c.usage.prompt_tokens + sent <= context
    assert summary.clamped == sum(c.sampling["max_tokens"] < limit for c in got)


def test_a_run_of_limit_failures_takes_the_fixed_limit_with_the_same_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every prompt recorded as a fatal context_length failure (as an older draftdata did with
    a limit that did not fit): the same command with a fixed limit just runs them. A run with no
    completion takes new settings (recorded in manifest-history/), and the failures the old
    settings caused are answered, not skipped."""
    write_prompts(tmp_path / "p.jsonl", 12, words=200)  # about 215 prompt tokens each
    with SimFleet(1, sim(context_length=512, mean_output_tokens=40)) as fleet:
        base = ["generate", "-p", str(tmp_path / "p.jsonl"), "-e", fleet.urls[0]]
        base += ["-o", str(tmp_path / "run"), "--progress", "off"]
        code, _, err = cli([*base, "--max-tokens", "400", "--strict-limit"], capsys)
        assert code == 0, err
        assert {f.reason for f in failures(tmp_path / "run")} == {"context_length"}
        assert len(failures(tmp_path / "run")) == 12
        code, out, err = cli([*base, "--max-tokens", "200"], capsys)
    assert code == 0, err
    assert "fatally failed records are skipped" not in err
    assert "settings changed (max_tokens: 400 -> 200" in err
    got = sorted(c.id for c in completions(tmp_path / "run"))
    assert got == sorted(f"q{i}" for i in range(12))  # each once, after its failure
    assert failures(tmp_path / "run") == []  # none left standing
    assert "12 completions" in out


def test_strict_limit_refuses_only_a_limit_no_request_can_fit(tmp_path: Path) -> None:
    write_prompts(tmp_path / "p.jsonl", 3)
    with SimFleet(1, sim(context_length=1024)) as fleet:
        ok = generate(
            fast_config(
                tmp_path / "p.jsonl", tmp_path / "a", fleet.urls, max_tokens=512, strict_limit=True
            )
        )
        with pytest.raises(ConfigError, match="max_tokens 1024 cannot fit"):
            generate(
                fast_config(
                    tmp_path / "p.jsonl",
                    tmp_path / "b",
                    fleet.urls,
                    max_tokens=1024,
                    strict_limit=True,
                )
            )
    assert ok.completed == 3 and ok.clamped == 0
    assert {c.sampling["max_tokens"] for c in completions(tmp_path / "a")} == {512}
