"""The errors and output a user meets: each is one line saying what, where and how to fix.

Each case runs the CLI as the console script does (``main``) and checks its one line; piped
output and ``--help`` run as a subprocess, as a user's pipe or terminal sees them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tests.unit.stats import builders as b

from draftdata.cli import main

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()"]


def _error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``argv``; it must exit 1 with exactly one line on stderr (returned)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exit_.value.code == 1 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    return lines[0]


def _ok(argv: list[str]) -> None:
    """Run ``argv``; it must succeed (Typer exits 0 in standalone mode)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code in (0, None)


def _prepare_config(tmp_path: Path, **changes: object) -> Path:
    from draftdata.prepare.samples import sample_config, write_sample_sources

    write_sample_sources(tmp_path / "samples")
    cfg = msgspec.structs.replace(sample_config(tmp_path / "samples", tmp_path / "out"), **changes)
    path = tmp_path / "prep.yaml"
    path.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    return path


def test_prepare_mix_key_that_is_no_domain_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = {"kode": 0.4, "math": 0.3, "general": 0.3}
    cfg = _prepare_config(tmp_path, mix=mix)
    line = _error_line(["prepare", str(cfg), "--plan-only"], capsys)
    assert "'kode' is no domain" in line and "code" in line


def test_merge_mix_not_summing_to_one_is_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = b.write_jsonl(tmp_path / "a.jsonl", b.specforge_rows())
    args = ["merge", "--existing", str(data), "--allow-drop"]  # a few rows: the plan keeps little
    _ok([*args, "--out", str(tmp_path / "m"), "--mix", "code=0.5,math=0.45"])
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if x.startswith("warning:")]
    assert warnings == [
        "warning: --mix shares sum to 0.95, not 1; normalised to code=0.526,math=0.474"
    ]
    _ok([*args, "--out", str(tmp_path / "m2"), "--mix", "code=0.5,math=0.5"])
    assert "warning" not in capsys.readouterr().err


def test_tokenize_a_missing_run_says_it_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    line = _error_line(["tokenize", "nope/", "--tokenizer", str(tmp_path)], capsys)
    assert "nope/ does not exist" in line


def test_tokenizer_folder_without_a_tokenizer_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = b.run_dir(tmp_path / "run")
    empty = tmp_path / "model"
    empty.mkdir()
    line = _error_line(["tokenize", str(run), "--tokenizer", str(empty)], capsys)
    assert "no tokenizer.json or tokenizer_config.json" in line
    line = _error_line(["tokenize", str(run), "--tokenizer", "/nope"], capsys)
    assert "/nope does not exist" in line


def test_fleet_sim_tokenizer_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(["fleet", "sim", "--tokenizer", "/nope"], capsys)
    assert "/nope does not exist" in line and "Repo id" not in line


def test_generate_fleet_file_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = b.write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "messages": b.chat("hi")[:1]}])
    argv = ["generate", "--prompts", str(prompts), "--out", str(tmp_path / "run")]
    line = _error_line([*argv, "--fleet", str(tmp_path / "nofleet.yaml")], capsys)
    assert "nofleet.yaml does not exist" in line and "fleet up" in line


def test_a_bad_choice_lists_the_allowed_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--prompts", "p.jsonl", "--endpoint", "http://127.0.0.1:1"]
    line = _error_line([*argv, "--out", str(tmp_path / "r"), "--reasoning", "yes"], capsys)
    assert "reasoning: 'yes' is not one of on, off, server" in line


def test_offline_hub_sources_fail_fast_and_say_how_to_use_local_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from draftdata.prepare.config import SourceConfig

    with socket.socket() as s:  # a local port nothing listens on: the hub "cannot be reached"
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    hub = [SourceConfig(name="metamath", schema="metamath", hub="meta-math/MetaMathQA")]
    cfg = _prepare_config(tmp_path, sources=hub)
    start = time.monotonic()
    line = _error_line(["prepare", str(cfg), "--plan-only", "-q"], capsys)
    assert time.monotonic() - start < 5
    assert "the Hugging Face hub" in line and "cannot be reached" in line
    assert "`path:`" in line and "HF_HUB_OFFLINE=1" in line


def test_piped_output_keeps_summary_lines_whole(tmp_path: Path) -> None:
    """Piped, rich would wrap at 80 columns; a summary line must stay one line."""
    run = b.run_dir(tmp_path / ("a-rather-long-folder-name-" * 3) / "run")
    out = subprocess.run(
        [*CLI, "stats", str(run)], capture_output=True, text=True, check=True, env=_no_columns()
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("whole run:"))
    assert line.endswith(")") or "active" in line
    assert "failures" in line and "active" in line  # not cut at 80 columns
    data = b.write_jsonl(tmp_path / "a.jsonl", b.specforge_rows())
    dest = tmp_path / ("another-long-output-folder-" * 3)
    merged = subprocess.run(
        [*CLI, "merge", "--existing", str(data), "--out", str(dest)],
        capture_output=True,
        text=True,
        check=True,
        env=_no_columns(),
    ).stdout
    last = next(x for x in merged.splitlines() if "train +" in x)
    assert last.endswith("report: merge_report.json")


