"""`hidden-states --engine vllm` over real sockets against the simulator speaking vLLM's
hidden-states protocol (sim/hidden.py): the files hold the fleet's states for exactly each
sample's tokens, through the faults of a fleet (a server killed mid-run, a slow one, refusals,
files never written, states of other tokens), and the staging folder is left empty.

The simulated states are a pure function of the token ids (``states_for``), so every file is
checked against what it must hold. torch is needed (``draftdata[hidden]``)."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.integration.hidden.simfleet import HIDDEN, LAYERS, check_files, run

from draftdata.errors import ConfigError, FleetError, FleetUnavailableError
from draftdata.sim.config import FaultConfig
from draftdata.sim.hidden import states_for

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration


def test_every_file_holds_its_own_samples_states(sim_job: dict[str, Any], sim_fleet: Any) -> None:
    fleet, yaml = sim_fleet(2)
    summary, _ = run(sim_job, yaml)
    assert summary.complete and summary.written == 48
    assert summary.verification is not None and summary.verification.passed
    check_files(sim_job)
    assert all(fleet.stats(i).served > 0 for i in range(2))  # the fleet shared the work


def test_the_last_layer_after_the_final_norm_for_specforge(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    _, yaml = sim_fleet(1)
    summary, _ = run(sim_job, yaml, format="specforge")
    assert summary.complete
    weight = torch.linspace(0.5, 2.0, HIDDEN).to(torch.bfloat16)
    for r in pq.read_table(sim_job["tmp"] / "set" / "hidden_index.parquet").to_pylist()[:10]:
        got = torch.load(sim_job["tmp"] / "set" / r["file"])
        pre = torch.from_numpy(states_for(sim_job["samples"][r["id"]], [LAYERS], HIDDEN)[:, 0])
        x = pre.to(torch.bfloat16).float()
        want = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        assert torch.equal(got["hidden_state"][0], want)


def test_a_server_killed_mid_run(
    sim_job: dict[str, Any], sim_fleet: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Server 0 dies at its 6th request (socket closed, connections dropped, its writes not
    done): its work moves to server 1; nothing is lost, nothing is wrong."""
    fleet, yaml = sim_fleet(2, faults=FaultConfig(crash_after={0: 6}))
    summary, _ = run(sim_job, yaml)
    assert summary.complete and summary.written == 48
    check_files(sim_job)
    assert fleet.stats(0).crashes == 1
    said = capfd.readouterr().err  # the engine's endpoint lines, as generate's
    assert f"endpoint {fleet.urls[0]} taken out" in said


def test_a_server_killed_and_back(sim_job: dict[str, Any], sim_fleet: Any) -> None:
    fleet, yaml = sim_fleet(
        2, faults=FaultConfig(crash_after={1: 3}, restart_after=0.5, starting_s=0.2)
    )
    summary, _ = run(sim_job, yaml)
    assert summary.complete
    check_files(sim_job)
    assert fleet.stats(1).restarts == 1


