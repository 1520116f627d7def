"""The real-engine tier: `fleet up --engine vllm` on CPU with a tiny random Qwen3, then use it.

The vLLM environment (cached outside the clone, see ``scripts/env_path.sh``, or
``$DRAFTDATA_VLLM_VENV``) is built once by ``scripts/vllm_env.sh`` (``make vllm-env``; ``make
test`` runs it in the background). The tests skip, printing why, only when that environment
cannot be built. The model (hidden 64, 2 layers, head_dim 32, random weights) and the tokenizer
(draftdata's demo BPE with our Qwen3-style chat template) are built at run time in a temporary
folder; nothing is downloaded. One server is started for the whole module (~30-50 s) and taken
down at the end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration import engine_checks
from tests.integration.envs import cached_env_python, env_dir

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[3]
VENV = env_dir("vllm")
# Server flags for a CPU box: small context and batch, eager mode, 1 GiB KV cache (env below),
# structured outputs allowed inside the reasoning so a random model can be made to close </think>.
CPU_ARGS = (
    "--dtype bfloat16 --max-model-len 1024 --max-num-seqs 16 --enforce-eager "
    "--structured-outputs-config '{\"enable_in_reasoning\": true}'"
)
THINK_REGEX = "<think>\n[a-z ]{8,40}\n</think>\n\n[a-z ]{8,40}"


def _vllm_python() -> Path:
    return cached_env_python("vllm_env.sh", VENV, "vllm")


_free_port = engine_checks.free_port
_run = engine_checks.run_cli


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(vLLM python, model folder): demo tokenizer + random tiny Qwen3 weights."""
    py = _vllm_python()
    return py, engine_checks.tiny_model(py, tmp_path_factory.mktemp("vllm-tier"))


@pytest.fixture(scope="module")
def vllm_fleet(tiny_model: tuple[Path, Path]) -> Iterator[tuple[Path, Path, str]]:
    """A one-server vLLM fleet started with `fleet up`; yields (fleet.yaml, model, stdout)."""
    py, model = tiny_model
    fleet = model.parent / "fleet.yaml"
    res = _run(
        "fleet", "up", "--engine", "vllm", "--model", str(model), "--gpus", "0",
        "--port-base", str(_free_port()), "--python", str(py), "--extra-args", CPU_ARGS,
        "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--env", "HF_HUB_OFFLINE=1",
        "--out", str(fleet), "--log-dir", str(model.parent / "logs"), "--timeout", "600",
    )  # fmt: skip
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        yield fleet, model, res.stdout
    finally:
        if fleet.exists():
            down = _run("fleet", "down", str(fleet), "--grace", "20")
            print(down.stdout, down.stderr)


