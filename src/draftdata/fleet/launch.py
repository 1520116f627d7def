"""Plan and start a fleet: one inference server process per GPU (or one data-parallel server).

``plan_fleet`` turns a :class:`LaunchConfig` into one :class:`ServerPlan` per process: the argv
of the engine preset (SGLang, vLLM, the draftdata simulator, or a user command template), its
environment (``CUDA_VISIBLE_DEVICES`` per process), its port (consecutive from ``port_base``) and
its log file. ``start_server`` starts one plan as its own process group (so ``fleet down`` can
stop the server and every worker it forks) and returns a :class:`Started` handle carrying the
pid, process-group id and kernel start time that identify it later.

``check_engine`` asks, before anything starts, whether the engine can run at all (its module
importable by the interpreter that runs it, or the ``--command`` executable on PATH), so a
missing engine is one line instead of every server failing and being stopped one by one.

This module does not wait for readiness, probe servers or stop them: that is
:mod:`draftdata.fleet.supervise`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from draftdata.errors import ConfigError, FleetError
from draftdata.shared.fleetspec import process_start_time
from draftdata.shared.tokenizer_folder import TOKENIZER_FILES

ENGINES = ("sglang", "vllm", "sim", "command")
HIDDEN_ENGINES = ("vllm", "sim")  # the engines `--hidden-states` launches
# vLLM 0.32's hidden-state KV connector (docs/engines.md, "vLLM's hidden-state extraction")
VLLM_HIDDEN_CONNECTOR = "ExampleHiddenStatesConnector"

# Tuning flags per engine: what worked for the 193K expansion (SGLang 0.5.x on SM120 GPUs:
# FA3/FA4 unsupported there, so flashinfer; ``no_buffer`` mamba scheduling doubled concurrency
# from 37 to 72 requests per GPU; 8K context; ~85 of 98 GB). Each can be overridden by passing
# the same flag in ``--extra-args``; ``preset_args=False`` drops them all.
SGLANG_PRESET: tuple[str, ...] = (
    "--attention-backend",
    "flashinfer",
    "--mamba-scheduler-strategy",
    "no_buffer",
    "--reasoning-parser",
    "qwen3",
    "--context-length",
    "8192",
    "--mem-fraction-static",
    "0.85",
)
# SGLang renamed the mamba flag: 0.5.23 knows only ``--mamba-radix-cache-strategy`` and refuses
# the seed's ``--mamba-scheduler-strategy`` ("unrecognized arguments"); releases between kept the
# old name as an alias. The preset names it as the installed SGLang does (``sglang_preset``).
SGLANG_MAMBA_RENAMED = (0, 5, 23)
SGLANG_MAMBA_FLAGS = ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy")


def version_tuple(version: str) -> tuple[int, ...]:
    """``0.5.23.post1`` -> ``(0, 5, 23)``: the leading numeric parts."""
    out: list[int] = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def sglang_preset(version: str | None) -> tuple[str, ...]:
    """``SGLANG_PRESET`` with the mamba flag named as SGLang ``version`` knows it (unknown: the
    current name)."""
    if version is not None and version_tuple(version) < SGLANG_MAMBA_RENAMED:
        return SGLANG_PRESET
    old, new = SGLANG_MAMBA_FLAGS
    return tuple(new if a == old else a for a in SGLANG_PRESET)


def installed_version(python: str, package: str, timeout: float = 60.0) -> str | None:
    """The version of ``package`` installed for ``python`` (package metadata only: no import
    of the engine); None when it cannot tell."""
    code = f"from importlib.metadata import version; print(version({package!r}))"
    try:
        res = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = res.stdout.strip()
    return out if res.returncode == 0 and out else None


VLLM_PRESET: tuple[str, ...] = (
    "--reasoning-parser",
    "qwen3",
    "--max-model-len",
    "8192",
    "--gpu-memory-utilization",
    "0.85",
)
# The simulator standing in for a real fleet (the walkthrough's no-GPU tip): 100x a real 27B
# model's decode speed, so a request takes about a second instead of a minute.
SIM_PRESET: tuple[str, ...] = ("--time-scale", "0.01")


def sim_preset(model: str) -> tuple[str, ...]:
    """``SIM_PRESET``, plus ``--tokenizer MODEL`` when ``--model`` is a local model folder with a
    tokenizer (as a real engine would load it): real token ids in the target's template."""
    path = Path(model).expanduser()
    if path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES):
        return (*SIM_PRESET, "--tokenizer", str(path))
    return SIM_PRESET


