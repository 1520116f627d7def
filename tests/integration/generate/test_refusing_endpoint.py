"""One server of a fleet that refuses every request with the same HTTP 400 (launched otherwise
than the rest: another engine version, chat template or LoRA set) is taken out, its refused
prompts answered by the others; nothing of it is recorded as a prompt's failure. Only a refusal
of the whole fleet stops the command, in one line (``opening.py``). Against the simulator over
real sockets (``--refuse I:400``, ``--refuse-after N``, ``--fault-400``)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import completions, failures, fast_config, write_prompts

from draftdata.errors import FleetUnavailableError
from draftdata.generate.engine.opening import RECENT
from draftdata.generate.stage import generate
from draftdata.sim.run import FaultConfig, SimConfig, SimFleet, SimProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
REFUSAL = "HTTP 400: Bad request: this server is configured differently (simulated)"
RANDOM = "Invalid request: simulated refusal"  # --fault-400's answer, on any server


def _settled_once(out: Path, ids: list[str], n: int) -> tuple[int, list[str]]:
    """Every (prompt, sample) once in completions or failures; (completions, failures'
    messages)."""
    done = Counter((c.id, c.sample) for c in completions(out))
    failed = Counter((f.id, f.sample) for f in failures(out))
    assert max(done.values(), default=1) == 1 and max(failed.values(), default=1) == 1
    assert not set(done) & set(failed)
    assert set(done) | set(failed) == {(i, s) for i in ids for s in range(n)}
    return len(done), [f.message for f in failures(out)]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    servers=st.sampled_from([1, 2, 3, 8]),
    data=st.data(),
    mid_run=st.booleans(),
    fault_400=st.sampled_from([0.0, 0.0, 0.03]),
    fault_500=st.sampled_from([0.0, 0.05]),
    n=st.sampled_from([1, 1, 2]),
    kind=st.sampled_from(["plain", "mixed"]),
    seed=st.integers(0, 99),
)
def test_refusing_servers_are_taken_out_and_the_fleet_answers(
    tmp_path_factory: pytest.TempPathFactory,
    servers: int,
    data: st.DataObject,
    mid_run: bool,
    fault_400: float,
    fault_500: float,
    n: int,
    kind: str,
    seed: int,
) -> None:
    """Some servers refuse every request with one 400 (from the start, or after their first
    few answers), the others answer (with random 500s and per-request 400s): while at least
    one answers, the run finishes, every (prompt, sample) settled once, and no prompt is
    recorded as failed for the refusing servers' answer (a prompt fails only where every
    answering server refused it: the simulator's per-request 400); a server refusing many
    times is named in one line quoting its answer. When every server refuses
    from the start, the command stops in one line and records nothing."""
    refusing = data.draw(
        st.sets(st.integers(0, servers - 1), min_size=1, max_size=servers), label="refusing"
    )
    everyone = len(refusing) == servers
    after = 0 if everyone or not mid_run else data.draw(st.integers(1, 12), label="after")
    tmp = tmp_path_factory.mktemp("r")
    prompts = tmp / "p.jsonl"
    ids = write_prompts(prompts, 48, kind=kind)
    out = tmp / "run"
    faults = FaultConfig(
        refuse=dict.fromkeys(refusing, 400),
        refuse_after=after,
        error_400=fault_400,
        error_500=fault_500,
        retry_after_s=0,
    )
    sim = SimConfig(time_scale=0.1, mean_output_tokens=24, seed=seed, faults=faults)
    lines: list[str] = []
    with SimFleet(servers, sim) as fleet:
        config = fast_config(prompts, out, fleet.urls, n=n)
        if everyone:
            with pytest.raises(FleetUnavailableError) as info:
                generate(config, log=lines.append, handle_signals=False)
            line = str(info.value)
            assert "\n" not in line and REFUSAL in line, line
            assert failures(out) == [] and completions(out) == []
            return
        generate(config, log=lines.append, handle_signals=False)
        refused = {i: fleet.servers[i].stats.faults.get("refuse", 0) for i in refusing}
        urls = fleet.urls
    done, messages = _settled_once(out, ids, n)
    assert set(messages) <= {RANDOM}, messages
    if fault_400 == 0:
        assert done == len(ids) * n
    for i, count in refused.items():
        said = [ln for ln in lines if ln.startswith(f"endpoint {urls[i]} taken out")]
        if count >= 2 * RECENT:
            assert said and REFUSAL in said[0], (count, lines)
    for ln in lines:  # the good servers are never taken out for a refusal
        if "taken out" in ln and "refuses" in ln:
            assert any(ln.startswith(f"endpoint {urls[i]} ") for i in refusing), lines


def test_the_fastest_server_refusing_cannot_take_every_job(tmp_path: Path) -> None:
    """A refusing server answers its 400s at once, so it frees its slots first: it must not
    take the whole queue before the others' answers say it is the faulty one. It refuses a
    few batches at most, is taken out in one line, and every prompt is answered by the
    others; the old opening check stopped the command here (most of the first outcomes were
    its refusals)."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 240)
    out = tmp_path / "run"
    sim = SimConfig(
        time_scale=0.3,
        mean_output_tokens=40,
        max_running=16,
        faults=FaultConfig(refuse={0: 400}),
    )
    lines: list[str] = []
    with SimFleet(2, sim) as fleet:
        generate(fast_config(prompts, out, fleet.urls), log=lines.append, handle_signals=False)
        refused = fleet.servers[0].stats.faults.get("refuse", 0)
        url = fleet.urls[0]
    done, messages = _settled_once(out, ids, 1)
    assert done == 240 and messages == []
    assert refused <= 4 * 16, refused  # a batch or so, not the run's 240 prompts
    said = [ln for ln in lines if ln.startswith(f"endpoint {url} taken out")]
    assert len(said) == 1 and REFUSAL in said[0], lines


def test_the_cli_names_the_refusing_server_and_finishes(tmp_path: Path) -> None:
    """Over the CLI: a fleet of three whose server 1 refuses every request finishes with every
    prompt answered, exit 0, one line naming server 1 and quoting its answer; a resumed run
    (the same command, after one fleet-wide stop) just finishes too."""
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 60, kind="mixed")
    out = tmp_path / "run"
    base = [*CLI, "--progress", "off", "--prompts", str(prompts), "--out", str(out)]
    fast = ["--time-scale", "0.1", "--mean-output-tokens", "24"]
    with SimProcess(n=2, args=[*fast, "--refuse", "0:400", "--refuse", "1:400"]) as sim:
        res = subprocess.run(
            [*base, "--fleet", str(sim.fleet_yaml)], capture_output=True, text=True, timeout=90
        )
    assert res.returncode == 1, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and REFUSAL in errors[0], res.stderr[-3000:]
    assert failures(out) == [] and completions(out) == []
    with SimProcess(n=3, args=[*fast, "--refuse", "1:400"]) as sim:
        res = subprocess.run(
            [*base, "--fleet", str(sim.fleet_yaml)], capture_output=True, text=True, timeout=90
        )
        url = sim.urls[1]
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generate: done: 60 completions, 0 failures" in res.stdout, res.stdout[-2000:]
    said = [ln for ln in (res.stdout + res.stderr).splitlines() if f"endpoint {url} taken" in ln]
    assert len(said) == 1 and REFUSAL in said[0], res.stderr[-3000:]
    assert _settled_once(out, ids, 1) == (60, [])