def _chat(url: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps({"model": model, **body}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


@pytest.mark.timeout(900)
def test_fleet_up_records_the_real_engine(vllm_fleet: tuple[Path, Path, str]) -> None:
    fleet, model, stdout = vllm_fleet
    assert "ready in" in stdout
    spec = yaml.safe_load(fleet.read_text())
    assert spec["engine"] == "vllm"
    (ep,) = spec["endpoints"]
    assert ep["model"] == str(model)
    assert ep["engine"] == "vllm"
    assert ep["engine_version"] == "0.32.0"
    assert ep["context_length"] == 1024  # /v1/models max_model_len
    assert ep["max_running_requests"] == 16  # --max-num-seqs (vLLM does not report it)
    argv = Path(ep["log"]).read_text().splitlines()[0]
    assert "--reasoning-parser qwen3" in argv and "vllm.entrypoints.openai.api_server" in argv
    st = _run("fleet", "status", str(fleet))
    assert st.returncode == 0, st.stdout + st.stderr
    assert "1 of 1 servers healthy" in st.stdout


@pytest.mark.timeout(900)
def test_reasoning_and_token_ids_from_vllm(vllm_fleet: tuple[Path, Path, str]) -> None:
    fleet, model, _ = vllm_fleet
    url = yaml.safe_load(fleet.read_text())["endpoints"][0]["url"]
    out = _chat(
        url,
        str(model),
        {
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 120,
            "return_token_ids": True,
            "structured_outputs": {"regex": THINK_REGEX},
        },
    )
    choice = out["choices"][0]
    message = choice["message"]
    assert message["reasoning"].strip()  # vLLM >= 0.11: `reasoning`, not `reasoning_content`
    assert message["content"].strip()
    assert choice["token_ids"] and out["prompt_token_ids"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok.encode(text, add_special_tokens=False)
    assert list(prompt) == out["prompt_token_ids"]  # the server renders our template exactly
    text = tok.decode(choice["token_ids"], skip_special_tokens=True)
    assert message["reasoning"].strip() in text and message["content"].strip() in text


@pytest.mark.timeout(900)
def test_generate_then_tokenize_is_token_exact(
    vllm_fleet: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """The real engine's ids, captured by `generate`, equal our template's rendering."""
    fleet, model, _ = vllm_fleet
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"id": f"p{i}", "messages": [{"role": "user", "content": f"Question number {i}?"}]}
        for i in range(6)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "gen.yaml"
    config.write_text(
        yaml.safe_dump({"extra_body": {"structured_outputs": {"regex": THINK_REGEX}}})
    )
    run = tmp_path / "run"
    gen = _run(
        "generate", "--prompts", str(prompts), "--fleet", str(fleet), "--out", str(run),
        "--max-tokens", "96", "--config", str(config), "--progress", "plain",
    )  # fmt: skip
    assert gen.returncode == 0, gen.stdout + gen.stderr
    import pyarrow.parquet as pq

    shards = sorted((run / "completions").glob("*.parquet"))
    rows_out = pq.ParquetDataset(shards).read().to_pylist()
    assert sorted(r["id"] for r in rows_out) == [f"p{i}" for i in range(6)]
    for row in rows_out:
        (turn,) = row["turns"]
        assert turn["reasoning"] and turn["reasoning"].strip()  # from vLLM's `reasoning`
        assert turn["prompt_token_ids"] and turn["output_token_ids"]
    tok_out = tmp_path / "tokenized"
    res = _run("tokenize", str(run), "--tokenizer", str(model), "--out", str(tok_out))
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tok_out / "summary.json").read_text())
    counts = summary["counts"]
    assert counts["path.token_ids"] == 6 and counts["samples"] == 6
    # 100% token-exact: each sample is the served prompt ids then the served output ids, with
    # loss exactly on the output, and every one verifies against our template. A random-weight
    # model often picks a non-canonical tokenization (e.g. "em"+"ory" where the BPE would encode
    # "emory"): the text and its loss still match the rendering, so it verifies, is counted as
    # `verified.noncanonical`, and keeps the served ids.
    assert counts.get("verified", 0) == 6 and counts.get("mismatched", 0) == 0, summary
    by_id = {r["id"]: r["turns"][0] for r in rows_out}
    samples = pq.ParquetDataset(sorted(tok_out.glob("*.parquet"))).read().to_pylist()
    assert sorted(s["id"] for s in samples) == sorted(by_id)
    for s in samples:
        turn = by_id[s["id"]]
        p, o = turn["prompt_token_ids"], turn["output_token_ids"]
        ids, mask = s["input_ids"], s["loss_mask"]
        assert ids[: len(p)] == p and ids[len(p) : len(p) + len(o)] == o
        assert not any(mask[: len(p)]) and all(mask[len(p) : len(p) + len(o)])
        assert not any(mask[len(p) + len(o) :])
    assert "100.0% token-exact" in res.stdout, res.stdout


# Reasoning without "y", an answer that may hold the stop string "y": turns end with
# <|endoftext|> (both it and <|im_end|> end a turn in the model's generation config; this
# random model picks <|endoftext|>), at the stop string (vLLM cuts the text before it and keeps
# its token), or at the token limit.
ODD_REGEX = "<think>\n[a-x ]{4,24}\n</think>\n\n[a-z ]{4,40}"


@pytest.mark.timeout(900)
def test_loss_only_on_served_output_tokens_however_turns_end(
    vllm_fleet: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """48 prompts on the random model: every token under loss is a served output token."""
    fleet, model, _ = vllm_fleet
    prompts = tmp_path / "prompts.jsonl"
    kinds = ("stop", "eos", "eos", "cut")  # per-domain settings below
    rows = [
        {
            "id": f"q{i}",
            "domain": kinds[i % 4],
            "messages": [{"role": "user", "content": f"Tell me about item {i}."}],
        }
        for i in range(48)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    config = tmp_path / "gen.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "overrides": [
                    {"domain": "stop", "sampling": {"stop": ["y"]}},
                    {"domain": "cut", "max_tokens": 12},
                ],
                "extra_body": {"structured_outputs": {"regex": ODD_REGEX}},
            }
        )
    )
    run = tmp_path / "run"
    gen = _run(
        "generate", "--prompts", str(prompts), "--fleet", str(fleet), "--out", str(run),
        "--max-tokens", "30", "--config", str(config), "--progress", "plain", "--seed", "7",
    )  # fmt: skip
    assert gen.returncode == 0, gen.stdout + gen.stderr
    import pyarrow.parquet as pq

    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    suffix = tok.encode("\n", add_special_tokens=False)
    completions = pq.ParquetDataset(sorted((run / "completions").glob("*.parquet"))).read()
    turns = {r["id"]: r["turns"][0] for r in completions.to_pylist()}
    assert len(turns) == 48
    endings: dict[str, int] = {}
    for t in turns.values():
        o = t["output_token_ids"]
        kind = (
            "length"
            if t["finish_reason"] == "length"
            else "im_end"
            if o[-1] == eot
            else "endoftext"
            if o[-1] == endoftext
            else "stop_string"
        )
        endings[kind] = endings.get(kind, 0) + 1
    print("endings:", endings)
    tok_out = tmp_path / "tokenized"
    res = _run("tokenize", str(run), "--tokenizer", str(model), "--out", str(tok_out))
    assert res.returncode == 0, res.stdout + res.stderr
    print(res.stdout)
    counts = json.loads((tok_out / "summary.json").read_text())["counts"]
    assert counts.get("mismatched", 0) == 0, counts
    samples = pq.ParquetDataset(sorted(tok_out.glob("*.parquet"))).read().to_pylist()
    assert samples and len(samples) + counts.get("dropped.too_few_loss_tokens", 0) == 48
    for s in samples:
        turn = turns[s["id"]]
        p, o = turn["prompt_token_ids"], turn["output_token_ids"]
        ids, mask = s["input_ids"], s["loss_mask"]
        # Loss exactly on the served output; after it, only the template's suffix, and only
        # after the template's own end-of-turn token, never under loss.
        assert ids[: len(p) + len(o)] == p + o, s["id"]
        assert not any(mask[: len(p)]) and all(mask[len(p) : len(p) + len(o)]), s["id"]
        tail = ids[len(p) + len(o) :]
        assert not any(mask[len(p) + len(o) :]), s["id"]
        assert tail == (suffix if o[-1] == eot else []), (s["id"], tail)
    # The random model did end turns in the odd ways this test is about.
    assert endings.get("endoftext", 0) > 0 and endings.get("stop_string", 0) > 0, endings
    assert endings.get("length", 0) > 0, endings