def test_a_slow_server_gets_less_and_delays_nothing_wrong(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    """Two requests at a time per server and batches of many samples: the fast server frees
    its slots sooner and takes more of each batch; the slow one still serves its share."""
    fleet, yaml = sim_fleet(2, faults=FaultConfig(slow={1: 40.0}), hidden_write_s=0.0)
    summary, _ = run(sim_job, yaml, batch_tokens=4000, options={"concurrency": 2})
    assert summary.complete
    check_files(sim_job)
    assert 0 < fleet.stats(1).served < fleet.stats(0).served


def test_a_refusing_server_is_taken_out(
    sim_job: dict[str, Any], sim_fleet: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    fleet, yaml = sim_fleet(2, faults=FaultConfig(refuse={0: 401}))
    summary, _ = run(sim_job, yaml)
    assert summary.complete
    check_files(sim_job)
    assert fleet.stats(0).served == 0
    assert f"endpoint {fleet.urls[0]} taken out: it refuses" in capfd.readouterr().err


@pytest.mark.parametrize("refusing", [0, 1])
def test_a_server_refusing_what_the_other_answers_is_taken_out(
    sim_job: dict[str, Any], sim_fleet: Any, refusing: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """One server of two refuses every prefill with one 400 (a refusal of the request, not an
    endpoint fault): each sample is asked on the other, and once one it refused is answered
    there, it is taken out (the dispatcher's verdicts on refusals, told of every answer). A
    sample is no chat prompt: the answer of one once raised in the dispatcher (its chat
    canary has no request to ask), and nothing after it was done: the job never settled, no
    verdict heard of the answer, the server refusing everything was never taken out."""
    fleet, yaml = sim_fleet(2, faults=FaultConfig(refuse={refusing: 400}))
    summary, _ = run(sim_job, yaml)
    assert summary.complete
    check_files(sim_job)
    assert fleet.stats(refusing).served == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    taken = f"endpoint {fleet.urls[refusing]} taken out: it refuses the requests the other"
    assert taken in err, err[-3000:]


def test_a_fleet_that_refuses_everything_stops_in_one_line(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    _, yaml = sim_fleet(2, faults=FaultConfig(refuse={0: 403, 1: 403}))
    with pytest.raises(FleetUnavailableError, match="every endpoint refuses") as err:
        run(sim_job, yaml)
    assert "\n" not in str(err.value)
    assert not list((sim_job["tmp"] / "set" / "hidden_states").glob("*"))  # nothing committed


def test_files_a_server_never_wrote_are_asked_again(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    fleet, yaml = sim_fleet(2, faults=FaultConfig(hidden_missing=0.25))
    summary, _ = run(sim_job, yaml)
    assert summary.complete
    check_files(sim_job)  # and the staging folder holds none of the locks left behind
    assert sum(fleet.stats(i).faults.get("hidden_missing", 0) for i in range(2)) > 0


def test_states_of_other_tokens_take_their_server_out(
    sim_job: dict[str, Any], sim_fleet: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Server 0 writes files whose token_ids are not the prompt's (the class of a batching
    bug): it is taken out at once, and no file of it is committed."""
    fleet, yaml = sim_fleet(2, faults=FaultConfig(hidden_wrong_ids=1.0, server=0))
    summary, _ = run(sim_job, yaml)
    assert summary.complete
    check_files(sim_job)
    assert fleet.stats(0).faults.get("hidden_wrong_ids", 0) >= 1
    said = capfd.readouterr().err
    assert f"endpoint {fleet.urls[0]} taken out: it gives impossible answers" in said
    assert "not the ids sent" in said


def test_a_sample_longer_than_the_servers_context_is_named(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    _, yaml = sim_fleet(1, context_length=40)
    with pytest.raises(FleetError, match="--max-length"):
        run(sim_job, yaml)
    summary, _ = run(sim_job, yaml, out="cut", max_length=39)
    assert summary.complete


def test_a_fleet_that_does_not_capture_the_layers_is_refused(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    from draftdata.errors import ConfigError

    _, yaml = sim_fleet(1, hidden_layers=[2, 6])
    with pytest.raises(ConfigError, match=r"captures layers \[2, 6\]"):
        run(sim_job, yaml)


def test_a_batch_that_cannot_fit_in_the_fleets_folder_is_refused_in_one_line(
    sim_job: dict[str, Any], sim_fleet: Any
) -> None:
    """The fleet's folder is a real 256 KiB tmpfs (a /dev/shm too small for --batch-tokens):
    a batch whose files cannot fit is refused before it is sent, naming the size that fits,
    instead of servers failing writes that are retried for ever; a batch inside it runs."""
    from tests.integration.disk import can_mount, tmpfs

    if (why := can_mount()) is not None:
        pytest.skip(why)
    with tmpfs(sim_job["staging"], size="256k"):
        _, yaml = sim_fleet(1)
        with pytest.raises(ConfigError, match=r"--batch-tokens: a batch of [\d,]+ tokens") as err:
            run(sim_job, yaml, batch_tokens=4000)
        message = str(err.value)
        assert "\n" not in message and "free" in message
        fits = int(message.split("use --batch-tokens ")[1].split(" ")[0].replace(",", ""))
        assert 300 < fits < 1500  # 256 KiB over 264 bytes a token (4 layers x 32 x bf16 + id)
        assert not list((sim_job["tmp"] / "set" / "hidden_states").glob("*"))
        summary, _ = run(sim_job, yaml, out="fits", batch_tokens=300)
        assert summary.complete
        check_files(sim_job, out="fits")


def _open_sessions() -> list[Any]:
    import gc

    import aiohttp

    gc.collect()
    return [o for o in gc.get_objects() if type(o) is aiohttp.ClientSession and not o.closed]


@pytest.mark.parametrize(
    "fault",
    ["every server refuses", "a sample longer than the context", "layers not captured"],
)
def test_a_run_stopped_by_an_error_closes_its_connections(
    sim_job: dict[str, Any], sim_fleet: Any, fault: str
) -> None:
    """A run that an error stops closes what the vllm engine opened (its HTTP sessions and
    the thread of its event loop) and lets its cancelled requests remove their files, as a
    run that ends well does: on an error only the uploader used to be stopped, so a library
    caller kept an open session and a thread per failed run (aiohttp's "Unclosed client
    session" at exit)."""
    import threading

    before = len(_open_sessions())
    if fault == "every server refuses":
        _, yaml = sim_fleet(2, faults=FaultConfig(refuse={0: 403, 1: 403}))
    elif fault == "a sample longer than the context":
        _, yaml = sim_fleet(1, context_length=40)
    else:
        _, yaml = sim_fleet(1, hidden_layers=[2, 6])
    threads = threading.active_count()  # the fleet's included
    with pytest.raises((FleetError, ConfigError)):
        run(sim_job, yaml)
    assert len(_open_sessions()) == before
    assert threading.active_count() <= threads
    assert not list(sim_job["staging"].glob("*")), list(sim_job["staging"].glob("*"))
