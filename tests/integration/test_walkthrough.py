"""The README's walkthrough ("Walkthrough: the 193K expansion, end to end"), run as written.

The commands are read from README.md itself (the first ``bash`` block after the ``seedjob``
marker), so the README cannot drift from what works. They run in a shell, in order, on the
simulator and a local S3 server, at small scale, with only the substitutions the README lists:

- ``s3://BUCKET/`` -> a fresh prefix on the moto S3 server;
- ``--engine sglang`` -> ``--engine sim`` (the README's no-GPU tip) and the drafter's flags ->
  the simulator's ``--spec-tokens 3`` (in vLLM's shapes, 8 requests at a time: see
  ``_interrupt_once``), ``--gpus 0-7`` -> ``--gpus 0-1``, ``--port-base 30000`` -> a free port;
- ``/models/Qwen3.6-27B`` -> the demo's small local tokenizer folder;
- ``examples/expansion.yaml`` is, in the test's working folder, the shipped config with its
  hub sources on the bundled sample sources of the same schemas, the live set on the test's
  bucket and its budget scaled to ``BUDGET`` prompts; nothing else changes, so the mix acts on
  it as it does on the real one (step 4 must move the plan onto the suggested mix in tokens);
- the live set ``s3://BUCKET/completions/`` holds the demo's ``LIVE_ROWS``-row 77%-code sample.

The whole run (step 6, the generate without ``--pilot``) is interrupted once with Ctrl-C
(twice: leave now) and then run again, as the README says. The pilot of step 5 writes a forecast
into the run; the acceptance of step 3 is measured on prepare's held-out split and its suggested
mix drives steps 4 and 7. The report of step 8 must hold the mix before (``before.json``), the
target and the merged result, the drafter's acceptance, the forecast against the actual run, and
the run's figures over all three commands.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import MotoS3
from tests.integration.ports import free_port_base
from tests.signals import default_signals

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHELL_PRELUDE = (
    f"draftdata() {{ {sys.executable} -c 'from draftdata.cli import main; main()' \"$@\"; }}\n"
)


def walkthrough_commands(readme: Path = ROOT / "README.md") -> list[str]:
    """The walkthrough's commands: comment lines dropped, ``\\`` continuations joined."""
    text = readme.read_text(encoding="utf-8")
    section = text[text.index("<!-- section:seedjob -->") :]
    block = section[section.index("```bash\n") + len("```bash\n") :]
    block = block[: block.index("```")]
    commands: list[str] = []
    current = ""
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        commands.append(" ".join((current + line).split()))
        current = ""
    return commands


def _substitute(cmd: str, bucket: str, tokenizer: Path, port_base: int, protect_ok: bool) -> str:
    cmd = cmd.replace("s3://BUCKET/", bucket + "/")
    cmd = cmd.replace("--engine sglang", "--engine sim").replace("--gpus 0-7", "--gpus 0-1")
    # the simulator in vLLM's shapes (its /metrics counts answered requests: the interrupt waits
    # for one), running 8 at a time so that a command's requests take several rounds
    drafter = "--speculative-algorithm EAGLE3 --speculative-draft-model-path /models/drafter-v1"
    cmd = cmd.replace(drafter, "--spec-tokens 3 --flavor vllm --max-running 8")
    cmd = cmd.replace("--port-base 30000", f"--port-base {port_base}")
    cmd = cmd.replace("/models/Qwen3.6-27B", str(tokenizer))
    if not protect_ok and cmd.startswith("draftdata merge"):
        # until merge has --protect (another branch adds it), run the rest as written
        cmd = re.sub(r" --protect \S+", "", cmd)
    return cmd