def test_help_shows_no_type_after_flags() -> None:
    for cmd in (["merge"], ["prepare"], ["generate"], ["tokenize"], ["report"], ["fleet", "up"]):
        out = subprocess.run(
            [*CLI, *cmd, "--help"], capture_output=True, text=True, check=True, env=_no_columns()
        ).stdout
        assert "<bool>" not in out, cmd
        assert "--help" in out
    merge_help = subprocess.run(
        [*CLI, "merge", "--help"], capture_output=True, text=True, check=True, env=_no_columns()
    ).stdout
    assert "<int>" in merge_help  # options that take a value keep their type


def _no_columns() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def test_hub_probe_answers_hangs_and_offline_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any HTTP answer is reachable; a server that never answers fails within the timeout;
    HF_HUB_OFFLINE skips the probe (the local cache is used)."""
    import http.server
    import threading

    from draftdata.errors import InputError
    from draftdata.prepare.config import SourceConfig
    from draftdata.prepare.load import check_hub_reachable

    hub = [SourceConfig(name="m", schema="metamath", hub="meta-math/MetaMathQA")]
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:  # the stock handler answers HEAD with 501: an answer
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        check_hub_reachable(hub, timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as mute:  # listens, never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{mute.getsockname()[1]}")
        start = time.monotonic()
        with pytest.raises(InputError, match="cannot be reached"):
            check_hub_reachable(hub, timeout=0.5)
        assert time.monotonic() - start < 2
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        check_hub_reachable(hub, timeout=0.5)  # skipped: no error


def test_fleet_status_without_a_fleet_file_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in (["fleet", "status"], ["fleet", "down"], ["fleet", "status", "other.yaml"]):
        line = _error_line(argv, capsys)
        name = argv[2] if len(argv) > 2 else "fleet.yaml"
        assert f"{name}: {name}" not in line  # the name once, not "fleet.yaml: fleet.yaml ..."
        assert f"{name} does not exist" in line and "fleet up" in line and "fleet sim" in line


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the command tree under ``group`` (its path of names; Typer carries its
    own click, so groups are known by their ``list_commands``)."""
    out = [path]
    if hasattr(group, "list_commands"):
        ctx = group.context_class(group)
        for name in group.list_commands(ctx):
            out.extend(_commands(group.get_command(ctx, name), (*path, name)))
    return out


def test_help_in_a_pipe_cuts_nothing() -> None:
    """Piped, rich draws --help at 80 columns and cuts a long word in a help cell with an
    ellipsis (a path template, a list of variables); every command's help reads whole."""
    import typer

    from draftdata.cli import app

    commands = _commands(typer.main.get_command(app))
    assert ("generate",) in commands and ("fleet", "up") in commands

    # one child process for every command (a start-up each took ~12 s in all), its stdout a
    # pipe as a user's is; each command's help follows a line naming it
    mark = "=== draftdata help of "
    child = (
        "import json, sys\n"
        "from draftdata.cli import main\n"
        "for path in json.loads(sys.argv[1]):\n"
        f"    print({mark!r} + json.dumps(path), flush=True)\n"
        "    try:\n"
        "        main([*path, '--help'])\n"
        "    except SystemExit as exc:\n"
        "        if exc.code not in (0, None):\n"
        "            raise\n"
        "    sys.stdout.flush()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, json.dumps(commands)],
        capture_output=True,
        text=True,
        check=True,
        env=_no_columns(),
        timeout=300,
    ).stdout
    helps: dict[tuple[str, ...], str] = {}
    for chunk in out.split(mark)[1:]:
        head, _, text = chunk.partition("\n")
        helps[tuple(json.loads(head))] = text
    assert list(helps) == commands
    for path, text in helps.items():
        assert "Usage:" in text, path
        assert "…" not in text, (path, [x for x in text.splitlines() if "…" in x])


def test_fleet_up_without_the_engine_is_one_line_before_launching(tmp_path: Path) -> None:
    """No server is started (no fleet.yaml, no logs) and the line says what to install or
    which interpreter to point at; the old way was a FAILED and a "stopped" line per server.
    (A --python that does not exist is caught with the other path options.)"""
    import importlib.util

    for engine in ("sglang", "vllm"):
        if importlib.util.find_spec(engine) is not None:
            pytest.skip(f"{engine} is installed in this interpreter")
    cases = [
        (["--engine", "sglang", "--gpus", "0-7"], "sglang is not installed for"),
        (["--engine", "vllm", "--gpus", "0-3", "--python", str(tmp_path / "nopy")], "not exist"),
        (
            ["--engine", "command", "--gpus", "0", "--command", "no-such-server {port}"],
            "not an exec",
        ),
    ]
    for args, says in cases:
        res = subprocess.run(
            [*CLI, "fleet", "up", "--model", "m", *args, "--out", str(tmp_path / "fleet.yaml")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            check=False,
        )
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, res.stderr + res.stdout
        assert says in lines[0], lines[0]
        assert "FAILED" not in res.stdout and "stopped" not in res.stdout
        assert not (tmp_path / "fleet.yaml").exists() and not (tmp_path / "fleet-logs").exists()
