"""The --ray entry points without a cluster: a missing Ray, option parsing, bad values."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from draftdata.cli.ray_options import generate_on_ray, parse_only, resolve_partitions
from draftdata.distributed.cluster import fill_template, require_ray
from draftdata.errors import ConfigError
from draftdata.generate.config import GenerateConfig


def test_missing_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigError) as info:
        require_ray()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("--ray needs Ray, which is not installed: pip install")
    assert "draftdata[ray]" in message
    with pytest.raises(ConfigError, match="pip install 'draftdata\\[ray\\]'"):
        generate_on_ray(GenerateConfig(prompts="p.jsonl", out="run/", endpoints=["http://x"]))


def test_parse_only() -> None:
    assert parse_only(None) is None
    assert parse_only("3, 1,") == [3, 1]
    with pytest.raises(ConfigError, match="--partition: 'a,b'"):
        parse_only("a,b")


def test_fill_template_names_the_placeholders() -> None:
    filled = fill_template("/f/fleet-{node}-{ip}.yaml", hostname="gpu7", ip="10.0.0.7", node_id="n")
    assert filled == "/f/fleet-gpu7-10.0.0.7.yaml"
    with pytest.raises(ConfigError, match=r"--fleet-per-node .*\{node\}, \{ip\}"):
        fill_template("/f/fleet-{gpu}.yaml", hostname="h", ip="i", node_id="n")


@pytest.mark.parametrize("command", ["generate", "tokenize"])
def test_cli_ray_without_ray_is_one_line_exit_1(
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from draftdata.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    if command == "generate":
        args = ["generate", "--prompts", str(prompts), "--endpoint", "http://127.0.0.1:9"]
        args += ["--out", str(tmp_path / "run"), "--ray"]
    else:
        args = ["tokenize", str(tmp_path / "run"), "--tokenizer", str(tmp_path), "--ray"]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --ray needs Ray, which is not installed: ")
    assert "pip install 'draftdata[ray]'" in err
    assert not (tmp_path / "run").exists()  # nothing was started or written


@pytest.mark.parametrize("command", ["generate", "tokenize"])
def test_help_names_the_extra(command: str) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "'draftdata[ray]'" in result.output and "--ray-address" in result.output


def test_node_labels_are_hostnames_unless_repeated() -> None:
    from draftdata.distributed.cluster import NodeInfo, node_labels

    nodes = [
        NodeInfo(node_id="aaaaaa11", ip="10.0.0.1", hostname="gpu1"),
        NodeInfo(node_id="bbbbbb22", ip="10.0.0.2", hostname="gpu2"),
        NodeInfo(node_id="cccccc33", ip="10.0.0.2", hostname="gpu2"),
    ]
    assert node_labels(nodes) == {
        "aaaaaa11": "gpu1",
        "bbbbbb22": "gpu2/bbbbbb",
        "cccccc33": "gpu2/cccccc",
    }


def test_tokenize_ray_options_reach_the_ray_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app, ray_options

    seen: dict[str, Any] = {}

    def fake(config: Any, **kw: Any) -> int:
        seen.update(kw, workers=config.workers)
        return 0

    monkeypatch.setattr(ray_options, "tokenize_on_ray", fake)
    args = ["tokenize", str(tmp_path / "run"), "--tokenizer", str(tmp_path), "--ray"]
    args += ["--ray-address", "auto", "--ray-tasks", "3", "--ray-env", "HF_TOKEN"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen == {"address": "auto", "concurrency": 3, "forward_env": ["HF_TOKEN"], "workers": 1}


@pytest.mark.parametrize(
    ("partition", "partitions", "only", "ray", "expected"),
    [
        # one process: --partition I with --partitions P, or the I/P shorthand
        ("2", 8, None, False, ("2/8", None, None)),
        ("2/8", None, None, False, ("2/8", None, None)),
        ("2/8", 8, None, False, ("2/8", None, None)),
        (None, None, None, False, (None, None, None)),
        # Ray: --partitions P tasks, --partition I,J the ones to run; the old spelling still works
        (None, 6, None, True, (None, 6, None)),
        ("1,4", 6, None, True, (None, 6, "1,4")),
        (None, 6, "1,4", True, (None, 6, "1,4")),
        ("3/8", None, None, True, (None, 8, "3")),
        (None, None, None, True, (None, None, None)),
    ],
)
def test_one_spelling_of_partitions(
    partition: str | None,
    partitions: int | None,
    only: str | None,
    ray: bool,
    expected: tuple[str | None, int | None, str | None],
) -> None:
    assert resolve_partitions(partition, partitions, only, ray=ray) == expected


@pytest.mark.parametrize(
    ("partition", "partitions", "only", "ray", "message"),
    [
        ("2", None, None, False, "--partition 2: say how many with --partitions P"),
        ("1,2", 4, None, False, "one process runs one partition; use --ray"),
        (None, 4, None, False, "--partitions 4 without --ray"),
        ("2/8", 4, None, False, "--partition 2/8 and --partitions 4 disagree"),
        ("1", None, "1", True, "--only-partitions is the old spelling of --partition"),
    ],
)
def test_partition_spellings_that_do_not_fit_are_one_line_errors(
    partition: str | None, partitions: int | None, only: str | None, ray: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        resolve_partitions(partition, partitions, only, ray=ray)
    assert "\n" not in str(info.value)


def test_every_generate_setting_is_a_config_key() -> None:
    # the command builds its config from GenerateOptions' Setting fields (no second list of
    # flags): each names a GenerateConfig field or a sampling field; --no-hedge sets hedge
    from draftdata.cli.generate import GenerateOptions
    from draftdata.cli.options import settings
    from draftdata.generate.config import Sampling

    keys = settings(GenerateOptions())
    sampling = keys.pop("sampling")
    assert sorted(set(sampling) - set(Sampling.__struct_fields__)) == []
    assert sorted(set(keys) - set(GenerateConfig.__struct_fields__) - {"no_hedge"}) == []
    assert "endpoints" in keys and "pilot" not in keys and "config" not in keys