# -- what vLLM returns, used as the seed job would (tests/integration/engine_checks.py) ---------


def _metrics_kv_tokens(url: str) -> int:
    """The KV cache size vLLM reports in /metrics (read here, not with draftdata's parser)."""
    import re
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    m = re.search(r'vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', text)
    assert m is not None, "vLLM 0.32 lists kv_cache_size_tokens in vllm:cache_config_info"
    return int(m.group(1))


@pytest.fixture(scope="module")
def thinking_on(
    vllm_fleet: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory
) -> engine_checks.Tokenized:
    """Thinking on, no grammar: the random model never writes </think>, so vLLM's qwen3 parser
    puts all of each answer in `reasoning`; the `cut` domain is cut by its token limit."""
    fleet, model, _ = vllm_fleet
    tmp = tmp_path_factory.mktemp("thinking-on")
    return engine_checks.thinking_on(fleet, model, tmp, max_tokens=40)


@pytest.mark.timeout(900)
def test_thinking_on_answers_without_think_close_keep_every_served_sample(
    thinking_on: engine_checks.Tokenized,
) -> None:
    """The finding: tokenize called these "another tokenizer" and dropped 40/40."""
    engine_checks.check_thinking_on(thinking_on)


@pytest.mark.timeout(900)
def test_capacity_model_and_context_from_vllm_itself(
    vllm_fleet: tuple[Path, Path, str], thinking_on: engine_checks.Tokenized
) -> None:
    """Capacity: vLLM's KV cache (its /metrics) over the tokens a request holds, never above
    its running cap (--max-num-seqs 16, which fleet.yaml records); model and context from
    /v1/models."""
    fleet, model, _ = vllm_fleet
    t = thinking_on
    ep = yaml.safe_load(fleet.read_text())["endpoints"][0]
    assert ep["model"] == str(model) and ep["context_length"] == 1024
    assert {r["model"] for r in t.rows} == {str(model)}
    line = engine_checks.capacity_line(t.log)
    assert line["kv"] == _metrics_kv_tokens(ep["url"])
    assert line["cap"] == 16
    assert line["capacity"] == min(16, line["kv"] // line["held"])
    assert line["concurrency"] == line["capacity"] + 2  # a short queue on top


@pytest.mark.timeout(900)
def test_thinking_off_and_multi_turn_regeneration_are_token_exact(
    vllm_fleet: tuple[Path, Path, str], tmp_path: Path
) -> None:
    fleet, model, _ = vllm_fleet
    engine_checks.thinking_off_multi_turn(fleet, model, tmp_path)


@pytest.mark.timeout(300)
def test_a_cancelled_copy_stops_using_a_vllm_slot(vllm_fleet: tuple[Path, Path, str]) -> None:
    """What the dispatcher does to a hedge's losing copy (cancel its task) frees the slot on
    the server, by vLLM's own running count, while an identical twin still runs."""
    fleet, model, _ = vllm_fleet
    url = yaml.safe_load(fleet.read_text())["endpoints"][0]["url"]
    freed = engine_checks.cancel_frees_the_slot(url, "vllm", str(model), max_tokens=900)
    assert freed < 10, freed


@pytest.mark.timeout(300)
def test_the_fleet_checks_canary_is_an_answer_from_vllm(
    vllm_fleet: tuple[Path, Path, str],
) -> None:
    """``engine_checks.canary_answered``: vLLM answers the mid-run check's canary."""
    fleet, model, _ = vllm_fleet
    url = yaml.safe_load(fleet.read_text())["endpoints"][0]["url"]
    engine_checks.canary_answered(url, str(model))