# Flags whose value is the context length / capacity, per engine (read back from the argv when
# a server does not report them itself).
CONTEXT_FLAGS = ("--context-length", "--max-model-len")
CAPACITY_FLAGS = ("--max-running-requests", "--max-num-seqs", "--max-running")


class LaunchConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Everything ``fleet up`` needs to start a fleet (no defaults hidden elsewhere).

    ``gpus`` None means: detect with ``nvidia-smi`` (engines sglang/vllm/command) or one server
    (sim). ``dp`` > 1 starts ONE server over all the GPUs with data parallelism instead of one
    server per GPU. ``python`` is the interpreter that runs the engine module (default: this
    one, or ``$DRAFTDATA_ENGINE_PYTHON``).
    """

    engine: str
    model: str
    gpus: tuple[str, ...] | None = None
    port_base: int = 30000
    host: str = "127.0.0.1"
    dp: int = 1
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    command: str | None = None
    preset_args: bool = True
    python: str | None = None
    log_dir: str = "fleet-logs"
    engine_version: str | None = None  # the installed engine's (fleet_up finds SGLang's)
    # hidden states (``--hidden-states DIR``): servers that write each request's hidden states
    # under DIR for ``hidden-states --engine vllm``, capturing ``hidden_layers`` (vLLM's index
    # space: N = the last layer before the final norm) with the KV connector
    # ``hidden_connector`` (None: vLLM's ExampleHiddenStatesConnector; ``MODULE:CLASS``: one
    # the engine's python imports); ``hidden_size`` is the simulator's width (from config.json)
    hidden_states: str | None = None
    hidden_layers: tuple[int, ...] = ()
    hidden_connector: str | None = None
    hidden_size: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r}: expected one of {', '.join(ENGINES)}")
        if self.engine == "command" and not self.command:
            raise ConfigError(
                "--engine command needs --command TEMPLATE, e.g. "
                "--command 'my-server --port {port} --model {model}'"
            )
        if self.command and self.engine != "command":
            raise ConfigError(f"--command is only used with --engine command (got {self.engine})")
        if not 1 <= self.port_base <= 65535:
            raise ConfigError(f"--port-base {self.port_base}: expected a TCP port 1-65535")
        if self.dp < 1:
            raise ConfigError(f"--dp {self.dp}: expected >= 1")
        if self.hidden_states is not None:
            if self.engine not in HIDDEN_ENGINES:
                raise ConfigError(
                    f"--hidden-states: --engine {self.engine} cannot extract hidden states; "
                    "use --engine vllm (or sim, the simulator speaking the same protocol)"
                )
            if not self.hidden_layers:
                raise ConfigError("--hidden-states: no layer to capture (--hidden-layers)")
            if min(self.hidden_layers) < 0 or len(set(self.hidden_layers)) != len(
                self.hidden_layers
            ):
                raise ConfigError(
                    f"--hidden-layers {list(self.hidden_layers)}: layer ids are distinct and >= 0"
                )
            if self.engine == "sim" and not self.hidden_size:
                raise ConfigError(
                    "--engine sim --hidden-states: the simulator needs the target's hidden size; "
                    "give --model a model folder with config.json"
                )
        elif self.hidden_connector is not None:
            raise ConfigError("--hidden-connector is only used with --hidden-states DIR")


class ServerPlan(msgspec.Struct, kw_only=True, frozen=True):
    """One server process to start: argv, extra environment, port, GPUs, log file."""

    index: int
    engine: str
    gpu: str
    port: int
    host: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    log: str

    @property
    def url(self) -> str:
        """The base URL the server will listen on."""
        return f"http://{self.host}:{self.port}"

    def flag(self, *names: str) -> str | None:
        """The value of the last of ``names`` in this server's argv (``--f v`` or ``--f=v``)."""
        return flag_value(self.argv, *names)


