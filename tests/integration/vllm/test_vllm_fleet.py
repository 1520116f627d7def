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
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.envs import cached_env_python, env_dir

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[3]
VENV = env_dir("vllm")
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]
# Server flags for a CPU box: small context and batch, eager mode, 1 GiB KV cache (env below),
# structured outputs allowed inside the reasoning so a random model can be made to close </think>.
CPU_ARGS = (
    "--dtype bfloat16 --max-model-len 1024 --max-num-seqs 16 --enforce-eager "
    "--structured-outputs-config '{\"enable_in_reasoning\": true}'"
)
THINK_REGEX = "<think>\n[a-z ]{8,40}\n</think>\n\n[a-z ]{8,40}"


def _vllm_python() -> Path:
    return cached_env_python("vllm_env.sh", VENV, "vllm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(vLLM python, model folder): demo tokenizer + random tiny Qwen3 weights."""
    from draftdata.tokenize.train import ensure_demo_tokenizer

    py = _vllm_python()
    base = tmp_path_factory.mktemp("vllm-tier")
    model = base / "tiny-qwen3"
    shutil.copytree(ensure_demo_tokenizer(base / "cache"), model)
    res = subprocess.run(
        [str(py), str(Path(__file__).with_name("tiny_model.py")), str(model)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return py, model


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
