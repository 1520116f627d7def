"""``draftdata acceptance`` end to end against a real speculative vLLM server on CPU.

vLLM 0.32 decodes speculatively on CPU with the n-gram proposer; the tiny random Qwen3 of this
tier, greedy, falls into repeating itself, so the proposer's drafts are accepted often and every
counter moves. The test launches the server with ``fleet up --engine vllm --extra-args
"--speculative-config ..."``, measures two domains, and checks that the counters were read (the
totals equal the difference of the server's own ``/metrics`` before and after) and that the
report is consistent (rates from counts, totals the sum of the domains, per position never
rising).
"""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.integration import engine_checks
from tests.integration.envs import cached_env_python, env_dir

from draftdata.shared.speculation import from_vllm_metrics

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

SPEC = (
    '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, '
    '"prompt_lookup_min": 1}'
)
CPU_ARGS = (
    "--dtype bfloat16 --max-model-len 1024 --max-num-seqs 16 --enforce-eager "
    f"--speculative-config '{SPEC}'"
)


_free_port = engine_checks.free_port
_run = engine_checks.run_cli


@pytest.fixture(scope="module")
def spec_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A one-server speculative vLLM fleet; yields (fleet.yaml, url)."""
    py = cached_env_python("vllm_env.sh", env_dir("vllm"), "vllm")
    base = tmp_path_factory.mktemp("vllm-spec")
    model = engine_checks.tiny_model(py, base)
    fleet = base / "fleet.yaml"
    up = _run(
        "fleet", "up", "--engine", "vllm", "--model", str(model), "--gpus", "0",
        "--port-base", str(_free_port()), "--python", str(py), "--extra-args", CPU_ARGS,
        "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--env", "HF_HUB_OFFLINE=1",
        "--out", str(fleet), "--log-dir", str(base / "logs"), "--timeout", "600",
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = yaml.safe_load(fleet.read_text())["endpoints"][0]["url"]
        yield fleet, url
    finally:
        if fleet.exists():
            _run("fleet", "down", str(fleet), "--grace", "20")


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as resp:
        return str(resp.read().decode())


@pytest.mark.timeout(900)
def test_acceptance_reads_a_real_speculative_server(
    spec_fleet: tuple[Path, str], tmp_path: Path
) -> None:
    fleet, url = spec_fleet
    prompts = tmp_path / "eval.jsonl"
    rows = [
        {
            "id": f"{d}-{i}",
            "domain": d,
            "messages": [{"role": "user", "content": f"{d} {i}: " + "the cat sat on the mat " * 4}],
        }
        for d in ("code", "math")
        for i in range(8)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = from_vllm_metrics(_metrics(url))
    assert before is not None  # the real server exposes the counters the tool reads
    out = tmp_path / "acc"
    res = _run(
        "acceptance", "-p", str(prompts), "--fleet", str(fleet), "--out", str(out),
        "--max-tokens", "48", "--temperature", "0",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    after = from_vllm_metrics(_metrics(url))
    assert after is not None
    got = json.loads((out / "acceptance.json").read_text())
    total = got["total"]
    assert got["endpoints"][0]["figures"] == "counters"
    assert total["prompts"] == 16 and total["drafts"] > 0
    # the totals are exactly what the server's own counters moved by
    moved = after.minus(before)
    assert total["drafts"] == round(moved.drafts)
    assert total["draft_tokens"] == round(moved.draft_tokens)
    assert total["accepted_tokens"] == round(moved.accepted)
    for name in ("drafts", "draft_tokens", "accepted_tokens", "output_tokens", "prompts"):
        assert total[name] == sum(d[name] for d in got["by_domain"].values())
    for fig in [*got["by_domain"].values(), total]:
        assert fig["acceptance_rate"] == pytest.approx(
            fig["accepted_tokens"] / fig["draft_tokens"], abs=1e-5
        )
        assert fig["mean_accept_length"] == pytest.approx(
            1 + fig["accepted_tokens"] / fig["drafts"], abs=1e-5
        )
        pos = fig["per_position"]
        assert len(pos) == 3 and all(a >= b for a, b in itertools.pairwise(pos))
    assert got["warnings"] == []
    mix = json.loads((out / "suggested_mix.json").read_text())
    assert set(mix["mix"]) == {"code", "math"}