class Started(msgspec.Struct, kw_only=True, frozen=True):
    """A started server: its plan plus the identity of its process (pid, pgid, start time)."""

    plan: ServerPlan
    pid: int
    pgid: int
    started: float


def parse_gpus(text: str) -> tuple[str, ...]:
    """Parse ``--gpus``: ``0-7``, ``0,2,5``, ``0-3,6`` or ``4`` into GPU ids, in order.

    Duplicates and empty ranges are configuration errors, named with the offending piece.
    """
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        lo, sep, hi = piece.partition("-")
        try:
            ids = range(int(lo), int(hi) + 1) if sep else range(int(lo), int(lo) + 1)
        except ValueError:
            raise ConfigError(
                f"--gpus {text!r}: {piece!r} is not a GPU id or range (use e.g. 0-7 or 0,2,5)"
            ) from None
        if not ids:
            raise ConfigError(f"--gpus {text!r}: range {piece!r} is empty")
        for i in ids:
            if str(i) in out:
                raise ConfigError(f"--gpus {text!r}: GPU {i} is listed twice")
            out.append(str(i))
    if not out:
        raise ConfigError(f"--gpus {text!r}: no GPU listed")
    return tuple(out)


def parse_nvidia_smi(output: str) -> tuple[str, ...]:
    """GPU indices from ``nvidia-smi --query-gpu=index --format=csv,noheader`` output."""
    return tuple(line.strip() for line in output.splitlines() if line.strip().isdigit())


