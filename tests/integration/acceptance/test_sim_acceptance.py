"""``draftdata acceptance`` against simulated speculative servers: configured rates recovered.

Three servers answer at once, each domain with its own acceptance probability (by the prefix of
the user message, as the simulator picks it). vLLM-shaped servers expose only global counters,
so the measurement must isolate domains in time; SGLang-shaped ones give per-request figures.
Either way each domain's acceptance rate must come back within 0.05 of the configured one and
its mean acceptance length within 0.15.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from draftdata.acceptance.stage import AcceptanceConfig, measure_acceptance
from draftdata.sim.config import FaultConfig
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.sim.spec import expected

pytestmark = pytest.mark.integration

K = 4
RATES = {"code": 0.85, "math": 0.6, "general": 0.4, "tool": 0.72}
PREFIX = {"code": "CODE", "math": "MATH", "general": "GEN", "tool": "TOOL"}
CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


def write_prompts(path: Path, per_domain: int = 60) -> Path:
    rows = [
        {
            "id": f"{d}-{i}",
            "domain": d,
            "messages": [{"role": "user", "content": f"{PREFIX[d]} task {i}: explain it"}],
        }
        for i in range(per_domain)
        for d in RATES
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sim_config(flavor: str, spec: bool = True) -> SimConfig:
    return SimConfig(
        flavor=flavor,  # type: ignore[arg-type]
        time_scale=0.002,
        mean_output_tokens=160,
        max_running=12,
        spec_tokens=K if spec else 0,
        accept_rate_for={PREFIX[d]: r for d, r in RATES.items()},
        seed=7,
    )


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_each_domains_rate_is_recovered_with_three_servers_at_once(
    flavor: str, tmp_path: Path
) -> None:
    prompts = write_prompts(tmp_path / "eval.jsonl")
    with SimFleet(n=3, config=sim_config(flavor)) as fleet:
        result = measure_acceptance(
            AcceptanceConfig(
                prompts=str(prompts),
                endpoints=tuple(fleet.urls),
                out=str(tmp_path / "acc"),
                concurrency=8,
                chunk=12,
            )
        )
        # the measurement really ran on every server, several at once
        assert all(fleet.stats(i).served > 0 for i in range(3))
    assert set(result.by_domain) == set(RATES)
    for d, p in RATES.items():
        rate, length = expected(K, p)
        got = result.by_domain[d]
        assert got.prompts == 60 and got.failed == 0
        assert got.acceptance_rate is not None and abs(got.acceptance_rate - rate) < 0.05, d
        assert got.mean_accept_length is not None
        assert abs(got.mean_accept_length - length) < 0.15, d
        assert len(got.per_position) == K
        assert got.per_position[0] == pytest.approx(p, abs=0.06)
    assert result.warnings == []
    saved = json.loads((tmp_path / "acc" / "acceptance.json").read_text())
    assert saved["format"] == "draftdata.acceptance/1"
    assert saved["by_domain"]["code"]["acceptance_rate"] == result.by_domain["code"].acceptance_rate
    mix = json.loads((tmp_path / "acc" / "suggested_mix.json").read_text())["mix"]
    # the weakest domain gets the most, the strongest the least
    assert max(mix, key=mix.get) == "general" and min(mix, key=mix.get) == "code"


def test_another_client_on_a_counter_server_is_a_warning(tmp_path: Path) -> None:
    """vLLM's counters are global: traffic the measurement did not send mixes the counts, and
    the measurement says so instead of attributing it silently."""
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=30)
    with SimFleet(n=1, config=sim_config("vllm")) as fleet:
        stop = threading.Event()

        def other_client() -> None:
            body = json.dumps(
                {"messages": [{"role": "user", "content": "CODE other"}], "max_tokens": 64}
            ).encode()
            while not stop.is_set():
                req = urllib.request.Request(
                    fleet.urls[0] + "/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                urllib.request.urlopen(req, timeout=30).read()

        t = threading.Thread(target=other_client, daemon=True)
        t.start()
        try:
            result = measure_acceptance(
                AcceptanceConfig(prompts=str(prompts), endpoints=(fleet.urls[0],), chunk=10)
            )
        finally:
            stop.set()
            t.join(timeout=30)
    assert result.warnings and "another client" in result.warnings[0]


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_a_server_without_speculative_decoding_is_refused_in_one_line(
    flavor: str, tmp_path: Path
) -> None:
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=2)
    with SimFleet(n=1, config=sim_config(flavor, spec=False)) as fleet:
        res = subprocess.run(
            [*CLI, "acceptance", "-p", str(prompts), "-e", fleet.urls[0]],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 1, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not decode speculatively" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_cli_writes_and_never_overwrites_a_measurement(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=5)
    out = tmp_path / "acc"
    with SimFleet(n=2, config=sim_config("sglang")) as fleet:
        args = [*CLI, "acceptance", "-p", str(prompts), "--out", str(out)]
        for u in fleet.urls:
            args += ["-e", u]
        first = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        assert "code" in first.stdout and "acceptance.json" in first.stdout
        before = (out / "acceptance.json").read_bytes()
        again = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "never overwritten" in again.stderr
    assert (out / "acceptance.json").read_bytes() == before
    as_json = json.loads((out / "suggested_mix.json").read_text())
    assert as_json["mix_arg"].count("=") == len(RATES)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flavor=st.sampled_from(["vllm", "sglang"]),
    servers=st.integers(2, 3),
    crash_at=st.integers(1, 60),
    dead=st.data(),
)
def test_a_server_that_dies_mid_measurement_leaves_its_chunk_to_the_others(
    flavor: str, servers: int, crash_at: int, dead: st.DataObject
) -> None:
    """One server crashes (never to return) at a random request; its chunk goes back to the
    queue and a live server measures it, even one that had run out of work before the crash:
    every prompt is measured, none twice, and the log names the server taken out."""
    victim = dead.draw(st.integers(0, servers - 1))
    config = msgspec.structs.replace(
        sim_config(flavor), faults=FaultConfig(crash_after={victim: crash_at})
    )
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = write_prompts(Path(tmp) / "eval.jsonl", per_domain=12)
        with SimFleet(n=servers, config=config) as fleet:
            got = measure_acceptance(
                AcceptanceConfig(prompts=str(prompts), endpoints=fleet.urls, chunk=8),
                log=lines.append,
            )
            crashed = fleet.stats(victim).crashes
    assert {d: v.prompts for d, v in got.by_domain.items()} == dict.fromkeys(RATES, 12)
    assert all(v.failed == 0 for v in got.by_domain.values())
    if crashed:
        assert any("taken out" in line for line in lines), lines


def test_a_password_in_an_endpoint_url_is_in_no_file_and_no_message(tmp_path: Path) -> None:
    """The measurement authenticates with the URL's password but shows and writes the URL with
    it masked: acceptance.json, suggested_mix.json, the table and every error line."""
    password = "pw-acc-" + secrets.token_hex(6)
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=3)
    out = tmp_path / "acc"
    with SimFleet(n=1, config=sim_config("vllm")) as fleet:
        url = fleet.urls[0].replace("http://", f"http://alice:{password}@", 1)
        ok = subprocess.run(
            [*CLI, "acceptance", "-p", str(prompts), "-e", url, "--out", str(out)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    dead = subprocess.run(
        [*CLI, "acceptance", "-p", str(prompts), "-e", f"http://alice:{password}@127.0.0.1:1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert dead.returncode == 1 and "does not answer" in dead.stderr
    shown = ok.stdout + ok.stderr + dead.stdout + dead.stderr
    files = "".join(p.read_text() for p in out.iterdir())
    assert "alice:***@" in files and "alice:***@" in dead.stderr
    assert password not in shown and password not in files


def test_wrong_domains_and_urls_are_named_in_one_line(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=2)
    for args, want in [
        (["--domain", "nosuch", "-e", "http://127.0.0.1:1"], "no prompt of domain(s) nosuch"),
        (["-e", "127.0.0.1:1"], "give a URL such as http://"),
    ]:
        res = subprocess.run(
            [*CLI, "acceptance", "-p", str(prompts), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 1, res.stderr
        assert want in res.stderr and "Traceback" not in res.stderr
        assert len([x for x in res.stderr.splitlines() if x.strip()]) == 1, res.stderr


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example is a real fleet
)
@given(
    flavor=st.sampled_from(["vllm", "sglang"]),
    servers=st.integers(1, 2),
    fault=st.sampled_from(["restart", "503"]),
    crash_at=st.integers(1, 40),
    down_s=st.floats(1.0, 3.0),
)
@example(flavor="vllm", servers=1, fault="restart", crash_at=10, down_s=3.0)
@example(flavor="sglang", servers=1, fault="503", crash_at=1, down_s=1.0)
def test_a_server_that_restarts_or_fails_often_is_waited_out_and_taken_back(
    flavor: str, servers: int, fault: str, crash_at: int, down_s: float
) -> None:
    """One server restarts (down for ``down_s`` seconds), or answers 30% of its requests with
    503: it is backed off and taken back as generate does, and every prompt is measured (it
    used to be dropped after three failures in 1.5 s: 'every server failed', exit 1)."""
    faults = (
        FaultConfig(crash_after={0: crash_at}, restart_after=down_s, starting_s=0.3)
        if fault == "restart"
        else FaultConfig(error_503=0.3, server=0, retry_after_s=0)
    )
    config = msgspec.structs.replace(sim_config(flavor), faults=faults)
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = write_prompts(Path(tmp) / "eval.jsonl", per_domain=12)
        with SimFleet(n=servers, config=config) as fleet:
            got = measure_acceptance(
                AcceptanceConfig(
                    prompts=str(prompts), endpoints=fleet.urls, chunk=8, out=f"{tmp}/acc"
                ),
                log=lines.append,
            )
            crashed = fleet.stats(0).crashes
        assert (Path(tmp) / "acc" / "acceptance.json").exists()
    # every prompt measured once; a 503 at every one of generate's attempts fails a prompt
    assert {d: v.prompts + v.failed for d, v in got.by_domain.items()} == dict.fromkeys(RATES, 12)
    assert sum(v.failed for v in got.by_domain.values()) <= (1 if fault == "503" else 0)
    if crashed and servers == 1:  # with two, the other may finish first
        assert any("is back" in line for line in lines), lines


def test_what_was_measured_is_written_when_no_server_comes_back(tmp_path: Path) -> None:
    """The only server dies for good midway: after --unavailable-timeout the command ends in one
    line (exit 1) naming what was not measured, and what was is written."""
    config = msgspec.structs.replace(sim_config("sglang"), faults=FaultConfig(crash_after={0: 30}))
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=12)
    out = tmp_path / "acc"
    with SimFleet(n=1, config=config) as fleet:
        args = [*CLI, "acceptance", "--prompts", str(prompts), "--endpoint", fleet.urls[0]]
        args += ["--out", str(out), "--chunk", "8", "--unavailable-timeout", "2"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "prompts were not measured" in lines[0] and "acceptance.json" in lines[0], lines
    written = json.loads((out / "acceptance.json").read_text())
    measured = sum(d["prompts"] for d in written["by_domain"].values())
    assert 0 < measured < 48
    assert any("were not measured" in w for w in written["warnings"])
    assert (out / "suggested_mix.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_what_was_measured_is_written_when_a_signal_stops_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGINT or SIGTERM midway: the command says it stopped (exit 128 + signal, as every
    command does) and what it measured is written, marked partial."""
    config = msgspec.structs.replace(sim_config("sglang"), time_scale=0.03)
    prompts = write_prompts(tmp_path / "eval.jsonl", per_domain=12)
    out = tmp_path / "acc"
    with SimFleet(n=1, config=config) as fleet:
        args = [*CLI, "acceptance", "--prompts", str(prompts), "--endpoint", fleet.urls[0]]
        args += ["--out", str(out), "--chunk", "4", "--concurrency", "4"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while fleet.stats(0).served < 12:  # a few chunks measured
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = err.decode()
    assert proc.returncode == 128 + sig, text
    assert f"stopped by {sig.name}" in text and "Traceback" not in text, text
    written = json.loads((out / "acceptance.json").read_text())
    measured = sum(d["prompts"] for d in written["by_domain"].values())
    assert 0 < measured < 48, written
    assert any(f"stopped by {sig.name}" in w for w in written["warnings"]), written