def _sh(cmd: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", SHELL_PRELUDE + cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# examples/expansion.yaml's budget (193,010 new prompts) scaled down: below what the sources
# hold beside the live set's code, so that the mix decides which prompts are taken
BUDGET = 40
LIVE_ROWS = 400


def _write_config(work: Path, bucket: str) -> None:
    """examples/expansion.yaml as shipped, in the working folder: its sources on the bundled
    sample sources (same schemas), the live set on the test's bucket, the budget scaled."""
    import msgspec
    from tests.unit.prepare.expansion import local_expansion

    from draftdata.prepare.samples import write_sample_sources

    samples = work / "samples"
    write_sample_sources(samples)
    cfg = local_expansion(samples, f"{bucket}/completions/", BUDGET)
    (work / "examples").mkdir()
    (work / "examples" / "expansion.yaml").write_bytes(
        msgspec.yaml.encode(msgspec.to_builtins(cfg))
    )


def test_readme_walkthrough_runs_as_written(tmp_path: Path, moto_s3: MotoS3) -> None:
    from draftdata.demo.existing import write_existing_set
    from draftdata.demo.tokenizer import ensure_demo_tokenizer
    from draftdata.store.opener import open_store

    commands = walkthrough_commands()
    heads = [" ".join(c.split()[:2]) for c in commands]
    assert heads == [
        "draftdata stats",
        "draftdata fleet",
        "draftdata prepare",
        "draftdata acceptance",
        "draftdata prepare",
        "draftdata generate",
        "draftdata generate",
        "draftdata merge",
        "draftdata report",
        "draftdata fleet",
    ], heads
    work = tmp_path / "work"
    work.mkdir()
    bucket = moto_s3.url("walkthrough")
    live = tmp_path / "live.jsonl"
    write_existing_set(live, rows=LIVE_ROWS, seed=0)
    open_store(f"{bucket}/completions/").put_new("part-0.jsonl", live.read_bytes())
    _write_config(work, bucket)
    tokenizer = ensure_demo_tokenizer(tmp_path / "cache")
    merge_help = _sh("draftdata merge --help", work, 60).stdout
    protect_ok = "--protect" in merge_help
    port_base = free_port_base(2)
    sub = [_substitute(c, bucket, tokenizer, port_base, protect_ok) for c in commands]
    plans: list[dict[str, Any]] = []  # prepare_report.json of steps 2 and 4
    try:
        for cmd in sub:
            whole_run = cmd.startswith("draftdata generate") and "--pilot" not in cmd
            if whole_run:
                _interrupt_once(cmd, work, bucket, port_base)
            res = _sh(cmd, work)
            assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
            if whole_run:
                summary = res.stdout
            if cmd.startswith("draftdata prepare"):
                assert "take:" not in res.stderr, res.stderr  # no fixed take holds the mix
                plans.append(json.loads((work / "prompts" / "prepare_report.json").read_text()))
    finally:
        if (work / "fleet.yaml").exists():
            _sh("draftdata fleet down", work, 60)

    # step 0's stats are JSON that the report reads back
    before = json.loads((work / "before.json").read_text())
    assert before["format"] == "draftdata.stats/1" and before["rows"] == LIVE_ROWS
    # generate's summary after the resume is over all three commands (pilot, interrupted, rest)
    assert "in the whole run" in summary and "3 segments" in summary, summary
    # the evaluation split was held out of the prompts, and the drafter measured on it
    held = {
        json.loads(x)["id"]
        for f in (work / "prompts" / "eval").glob("*.jsonl")
        for x in f.read_text().splitlines()
    }
    generated = {
        json.loads(x)["id"]
        for f in (work / "prompts").glob("prompts-*.jsonl")
        for x in f.read_text().splitlines()
    }
    assert held and not held & generated
    acc = json.loads(open_store(f"{bucket}/acceptance_v1/").read("acceptance.json"))
    assert acc["total"]["drafts"] > 0 and acc["total"]["prompts"] == len(held)
    suggested = json.loads(open_store(f"{bucket}/acceptance_v1/").read("suggested_mix.json"))
    # step 4 planned the prompts onto the suggested mix in loss tokens, and the mix moved the
    # plan: other counts per domain than step 2's, closer to the suggested shares in tokens
    second = plans[1]
    assert second["mix"] == suggested["mix"] and second["mix_by"] == "tokens"
    assert sum(s["taken"] for s in second["sources"]) == BUDGET
    taken = [{d["domain"]: d["new"] for d in p["domains"]} for p in plans]
    assert taken[0] != taken[1], taken
    after = {d["domain"]: d["tokens_after"] for d in second["domains"]}
    target = {d: v / sum(suggested["mix"].values()) for d, v in suggested["mix"].items()}
    moved = sum(abs(after.get(d, 0.0) - t) for d, t in target.items())
    lengths = second["lengths"]["tokens_per_row"]
    ex = {d["domain"]: d["existing_tokens"] for d in second["domains"]}
    kept = {d: ex.get(d, 0.0) + n * lengths.get(d, 0.0) for d, n in taken[0].items()}
    unmoved = sum(abs(kept.get(d, 0.0) / sum(kept.values()) - t) for d, t in target.items())
    assert moved < unmoved, (moved, unmoved, taken)
    merged = json.loads(open_store(f"{bucket}/train_v2/").read("merge_report.json"))
    assert set(merged["target"]) == set(suggested["mix"])
    assert open_store(f"{bucket}/expansion_v1/").exists("forecast.json")
    # the report holds before / target / after and the run's figures
    page = (work / "report.html").read_text()
    mix = page[page.index("Domain mix") :]
    labels = ("before.json (conversations)", "existing set (merge input)", "target", "after: train")
    for label in labels:
        assert label in mix, label
    for card in ("prompts", "completions", "failures", "wall_s", "output_tokens_per_s"):
        assert f'id="headline-{card}"' in page, card
    assert 'id="headline-segments"' in page
    assert "Throughput over time per endpoint" in page and "data:image/png;base64" in page
    assert "committed output tokens" in page and "wasted work (not committed)" in page
    assert "Output length per domain" in page and "Failures by class" in page
    assert "Draft acceptance per domain" in page and "Forecast against actual" in page
    assert "Domain mix in loss tokens" in page


def _answered(port_base: int, servers: int = 2) -> float:
    """Requests the fleet's servers have finished (the simulator's ``/metrics`` counter)."""
    import urllib.request

    total = 0.0
    for port in range(port_base, port_base + servers):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("vllm:request_success_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _interrupt_once(cmd: str, work: Path, bucket: str, port_base: int) -> None:
    """Run ``cmd`` until the servers have answered its first requests, then press Ctrl-C twice
    (SIGINT to its group: stop dispatching, then leave without waiting for the running
    requests); what finished is committed."""
    from draftdata.store.opener import open_store

    proc = subprocess.Popen(
        ["bash", "-c", SHELL_PRELUDE + cmd],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_signals,
    )
    run = open_store(f"{bucket}/expansion_v1/")
    before = _answered(port_base)  # the pilot's requests, answered earlier
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # the run is open (its lease taken) and the servers have answered this command's
        # first requests: interrupt with work done but not all of it
        if run.list("lease/") and _answered(port_base) > before:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "generate ended before its Ctrl-C: the test did not interrupt it"
    for _ in range(2):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=120)
    # interrupted with work left: 130, and it says how to resume
    assert proc.returncode == 130, f"{out}\n{err}"
    assert "interrupted" in out + err, f"{out}\n{err}"