def detect_gpus() -> tuple[str, ...]:
    """The GPUs ``nvidia-smi`` lists; FleetError when it is missing, fails or lists none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FleetError("no --gpus given and nvidia-smi is not on PATH; pass --gpus 0-7")
    try:
        res = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FleetError(f"nvidia-smi failed ({exc}); pass --gpus explicitly") from exc
    gpus = parse_nvidia_smi(res.stdout)
    if res.returncode != 0 or not gpus:
        detail = (res.stderr or res.stdout).strip().splitlines()[:1]
        raise FleetError(
            f"nvidia-smi lists no GPU (exit {res.returncode}"
            f"{': ' + detail[0] if detail else ''}); pass --gpus explicitly"
        )
    return gpus


def parse_env(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Parse repeated ``--env K=V`` options; a piece without ``=`` is a ConfigError."""
    out: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum():
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE, e.g. --env HF_HUB_OFFLINE=1")
        out.append((key, value))
    return tuple(out)


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of any flag in ``names`` (``--f v`` or ``--f=v``)."""
    found: str | None = None
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in names:
            if eq:
                found = value
            elif i + 1 < len(argv):
                found = argv[i + 1]
    return found


def _split_flags(args: Sequence[str]) -> list[list[str]]:
    """Group an argv tail into ``[flag, value...]`` chunks (a chunk starts at each ``--x``)."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def merge_args(preset: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``preset`` with every flag that ``extra`` also sets removed, then ``extra`` appended.

    So ``--extra-args "--context-length 4096"`` replaces the preset's 8192 instead of passing
    the flag twice (engines differ on which one wins).
    """
    overridden = {g[0].partition("=")[0] for g in _split_flags(extra) if g[0].startswith("--")}
    kept = [g for g in _split_flags(preset) if g[0].partition("=")[0] not in overridden]
    return [a for g in kept for a in g] + list(extra)


def hidden_states_args(cfg: LaunchConfig) -> list[str]:
    """The flags that make a server write hidden states (empty without ``--hidden-states``).

    vLLM: the ``extract_hidden_states`` speculative method capturing ``hidden_layers`` and the
    hidden-states KV connector writing under the folder (``MODULE:CLASS`` loads a connector of
    one's own through ``kv_connector_module_path``). The simulator: the same protocol
    (``fleet sim --hidden-states``)."""
    if cfg.hidden_states is None:
        return []
    layers = [int(i) for i in cfg.hidden_layers]
    if cfg.engine == "sim":
        args = ["--flavor", "vllm", "--hidden-states", cfg.hidden_states]
        args += ["--hidden-layers", ",".join(str(i) for i in layers)]
        return [*args, "--hidden-size", str(cfg.hidden_size)]
    module, _, name = (cfg.hidden_connector or VLLM_HIDDEN_CONNECTOR).rpartition(":")
    kv: dict[str, object] = {"kv_connector": name, "kv_role": "kv_producer"}
    if module:
        kv["kv_connector_module_path"] = module
    kv["kv_connector_extra_config"] = {"shared_storage_path": cfg.hidden_states}
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}},
    }
    encode = msgspec.json.encode
    return [
        "--speculative-config",
        encode(spec).decode(),
        "--kv-transfer-config",
        encode(kv).decode(),
    ]


def engine_python(cfg: LaunchConfig) -> str:
    """The interpreter that runs the engine module: ``--python``, the env var, or this one."""
    return cfg.python or os.environ.get("DRAFTDATA_ENGINE_PYTHON") or sys.executable


def _fill(template: str, values: Mapping[str, str]) -> list[str]:
    """Split a ``--command`` template with shell rules and substitute its placeholders."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"--command {template!r}: {exc}") from None
    out = []
    for word in words:
        for key, value in values.items():
            word = word.replace("{" + key + "}", value)
        out.append(word)
    return out


def base_argv(cfg: LaunchConfig, port: int, gpu: str, index: int) -> list[str]:
    """The engine's command line for one server, before ``--extra-args`` are merged in."""
    py = engine_python(cfg)
    if cfg.engine == "sglang":
        argv = [py, "-m", "sglang.launch_server", "--model-path", cfg.model]
        argv += ["--host", cfg.host, "--port", str(port)]
        if cfg.dp > 1:
            argv += ["--dp-size", str(cfg.dp)]
        preset: Sequence[str] = sglang_preset(cfg.engine_version)
    elif cfg.engine == "vllm":
        argv = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg.model]
        argv += ["--host", cfg.host, "--port", str(port)]
        if cfg.dp > 1:
            argv += ["--data-parallel-size", str(cfg.dp)]
        preset = VLLM_PRESET
    elif cfg.engine == "sim":
        # The simulator is draftdata itself; one process per "GPU" keeps the process model of a
        # real fleet (a crash takes down one server, down stops each by pid).
        argv = [py, "-c", "from draftdata.cli import main; main()", "fleet", "sim"]
        argv += ["--servers", "1", "--port-base", str(port), "--model", cfg.model]
        preset = sim_preset(cfg.model)
    else:
        assert cfg.command is not None  # checked in LaunchConfig
        values = {"gpu": gpu, "port": str(port), "model": cfg.model, "host": cfg.host}
        values["index"] = str(index)
        values["python"] = py
        return _fill(cfg.command, values)
    return argv + (list(preset) if cfg.preset_args else []) + hidden_states_args(cfg)


# the module each engine preset runs (``base_argv``), asked for before launching
ENGINE_MODULES = {"sglang": "sglang", "vllm": "vllm", "sim": "draftdata"}
_FIND = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"


