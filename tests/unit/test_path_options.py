"""Every path option of every command, given a wrong path, fails in one line (generated).

The commands are walked the way ``test_readme_options.py`` walks them. Each option that takes a
local path has a role (``PATH_OPTIONS``); a role generates its cases: a file where a folder is
expected and back, a path under a file (``README.md/x``, ``/dev/null/x``), a place that cannot
be written (``/sys``, ``/proc``, a read-only mount where this machine allows one), an existing
output, a missing parent, a missing input, a file that is not a dataset. A wrong path must end
the command with exit 1 (or 2), one line on stderr naming the path as given, and no traceback;
a case the command may accept (a missing parent folder is created, an existing report is
replaced) must end with exit 0 or that same one line.

``test_every_path_option_has_a_role`` keeps the table complete: an option whose name or help
speaks of files, folders or paths must be in ``PATH_OPTIONS`` or, with the reason, in
``NOT_PATHS``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main

from draftdata.cli import app, main

# roles
IN_FILE = "input file"
IN_DIR = "input folder"
IN_ANY = "input file or folder"
IN_DATA = "dataset (file or folder)"
OUT_FILE = "output file"
OUT_DIR = "output folder"


@dataclass(frozen=True)
class Role:
    kind: str
    existing: str = "accept"  # an existing output: "accept" (resume, replace) or "refuse"


# (command, option or argument name) -> role
PATH_OPTIONS: dict[tuple[str, str], Role] = {
    ("prepare", "config"): Role(IN_FILE),
    ("prepare", "--out"): Role(OUT_DIR),
    ("prepare", "--write-samples"): Role(OUT_DIR),
    ("prepare", "--mix"): Role(IN_FILE),  # shares, or a file holding a mix
    ("prepare", "--lengths"): Role(IN_ANY),
    ("generate", "--prompts"): Role(IN_ANY),
    ("generate", "--fleet"): Role(IN_FILE),
    ("generate", "--out"): Role(OUT_DIR),
    ("generate", "--config"): Role(IN_FILE),
    ("generate", "--summary-json"): Role(OUT_FILE),
    ("export", "run"): Role(IN_DIR),
    ("export", "--out"): Role(OUT_FILE, existing="refuse"),
    ("export", "--tokenizer"): Role(IN_DIR),
    ("export", "--chat-template"): Role(IN_FILE),
    ("tokenize", "run"): Role(IN_DATA),
    ("tokenize", "--tokenizer"): Role(IN_DIR),
    ("tokenize", "--chat-template"): Role(IN_FILE),
    ("tokenize", "--out"): Role(OUT_DIR),
    ("merge", "--existing"): Role(IN_DATA),
    ("merge", "--add"): Role(IN_DATA),
    ("merge", "--out"): Role(OUT_DIR, existing="refuse"),
    ("merge", "--tmp-dir"): Role(OUT_DIR),
    ("merge", "--mix"): Role(IN_FILE),  # shares, or a file holding a mix
    ("merge", "--tokenizer"): Role(IN_DIR),
    ("stats", "dataset"): Role(IN_DATA),
    ("stats", "--tokenizer"): Role(IN_DIR),
    ("report", "target"): Role(IN_DATA),
    ("report", "more"): Role(IN_DATA),
    ("report", "--compare"): Role(IN_DATA),
    ("report", "--out"): Role(OUT_FILE),
    ("demo", "--out"): Role(OUT_DIR, existing="refuse"),
    ("demo", "--cache-dir"): Role(OUT_DIR),
    ("fleet up", "--out"): Role(OUT_FILE),
    ("fleet up", "--log-dir"): Role(OUT_DIR),
    ("fleet up", "--python"): Role(IN_FILE),
    ("fleet sim", "--out"): Role(OUT_FILE),
    ("fleet sim", "--tokenizer"): Role(IN_DIR),
    ("acceptance", "--prompts"): Role(IN_ANY),
    ("acceptance", "--fleet"): Role(IN_FILE),
    ("acceptance", "--out"): Role(OUT_DIR),
    ("fleet status", "fleet"): Role(IN_FILE),
    ("fleet down", "fleet"): Role(IN_FILE),
    ("run check", "run"): Role(IN_DIR),
    ("hidden-states", "tokenized"): Role(IN_DATA),
    ("hidden-states", "--model"): Role(IN_DIR),
    ("hidden-states", "--out"): Role(OUT_DIR),
    ("hidden-states", "--fleet"): Role(IN_FILE),
    ("fleet sim", "--hidden-states"): Role(OUT_DIR),
    ("fleet up", "--hidden-states"): Role(OUT_DIR),
}

# options the heuristic below takes for paths that are none, and why
NOT_PATHS: dict[tuple[str, str], str] = {
    ("export", "--format"): "a format name",
    ("fleet sim", "--mean-output-tokens"): "a number",
    ("fleet up", "--model"): "a hub id or the engine's model path, read by the engine",
    ("generate", "--limit"): "a number",
    ("acceptance", "--per-domain"): "a number",
    ("generate", "--api-key-env"): "an environment variable's name",
    ("generate", "--protect"): "a prefix compared with outputs, never read or written",
    ("merge", "--protect"): "a prefix compared with outputs, never read or written",
    ("tokenize", "--protect"): "a prefix compared with outputs, never read or written",
    ("generate", "--order"): "a choice",
    ("generate", "--progress"): "a choice",
    ("generate", "--fleet-per-node"): "a template resolved on each Ray node",
    ("generate", "--ray-env"): "an environment variable's name",
    ("tokenize", "--ray-env"): "an environment variable's name",
    ("prepare", "--force"): "a flag",
    ("tokenize", "--verify"): "a flag",
    ("hidden-states", "--format"): "a format name",
    ("hidden-states", "--fleet-per-node"): "a template resolved on each Ray node, never here",
    ("hidden-states", "--ray-env"): "an environment variable's name",
    ("fleet sim", "--hidden-write-seconds"): "a number",
    ("fleet sim", "--fault-hidden-missing"): "a rate",
    ("fleet sim", "--fault-hidden-wrong-ids"): "a rate",
    ("hidden-states", "--protect"): "a prefix compared with outputs, never read or written",
    ("hidden-states", "--staging-bytes"): "a size",
    ("hidden-states", "--max-bytes"): "a size",
}

# commands that never end on their own when they start (they serve until Ctrl-C)
SERVES = {"fleet sim"}

_WORDS = ("file", "folder", "director", "path", "s3://", ".yaml", "dataset", "interpreter")
_NAMES = ("out", "config", "fleet", "run", "target", "dataset", "more")


def _commands(cmd: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, f"{path} {name}".strip())


def _key(param: Any) -> str:
    return str(param.opts[0]) if param.param_type_name == "option" else str(param.name)


def _params() -> dict[tuple[str, str], Any]:
    return {
        (path, _key(p)): p
        for path, cmd in _commands(typer.main.get_command(app), "")
        for p in cmd.params
        if path and _key(p) != "--help"
    }


def _looks_like_a_path(param: Any) -> bool:
    text = (getattr(param, "help", None) or "").lower()
    name = str(param.name)
    return (
        any(w in text for w in _WORDS)
        or name in _NAMES
        or name.endswith("dir")
        or (param.metavar or "") in ("PATH", "FILE", "URL", "RUN_URL", "DIR")
    )


def test_every_path_option_has_a_role() -> None:
    params = _params()
    assert set(PATH_OPTIONS) <= set(params), set(PATH_OPTIONS) - set(params)
    assert set(NOT_PATHS) <= set(params), set(NOT_PATHS) - set(params)
    unclassified = [k for k, p in params.items() if _looks_like_a_path(p) and k not in PATH_OPTIONS]
    assert [k for k in unclassified if k not in NOT_PATHS] == []


# -- the cases each role generates -------------------------------------------------------------

ERROR = "error"  # exit 1/2, one line naming the path, no traceback
EITHER = "either"  # exit 0, or the same one line

_CASES: dict[str, list[tuple[str, str]]] = {
    IN_FILE: [("missing", ERROR), ("folder", ERROR), ("under_file", ERROR)],
    IN_DIR: [("missing", ERROR), ("file", ERROR), ("under_file", ERROR)],
    IN_ANY: [("missing", ERROR), ("under_file", ERROR), ("under_device", ERROR)],
    IN_DATA: [("missing", ERROR), ("under_file", ERROR), ("not_data", ERROR)],
    OUT_FILE: [
        ("folder", ERROR),
        ("under_file", ERROR),
        ("under_device", ERROR),
        ("sys", ERROR),
        ("proc", ERROR),
        ("read_only", ERROR),
        ("existing", EITHER),
        ("missing_parent", EITHER),
    ],
    OUT_DIR: [
        ("file", ERROR),
        ("under_file", ERROR),
        ("under_device", ERROR),
        ("sys", ERROR),
        ("proc", ERROR),
        ("read_only", ERROR),
        ("existing", EITHER),
        ("missing_parent", EITHER),
    ],
}


def _cases() -> Iterator[Any]:
    for (command, option), role in sorted(PATH_OPTIONS.items()):
        for case, expect in _CASES[role.kind]:
            if case == "existing" and role.existing == "refuse":
                expect = ERROR
            if expect == EITHER and command in SERVES:
                continue  # it would start serving
            yield pytest.param(command, option, case, expect, id=f"{command}:{option}:{case}")


@dataclass
class World:
    """The valid inputs every command's base invocation uses."""

    root: Path
    config: Path
    prompts: Path
    run: Path
    tokenizer: Path
    fleet: Path
    a_file: Path
    a_yaml: Path
    read_only: Path | None


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    import msgspec
    from tests.unit.stats import builders as b

    from draftdata.demo.tokenizer import ensure_demo_tokenizer
    from draftdata.prepare.samples import sample_config, write_sample_sources
    from draftdata.shared.fleetspec import EndpointSpec, FleetSpec, write_fleet

    root = tmp_path_factory.mktemp("world")
    samples = root / "samples"
    write_sample_sources(samples)
    cfg = sample_config(samples, Path("prompts"), budget=20)
    config = root / "quickstart.yaml"
    config.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "p1", "messages": [{"role": "user", "content": "Hello?"}]}) + "\n"
    )
    run = b.run_dir(root / "run")
    tokenizer = ensure_demo_tokenizer(root / "cache")
    fleet = root / "fleet.yaml"
    write_fleet(FleetSpec(endpoints=[EndpointSpec(url="http://127.0.0.1:9")]), fleet)
    a_file = root / "README.md"
    a_file.write_text("a file\n")
    a_yaml = root / "expansion-local.yaml"
    shutil.copy(config, a_yaml)
    read_only = _read_only_mount(root)
    try:
        yield World(root, config, prompts, run, tokenizer, fleet, a_file, a_yaml, read_only)
    finally:
        if read_only is not None:
            subprocess.run(["umount", str(read_only)], check=False, capture_output=True)


