"""A bad setting is named as the user gave it (issue 31): a flag by its flag (``--reasoning:
'yes' is not one of ...``), a config file's value by the file and key (``gen.yaml: reasoning:
...``); before, a flag's value was ``config: reasoning: ...``, a key the user never wrote.

Generated over the settings of the two commands that read a config file and flags (generate,
prepare): each bad value given by its flag, or by the file, or by both (the flag wins), through
the console script's ``main``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdata.cli import main

# generate: key -> (flag, a YAML value and its flag form, each bad)
GENERATE = {
    "reasoning": ("--reasoning", st.sampled_from(["yes", "maybe", "true1", "ON!"])),
    "order": ("--order", st.sampled_from(["fast", "random", "fifo"])),
    "token_ids": ("--token-ids", st.sampled_from(["maybe", "always"])),
    "progress": ("--progress", st.sampled_from(["loud", "tty"])),
    "temperature": ("--temperature", st.sampled_from([-1.0, -0.5])),
    "top_p": ("--top-p", st.sampled_from([1.5, 7.0, -0.1])),
    "read_timeout": ("--read-timeout", st.sampled_from([0.0, -3.0])),
    "connect_timeout": ("--connect-timeout", st.sampled_from([0.0, -1.0])),
    "unavailable_timeout": ("--unavailable-timeout", st.sampled_from([0.0, -1.0])),
    "flush_seconds": ("--flush-seconds", st.sampled_from([-1.0])),
}
PREPARE = {
    "budget": ("--budget", st.sampled_from([-1, -50])),
    "holdout": ("--holdout", st.sampled_from([-1, -7])),
}
SAMPLING = {"temperature", "top_p"}  # gen.yaml holds them under sampling:


def _yaml_line(key: str, value: object) -> str:
    shown = f"'{value}'" if isinstance(value, str) else str(value)
    return f"sampling: {{{key}: {shown}}}\n" if key in SAMPLING else f"{key}: {shown}\n"


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    return err


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_bad_setting_is_named_as_given(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    data: st.DataObject,
) -> None:
    command = data.draw(st.sampled_from(["generate", "prepare"]), label="command")
    table = GENERATE if command == "generate" else PREPARE
    key = data.draw(st.sampled_from(sorted(table)), label="key")
    flag, values = table[key]
    value = data.draw(values, label="value")
    how = data.draw(st.sampled_from(["flag", "file", "both"]), label="given by")
    root = tmp_path_factory.mktemp("cfg")
    prompts = root / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    config = root / ("gen.yaml" if command == "generate" else "prep.yaml")
    text = "" if how == "flag" else _yaml_line(key, value)
    if command == "prepare":
        text += f"out: {root / 'out'}\nsources: [{{name: s, path: {prompts}, schema: openai}}]\n"
    config.write_text(text)
    argv = [command]
    if command == "generate":
        argv += ["--prompts", str(prompts), "--endpoint", "http://127.0.0.1:9", "--out"]
        argv += [str(root / "run"), "--config", str(config)]
    else:
        argv += [str(config)]
    if how != "file":
        argv += [flag, str(value)]
    line = _error(argv, capsys)
    assert "config:" not in line, line
    if how == "file":
        path = f"sampling.{key}" if key in SAMPLING else key
        assert f"{config}: {path}: " in line, line
        assert flag + ":" not in line, line
    else:  # the flag's value (it wins over the file's)
        assert f"{flag}: " in line, line
        assert f"{config}:" not in line and f" {key}: " not in line, line
    assert not (root / "run").exists() and not (root / "out").exists()


def test_a_file_without_a_bad_value_and_no_flag_loads(tmp_path: Path) -> None:
    from draftdata.generate.config import GenerateConfig
    from draftdata.support.config import load_with_origins

    cfg, origins = load_with_origins(
        None,
        GenerateConfig,
        flag_names={"endpoints": "--endpoint"},
        flag_groups={"sampling"},
        prompts="p",
        out="o",
        endpoints=["http://x"],
        sampling={"top_k": 5},
        extra_body={"min_p": 0.1},
    )
    assert cfg.sampling.top_k == 5
    assert origins.name("endpoints") == "--endpoint"
    assert origins.name("sampling.top_k") == "--top-k"
    assert origins.name("extra_body.min_p") == "--extra-body (min_p)"
    assert origins.name("max_tokens") == "config: max_tokens"