def check_engine(cfg: LaunchConfig, plans: Sequence[ServerPlan]) -> None:
    """FleetError (one line, nothing started) when the engine cannot run: the interpreter is
    missing, cannot import the engine's module, or the ``--command`` executable is not found."""
    if not plans:
        return
    if cfg.engine == "command":
        exe = plans[0].argv[0] if plans[0].argv else ""
        if not exe or (shutil.which(exe) is None and not os.access(exe, os.X_OK)):
            raise FleetError(
                f"fleet up: --command: {exe!r} is not an executable on PATH; nothing was started"
            )
        return
    module = ENGINE_MODULES[cfg.engine]
    py = engine_python(cfg)
    fix = (
        f"install {module} for it, or point --python (or $DRAFTDATA_ENGINE_PYTHON) at the "
        f"interpreter that has {cfg.engine}; nothing was started"
    )
    try:
        res = subprocess.run(
            [py, "-c", _FIND, module], capture_output=True, timeout=120, check=False
        )
    except FileNotFoundError:
        raise FleetError(
            f"fleet up: --engine {cfg.engine}: there is no interpreter {py!r}; point --python "
            f"(or $DRAFTDATA_ENGINE_PYTHON) at the one that has {cfg.engine}; nothing was started"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FleetError(
            f"fleet up: --engine {cfg.engine}: cannot run {py!r} ({exc}); {fix}"
        ) from exc
    if res.returncode == 3:
        raise FleetError(
            f"fleet up: --engine {cfg.engine}: {cfg.engine} is not installed for {py} (it cannot "
            f"import {module}); {fix}"
        )
    if res.returncode != 0:
        detail = res.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise FleetError(
            f"fleet up: --engine {cfg.engine}: {py} fails to start"
            f"{': ' + detail[0] if detail else ''}; {fix}"
        )


def plan_fleet(cfg: LaunchConfig, gpus: Sequence[str]) -> list[ServerPlan]:
    """One plan per server: consecutive ports from ``port_base``, one GPU each (or all for dp)."""
    if cfg.dp > 1:
        if len(gpus) % cfg.dp:
            raise ConfigError(f"--dp {cfg.dp}: {len(gpus)} GPUs ({','.join(gpus)}) do not divide")
        if cfg.engine in ("sim", "command"):
            raise ConfigError(f"--dp is for --engine sglang|vllm, not {cfg.engine}")
        groups = [",".join(gpus)]
    else:
        groups = list(gpus)
    if cfg.port_base + len(groups) - 1 > 65535:
        raise ConfigError(f"--port-base {cfg.port_base}: {len(groups)} servers run past port 65535")
    plans = []
    for i, gpu in enumerate(groups):
        port = cfg.port_base + i
        argv = merge_args(base_argv(cfg, port, gpu, i), cfg.extra_args)
        env = (("CUDA_VISIBLE_DEVICES", gpu), *cfg.env)
        log = str(Path(cfg.log_dir) / f"server-{i}-port{port}.log")
        plans.append(
            ServerPlan(
                index=i,
                engine=cfg.engine,
                gpu=gpu,
                port=port,
                host=cfg.host,
                argv=tuple(argv),
                env=env,
                log=log,
            )
        )
    return plans


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def start_server(
    plan: ServerPlan, *, append_log: bool = False
) -> tuple[Started, subprocess.Popen[bytes]]:
    """Start one planned server in its own session / process group, output to its log file.

    The log is truncated unless ``append_log`` (restarts append, so a crash's evidence stays).
    FleetError when the executable cannot be started at all.
    """
    log = Path(plan.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(dict(plan.env))
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log, "ab" if append_log else "wb") as fh:
        fh.write(f"# draftdata: {shlex.join(plan.argv)}\n".encode())  # supervise.LOG_HEADER
        fh.flush()
        try:
            proc = subprocess.Popen(
                list(plan.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise FleetError(
                f"server {plan.index} (port {plan.port}): cannot start {plan.argv[0]!r}: {exc}"
            ) from exc
    started = process_start_time(proc.pid) or time.time()
    return Started(plan=plan, pid=proc.pid, pgid=proc.pid, started=started), proc