def _read_only_mount(root: Path) -> Path | None:
    """A read-only bind mount of an empty folder, where this machine lets us make one."""
    if shutil.which("mount") is None:
        return None
    src, mnt = root / "ro-src", root / "ro"
    src.mkdir()
    mnt.mkdir()
    ok = subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode
    if ok != 0:
        return None
    subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], capture_output=True)
    try:
        (mnt / "probe").touch()
    except OSError:
        return mnt
    (mnt / "probe").unlink()
    subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
    return None


def _base(command: str, w: World, new: Path) -> tuple[list[str], dict[str, list[str]]]:
    """(command words, {option or argument: values}) of a valid invocation."""
    words = command.split()
    args: dict[str, dict[str, list[str]]] = {
        "prepare": {"config": [str(w.config)], "--out": [str(new / "prompts")]},
        "generate": {
            "--prompts": [str(w.prompts)],
            "--endpoint": ["http://127.0.0.1:9"],
            "--out": [str(new / "run")],
            "--unavailable-timeout": ["1"],
            "--connect-timeout": ["0.5"],
            "--progress": ["off"],
        },
        "export": {"run": [str(w.run)], "--out": [str(new / "x.jsonl")]},
        "tokenize": {
            "run": [str(w.run)],
            "--tokenizer": [str(w.tokenizer)],
            "--out": [str(new / "tok")],
        },
        "merge": {"--add": [str(w.run)], "--out": [str(new / "merged")]},
        "stats": {"dataset": [str(w.run)]},
        "report": {"target": [str(w.run)], "--out": [str(new / "r.html")]},
        "demo": {
            "--out": [str(new / "demo")],
            "--budget": ["6"],
            "--servers": ["1"],
            "--time-scale": ["0"],
            "--mean-output-tokens": ["20"],
        },
        "fleet up": {
            "--engine": ["command"],
            "--command": ["false"],
            "--model": ["m"],
            "--gpus": ["0"],
            "--port-base": ["9"],
            "--timeout": ["5"],
            "--out": [str(new / "fleet.yaml")],
            "--log-dir": [str(new / "logs")],
        },
        "fleet sim": {"--servers": ["1"], "--time-scale": ["0"]},
        "acceptance": {
            "--prompts": [str(w.prompts)],
            "--endpoint": ["http://127.0.0.1:9"],
            "--out": [str(new / "acc")],
        },
        "fleet status": {"fleet": [str(w.fleet)]},
        "fleet down": {"fleet": [str(w.fleet)]},
        "run check": {"run": [str(w.run)]},
        "hidden-states": {
            "tokenized": [str(w.run)],
            "--model": [str(w.tokenizer)],
            "--out": [str(new / "hs")],
            "--format": ["specforge"],
        },
    }
    return words, args[command]


