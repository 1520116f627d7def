"""`fleet up --hidden-states`: the flags that make a server extract hidden states, and what
fleet.yaml records of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import ConfigError
from draftdata.fleet.launch import LaunchConfig, flag_value, hidden_states_args, plan_fleet
from draftdata.fleet.manage import fleet_spec
from draftdata.shared.fleetspec import EndpointSpec, read_fleet, write_fleet


def _vllm(**kw: object) -> LaunchConfig:
    base: dict[str, object] = {"engine": "vllm", "model": "/m", "hidden_states": "/hs"}
    return LaunchConfig(**{**base, **kw})  # type: ignore[arg-type]


@given(layers=st.lists(st.integers(0, 200), min_size=1, max_size=8, unique=True))
def test_vllm_gets_the_method_and_the_connector_for_any_layers(layers: list[int]) -> None:
    (plan,) = plan_fleet(_vllm(hidden_layers=tuple(layers)), ["0"])
    spec = json.loads(flag_value(plan.argv, "--speculative-config") or "")
    kv = json.loads(flag_value(plan.argv, "--kv-transfer-config") or "")
    assert spec == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}},
    }
    assert kv == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/hs"},
    }


def test_a_connector_of_ones_own_is_loaded_from_its_module() -> None:
    args = hidden_states_args(_vllm(hidden_layers=(1, 2), hidden_connector="pkg.mod:MyConn"))
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "MyConn"
    assert kv["kv_connector_module_path"] == "pkg.mod"


def test_extra_args_replace_the_generated_config() -> None:
    mine = '{"kv_connector": "Other", "kv_role": "kv_producer"}'
    (plan,) = plan_fleet(
        _vllm(hidden_layers=(1,), extra_args=("--kv-transfer-config", mine)), ["0"]
    )
    assert plan.argv.count("--kv-transfer-config") == 1
    assert flag_value(plan.argv, "--kv-transfer-config") == mine


def test_the_simulator_speaks_the_same_protocol() -> None:
    cfg = LaunchConfig(
        engine="sim", model="/m", hidden_states="/hs", hidden_layers=(2, 5, 8), hidden_size=64
    )
    (plan,) = plan_fleet(cfg, ["0"])
    assert flag_value(plan.argv, "--flavor") == "vllm"
    assert flag_value(plan.argv, "--hidden-states") == "/hs"
    assert flag_value(plan.argv, "--hidden-layers") == "2,5,8"
    assert flag_value(plan.argv, "--hidden-size") == "64"


def test_no_hidden_flags_without_hidden_states() -> None:
    (plan,) = plan_fleet(LaunchConfig(engine="vllm", model="/m"), ["0"])
    assert "--speculative-config" not in plan.argv
    assert "--kv-transfer-config" not in plan.argv


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"engine": "sglang", "hidden_layers": (1,)}, "cannot extract hidden states"),
        ({"hidden_layers": ()}, "no layer to capture"),
        ({"hidden_layers": (1, 1)}, "distinct"),
        ({"hidden_layers": (-1,)}, "distinct and >= 0"),
        ({"engine": "sim", "hidden_layers": (1,)}, "hidden size"),
        ({"hidden_states": None, "hidden_connector": "X"}, "only used with --hidden-states"),
    ],
)
def test_bad_hidden_launches_are_one_line(kw: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        _vllm(**kw)


def test_fleet_yaml_records_where_and_which_layers(tmp_path: Path) -> None:
    cfg = _vllm(hidden_layers=(2, 18, 36))
    spec = fleet_spec(cfg, [EndpointSpec(url="http://127.0.0.1:1")])
    out = tmp_path / "fleet.yaml"
    write_fleet(spec, out)
    back = read_fleet(out)
    assert back.hidden_states is not None
    assert back.hidden_states.path == "/hs"
    assert back.hidden_states.layers == [2, 18, 36]
    assert back.hidden_states.connector == "ExampleHiddenStatesConnector"


def test_a_fleet_without_hidden_states_writes_no_such_key(tmp_path: Path) -> None:
    spec = fleet_spec(LaunchConfig(engine="vllm", model="/m"), [EndpointSpec(url="http://h:1")])
    out = tmp_path / "fleet.yaml"
    write_fleet(spec, out)
    assert "hidden_states" not in out.read_text()
    assert read_fleet(out).hidden_states is None


def _model(folder: Path, layers: int) -> Path:
    folder.mkdir()
    config = {"model_type": "qwen3", "num_hidden_layers": layers, "hidden_size": 64}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_fleet_up_resolves_eagle3_against_the_model_and_adds_the_last(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    model = _model(tmp_path / "m", 40)
    res = CliRunner().invoke(
        app,
        ["fleet", "up", "--engine", "vllm", "--model", str(model), "--gpus", "0",
         "--hidden-states", str(tmp_path / "hs"), "--dry-run"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert '"eagle_aux_hidden_state_layer_ids":[2,20,37,40]' in res.output
    assert not (tmp_path / "hs").exists()  # a dry run creates nothing


def test_another_engine_is_refused_before_the_layers_are_read(tmp_path: Path) -> None:
    """The engine is the first thing wrong with `--engine sglang --hidden-states`, whatever
    the model's depth (a 2-layer model has no EAGLE-3 choice)."""
    from typer.testing import CliRunner

    from draftdata.cli import app

    model = _model(tmp_path / "m", 2)
    res = CliRunner().invoke(
        app,
        ["fleet", "up", "--engine", "sglang", "--model", str(model), "--gpus", "0",
         "--hidden-states", str(tmp_path / "hs"), "--dry-run"],
    )  # fmt: skip
    assert res.exit_code == 1
    assert "--engine sglang cannot extract hidden states" in str(res.exception)
