"""One model per run: endpoints reporting different models, and a resume under another name.

Simulators serving different model names at ``/v1/models`` stand in for a fleet where one server
was started with another checkpoint. generate refuses them at the start (nothing written), or
with ``--allow-mixed-models`` goes on and records in each completion the model of the endpoint
that wrote it. A run whose manifest recorded another model (``default``) refuses the endpoint
on resume in one line that names the option and what it means for the data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftdata.errors import ConfigError, RunMismatchError
from draftdata.generate.config import GenerateConfig
from draftdata.generate.stage import generate
from draftdata.generate.summary import GenerateSummary
from draftdata.sim.config import SimConfig
from draftdata.sim.run import SimFleet
from draftdata.store.read import iter_completions

pytestmark = pytest.mark.integration


def _prompts(path: Path, n: int = 16) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Q{i}?"}]}) + "\n"
            for i in range(n)
        )
    )
    return path


def _sim(model: str, flavor: str = "vllm") -> SimConfig:
    return SimConfig(model=model, flavor=flavor, time_scale=0, mean_output_tokens=20)  # type: ignore[arg-type]


def _generate(tmp_path: Path, urls: list[str], **kw: object) -> GenerateSummary:
    config = GenerateConfig(
        prompts=str(_prompts(tmp_path / "prompts.jsonl")),
        endpoints=urls,
        out=str(tmp_path / "run"),
        progress="plain",
        max_tokens=64,
        **kw,  # type: ignore[arg-type]
    )
    return generate(config, handle_signals=False, log=lambda _line: None)


def test_endpoints_with_different_models_are_refused(tmp_path: Path) -> None:
    with SimFleet(1, _sim("model-a")) as a, SimFleet(1, _sim("model-b")) as b:
        with pytest.raises(ConfigError) as err:
            _generate(tmp_path, [*a.urls, *b.urls])
        assert a.stats(0).requests == 0 and b.stats(0).requests == 0
    line = str(err.value)
    assert "\n" not in line and "--allow-mixed-models" in line
    assert "'model-a' at " + a.urls[0].rstrip("/") in line and "'model-b'" in line
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_allow_mixed_models_records_the_model_of_each_completion(tmp_path: Path) -> None:
    with SimFleet(1, _sim("model-a")) as a, SimFleet(1, _sim("model-b")) as b:
        summary = _generate(tmp_path, [*a.urls, *b.urls], allow_mixed_models=True)
        assert summary.completed == 16
        served = {"model-a": a.stats(0).requests, "model-b": b.stats(0).requests}
        by_url = {a.urls[0].rstrip("/"): "model-a", b.urls[0].rstrip("/"): "model-b"}
    rows = list(iter_completions(str(tmp_path / "run")))
    assert len(rows) == 16 and all(c.model == by_url[c.endpoint.rstrip("/")] for c in rows)
    for model, n in served.items():
        assert sum(c.model == model for c in rows) == n  # every answer from where it came


def test_the_requested_name_is_not_the_model_that_wrote_it(tmp_path: Path) -> None:
    # SGLang answers any requested name; the completion records what the endpoint serves.
    with SimFleet(1, _sim("served-name", flavor="sglang")) as fleet:
        _generate(tmp_path, fleet.urls, model="asked-name")
    assert {c.model for c in iter_completions(str(tmp_path / "run"))} == {"served-name"}


def test_resume_of_a_default_run_names_the_option_and_its_meaning(tmp_path: Path) -> None:
    with SimFleet(1, _sim("default")) as fleet:
        assert _generate(tmp_path, fleet.urls, limit=8).completed == 8
    with SimFleet(1, _sim("Qwen3-8B")) as fleet:
        with pytest.raises(RunMismatchError) as err:
            _generate(tmp_path, fleet.urls)
        line = str(err.value)
        assert "\n" not in line
        assert "recorded model 'default'" in line and "'Qwen3-8B'" in line
        assert "--allow-config-change" in line and "new --out" in line
        # Accepting the change: the run goes on, the change is recorded.
        again = _generate(tmp_path, fleet.urls, allow_config_change=True)
    assert again.completed == 8 and again.already_done == 8
    assert list((tmp_path / "run" / "manifest-history").glob("*.json"))
    models = sorted(c.model for c in iter_completions(str(tmp_path / "run")))
    assert models == ["Qwen3-8B"] * 8 + ["default"] * 8