def _argv(words: list[str], args: dict[str, list[str]], params: dict[str, Any]) -> list[str]:
    argv = list(words)
    for name, values in args.items():
        if name.startswith("-"):
            for v in values:
                argv += [name, v]
    for name in params:  # arguments in their declared order
        if not name.startswith("-") and name in args:
            argv += args[name]
    return argv


def _value(case: str, role: Role, w: World, new: Path) -> str | None:
    """The wrong (or questionable) path of one case; None when this machine cannot make it."""
    folder = new / "existing"  # a folder holding something that is not the command's
    folder.mkdir()
    (folder / "notes.txt").write_text("not ours\n")
    earlier = new / "existing.out"  # an earlier output file
    earlier.write_text("an earlier output\n")
    values = {
        "missing": str(new / "nowhere" / "missing.x"),
        "folder": str(folder),
        "file": str(w.a_file),
        "under_file": f"{w.a_file}/x",
        "under_device": "/dev/null/x",
        "sys": "/sys/draftdata-path-test/x",
        "proc": "/proc/draftdata-path-test/x",
        "read_only": str(w.read_only / "x") if w.read_only is not None else None,
        "not_data": str(w.a_yaml),
        "missing_parent": str(new / "a" / "b" / "out.x"),
        "existing": str(earlier if role.kind == OUT_FILE else folder),
    }
    return values[case]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("command", "option", "case", "expect"), list(_cases()))
def test_a_wrong_path_is_one_line(
    command: str,
    option: str,
    case: str,
    expect: str,
    world: World,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    new = tmp_path / "new"
    new.mkdir()
    value = _value(case, PATH_OPTIONS[(command, option)], world, new)
    if value is None:
        pytest.skip("no read-only mount on this machine")
    words, args = _base(command, world, new)
    args = dict(args)
    args[option] = [value]
    if command in ("generate", "acceptance") and option == "--fleet":
        args.pop("--endpoint")
    params = {k[1]: p for k, p in _params().items() if k[0] == command}
    code, out, err = _run(_argv(words, args, params), capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in out + err
    if expect == EITHER and code == 0:
        return
    assert code in (1, 2), (code, out, err)
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert value in lines[0] or expect == EITHER, err
    else:
        assert value in err, err
