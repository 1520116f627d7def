"""The inference-server simulator: N OpenAI-compatible SGLang- or vLLM-shaped servers.

Used by tests, benchmarks and the demo, and by users who want to dry-run a job before booking
GPUs. Real aiohttp servers on 127.0.0.1 that model continuous batching (``batch``), answer
with deterministic seeded text (``answers``), count tokens approximately or with a real
Hugging Face tokenizer (``tokens``) and inject faults (``server``). Settings:
``config.SimConfig`` / ``FaultConfig``. It does not run a model and does not launch real
servers (``fleet up`` does that).

Python API
----------
``SimFleet`` runs servers in-process on a background thread's event loop::

    with SimFleet(n=2, config=SimConfig(time_scale=0.001)) as fleet:
        fleet.urls            # ["http://127.0.0.1:40123", ...] (no /v1)
        fleet.crash(1)        # close socket + drop connections (restart_after applies)
        fleet.restart(1)      # rebind the same port now
        fleet.stats(0)        # ServerStats: requests, served, rejected, cancelled, faults, ...
        fleet.load(0)         # (running, waiting)
        fleet.spec()          # a FleetSpec (engine "sim")

``SimProcess`` runs ``draftdata fleet sim`` as a subprocess (for kill -9 tests)::

    with SimProcess(n=2, args=["--time-scale", "0.01"]) as proc:
        proc.urls, proc.pid, proc.fleet_yaml
        proc.kill()           # SIGKILL the whole simulator

``serve(...)`` is the coroutine behind the CLI.

Endpoints (both flavours unless noted)
--------------------------------------
- ``POST /v1/chat/completions`` (below). ``GET /v1/models`` -> ``{"object": "list", "data":
  [{"id": MODEL, "object": "model", "created", "owned_by": "sglang"|"vllm", "root",
  "parent": null, "max_model_len": C}]}``.
- ``GET /health``: 200 empty body; 503 while starting (``--startup-seconds``, and
  ``starting_s`` after a restart). ``GET /health_generate`` (sglang): 200 after one step.
- ``GET /server_info`` and ``/get_server_info`` (sglang): server args (``model_path``,
  ``served_model_name``, ``context_length``, ``max_running_requests`` (null with
  ``--hide-max-running``), ``dp_size``, ``tp_size``, ``reasoning_parser``, ``tool_call_parser``,
  ``enable_cache_report``, ...), ``internal_states: [{dp_rank,
  effective_max_running_requests_per_dp, last_gen_throughput, memory_usage}]`` and ``version``.
- ``GET /v1/loads`` (sglang): ``{timestamp, dp_rank_count, loads: [{dp_rank,
  num_running_reqs, num_waiting_reqs, num_used_tokens}], aggregate: {...}}``; ``GET /get_load``
  (older): ``[{dp_rank, num_reqs, num_waiting_reqs, num_tokens}]``.
- ``GET /metrics``: vllm flavour ``vllm:num_requests_running{engine="0",model_name="M"}``,
  ``vllm:num_requests_waiting``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:request_success_total{finished_reason}``; sglang flavour (as with --enable-metrics)
  ``sglang:num_running_reqs{model_name="M"}``, ``sglang:num_queue_reqs``,
  ``sglang:gen_throughput``, ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``.
- vllm only, with ``--hidden-states DIR``: ``POST /v1/completions`` with a prompt of token ids,
  vLLM's hidden-state extraction protocol (``sim/hidden.py``: the answer's
  ``kv_transfer_params.hidden_states_path``, the file and its lock).
- vllm only: ``GET /version`` -> ``{"version": "0.11.0"}``. Endpoints the real engine lacks
  (/server_info on vLLM, ...) are 404.

Chat completions
----------------
Request fields read: ``messages`` (required), ``model`` (vLLM: anything but the served name or
null is 404 ``The model `X` does not exist.``), ``n``, ``max_completion_tokens`` /
``max_tokens`` (the former wins; counts reasoning and the EOS token), ``stream``,
``stream_options.include_usage``, ``tools``, ``tool_choice`` (none/auto/required/named),
``chat_template_kwargs`` (``enable_thinking: false`` -> no reasoning), ``seed``,
``separate_reasoning`` (sglang; false -> ``<think>`` inline in content), ``include_reasoning``
(vllm; false -> reasoning dropped), ``return_token_ids``, ``return_prompt_token_ids`` (sglang),
``rid`` (sglang: becomes the id).

Non-streaming SGLang body::

    {"id": "<hex or rid>", "object": "chat.completion", "created": 1700000000,
     "model": "<request model or 'default'>",
     "choices": [{"index": 0,
                  "message": {"role": "assistant", "content": "...",   # never null ("" if none)
                              "reasoning_content": "\\n...\\n" | null,
                              "tool_calls": null | [{"id": "call_<24 hex>", "index": 0,
                                  "type": "function",
                                  "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]},
                  "logprobs": null, "finish_reason": "stop"|"length"|"tool_calls",
                  "matched_stop": 151645 | null,
                  "prompt_token_ids": [...],   # only with return_prompt_token_ids
                  "response_token_ids": [...]}],  # only with return_token_ids
     "usage": {"prompt_tokens": P, "total_tokens": P+C, "completion_tokens": C,
               "prompt_tokens_details": {"cached_tokens": K} | null, "reasoning_tokens": R},
     "metadata": {"weight_version": "default"}}

Non-streaming vLLM body::

    {"id": "chatcmpl-<hex>", "object": "chat.completion", "created": ..., "model": MODEL,
     "choices": [{"index": 0,
                  "message": {"role": "assistant", "content": "..." | null, "refusal": null,
                              "annotations": null, "audio": null, "function_call": null,
                              "tool_calls": [{"id": "chatcmpl-tool-<hex>", "type": "function",
                                  "function": {"name": "f", "arguments": "{...}"}}],  # or absent
                              "reasoning": "\\n...\\n" | null},
                  "logprobs": null, "finish_reason": ..., "stop_reason": null,
                  "token_ids": [...] | null}],              # output ids with return_token_ids
     "service_tier": null, "system_fingerprint": null,
     "usage": {"prompt_tokens", "total_tokens", "completion_tokens",
               "prompt_tokens_details": {"cached_tokens": K} | null},
     "prompt_logprobs": null, "prompt_token_ids": [...] | null, "kv_transfer_params": null}

Reasoning split (both engines' qwen3 parsers, not stripped): the generated text is
``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` so ``reasoning`` is ``"\\n{r}\\n"`` and
content starts with ``"\\n\\n"``; cut by max tokens before ``</think>``: all reasoning, content
``""`` (sglang) / null (vllm). Tool calls: ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>``
blocks after the content; SGLang strips the content before the first call, vLLM keeps it
(null if empty). ``--reasoning inline`` (or ``separate_reasoning: false``): no reasoning field,
the raw text in content. ``--reasoning off``: a model that never thinks (``enable_thinking``
defaults to false); ``--default-thinking I:on|off`` sets that default for server I alone (a
server launched with other default chat-template kwargs). Empty reasoning is null on SGLang.

Token ids: output ids are the tokenization of exactly the generated text, plus the EOS id
(``<|im_end|>``, 151645 without a tokenizer) when the answer stopped (finish stop/tool_calls);
``completion_tokens == len(output ids)``. A request's ``stop`` strings cut the answer as vLLM
does: the text ends before the first one, the ids keep the token that completes it, and no EOS
follows (finish ``stop``). With ``--tokenizer DIR`` prompt ids are the chat
template's rendering (messages + tools + add_generation_prompt + chat_template_kwargs) and the
generated text is what the template renders for that assistant turn after the prompt, so
``prompt_ids + output_ids`` tokenizes the rendered conversation. Without one, ids are synthetic
(one per word/newline/marker; markers carry Qwen3's ids).

Streaming (``data: {...}\\n\\n`` lines, then ``data: [DONE]``): per choice a first chunk with
delta ``{"role": "assistant", "content": ""}`` (vLLM: with top-level ``prompt_token_ids`` on
the very first chunk when asked), then one chunk per kind of text per ``stream_interval``
tokens: delta ``{"reasoning_content"|"reasoning": "..."}`` or ``{"content": "..."}`` (SGLang
lists every delta field with nulls, vLLM only the set ones), tool calls as two deltas
(``{index, id, type, function: {name, arguments: ""}}`` then ``{index, function: {arguments}}``),
then a chunk with an empty delta and ``finish_reason`` (+ ``matched_stop`` on SGLang). vLLM adds
``token_ids`` (the delta's ids) to choices when asked; concatenated they equal the output ids.
With ``include_usage`` a last chunk has ``choices: []`` and ``usage``.

Errors: SGLang ``{"object": "error", "message", "type": "BadRequestError", "param": null,
"code": 400}``; vLLM ``{"error": {"message", "type", "param": null, "code"}}``. Context:
SGLang refuses prompt >= C with ``The input (N tokens) is longer than the model's context
length (C tokens).`` and prompt + max_new >= C with ``Requested token count exceeds the model's
maximum context length of C tokens. You requested a total of T tokens: N tokens from the input
messages and M tokens for the completion. ...``; vLLM refuses prompt >= C with ``This model's
maximum context length is C tokens. However, your request has N input tokens. ...`` and
prompt + max_tokens > C with ``'max_tokens' or 'max_completion_tokens' is too large: M. This
model's maximum context length is C tokens and your request has N input tokens (M > C - N).``

Faults (per chat request, seeded; ``--fault-server I`` limits them to one server): 500 and 503
(the flavour's error body), 429 with ``Retry-After``, an injected 400 context-length error,
``reset`` (headers and part of a body, then the connection is aborted: the client sees a
payload/disconnect error), ``hang`` (no answer until the client gives up), ``malformed`` (200
with the body cut in half; streaming: a truncated first data line), ``--slow I:F`` (step time
x F), ``--crash-after I:N`` (the N-th request crashes server I once; every in-flight
connection is dropped; SIGUSR1 to the process crashes it at once instead, for a crash at a
chosen time) with ``--restart-after S`` (same port; 503 "starting" for ``starting_s``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from draftdata.errors import FleetError
from draftdata.shared.fleetspec import (
    EndpointSpec,
    FleetSpec,
    HiddenStatesSpec,
    process_start_time,
    read_fleet,
    write_fleet,
)
from draftdata.sim.config import FaultConfig, SimConfig, validate
from draftdata.sim.server import ServerStats, SimServer
from draftdata.sim.tokens import load_tokenizer

__all__ = ["FaultConfig", "ServerStats", "SimConfig", "SimFleet", "SimProcess", "serve"]

T = TypeVar("T")


async def start_servers(n: int, config: SimConfig, port_base: int = 0) -> list[SimServer]:
    """Create and start ``n`` servers (port ``port_base + i``, or ephemeral when 0)."""
    validate(config, n)
    tokenizer = load_tokenizer(config.tokenizer)
    servers = [SimServer(i, config, tokenizer, port_base + i if port_base else 0) for i in range(n)]
    try:
        for s in servers:
            await s.start()
    except OSError as exc:
        for s in servers:
            await s.stop()
        raise FleetError(
            f"fleet sim: cannot bind a port ({exc}); pick another --port-base"
        ) from exc
    return servers


def fleet_spec(servers: list[SimServer], config: SimConfig) -> FleetSpec:
    """The fleet.yaml contents for running servers (engine "sim", this process's pid)."""

    pid = os.getpid()
    # the kernel's start time, which `fleet status/down` compare to tell a reused pid
    started = process_start_time(pid) or time.time()
    hidden = None
    if config.hidden_states is not None:
        hidden = HiddenStatesSpec(path=config.hidden_states, layers=list(config.hidden_layers))
    return FleetSpec(
        engine="sim",
        model=config.model,
        hidden_states=hidden,
        endpoints=[
            EndpointSpec(
                url=s.url,
                pid=pid,
                started=started,
                model=config.model,
                engine=config.flavor,
                engine_version=config.version,
                context_length=config.context_length,
                max_running_requests=config.max_running,
            )
            for s in servers
        ],
    )


async def serve(
    n: int,
    config: SimConfig,
    port_base: int = 0,
    out: Path | None = None,
    on_ready: Callable[[list[SimServer]], None] | None = None,
) -> None:
    """Run ``n`` servers until SIGINT/SIGTERM; write ``out`` (fleet.yaml) once all listen."""
    servers = await start_servers(n, config, port_base)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if hasattr(signal, "SIGUSR1"):  # a --crash-after server crashes now (a crash at a time)

        def crash_now() -> None:
            for s in servers:
                s.crash_pending_now()

        loop.add_signal_handler(signal.SIGUSR1, crash_now)
    try:
        if out is not None:
            write_fleet(fleet_spec(servers, config), out)
        if on_ready is not None:
            on_ready(servers)
        await stop.wait()
    finally:
        for s in servers:
            await s.stop()


class SimFleet:
    """Servers on a background thread's event loop; a context manager for tests."""

    def __init__(self, n: int = 1, config: SimConfig | None = None, port_base: int = 0) -> None:
        self.n = n
        self.config = config or SimConfig()
        self.port_base = port_base
        self.servers: list[SimServer] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SimFleet:
        validate(self.config, self.n)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sim-fleet", daemon=True
        )
        self._thread.start()
        try:
            self.servers = self._call(start_servers(self.n, self.config, self.port_base))
        except BaseException:
            self._shutdown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self.servers:
            self._call(self._stop_all())
        self._shutdown()

    async def _stop_all(self) -> None:
        for s in self.servers:
            await s.stop()

    def _shutdown(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._loop is not None:
            self._loop.close()
        self._loop = None
        self._thread = None

    def _call(self, coro: Any, timeout: float = 60.0) -> Any:
        if self._loop is None:
            raise FleetError("SimFleet is not running (use it as a context manager)")
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    def _sync(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        result: T = self._call(run())
        return result

    @property
    def urls(self) -> list[str]:
        """Base URLs of the servers (``http://127.0.0.1:PORT``)."""
        return [s.url for s in self.servers]

    def crash(self, i: int) -> None:
        """Crash server ``i`` now (its ``restart_after`` applies)."""
        self._sync(self.servers[i].crash)

    def wedge(self, i: int, wedged: bool = True) -> None:
        """Server ``i`` stops answering without dying (its /health still passes), or goes
        on again (``wedged=False``)."""
        self._sync(lambda: self.servers[i].wedge(wedged))

    def restart(self, i: int) -> None:
        """Bring crashed server ``i`` back on its port now."""
        self._call(self.servers[i].restart())

    def set_default_thinking(self, i: int, thinking: bool | None) -> None:
        """Server ``i``'s template defaults to ``enable_thinking=thinking`` from its next request
        on (None: back to ``config.reasoning``), as a server restarted with other default
        chat-template kwargs would."""

        def change() -> None:
            self.servers[i].default_thinking = thinking

        self._sync(change)

    def stats(self, i: int) -> ServerStats:
        """A copy of server ``i``'s counters."""
        s = self.servers[i]
        return self._sync(lambda: msgspec.convert(msgspec.to_builtins(s.stats), ServerStats))

    def load(self, i: int) -> tuple[int, int]:
        """(running, waiting) sequences on server ``i``."""
        return self._sync(self.servers[i].load)

    def spec(self) -> FleetSpec:
        """A FleetSpec for these servers."""
        return fleet_spec(self.servers, self.config)

    def write(self, path: Path | str) -> Path:
        """Write fleet.yaml for these servers to ``path``."""
        write_fleet(self.spec(), path)
        return Path(path)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class SimProcess:
    """``draftdata fleet sim`` in a subprocess; waits until every server answers /health."""

    def __init__(
        self,
        n: int = 1,
        args: list[str] | None = None,
        workdir: Path | str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.n = n
        self.args = list(args or [])
        self.timeout = timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="draftdata-sim-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.fleet_yaml = self.workdir / "fleet.yaml"
        self.log = self.workdir / "sim.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.urls: list[str] = []

    @property
    def pid(self) -> int:
        """The simulator's process id."""
        if self.proc is None:
            raise FleetError("SimProcess is not started")
        return self.proc.pid

    def start(self) -> SimProcess:
        """Start the subprocess and wait until fleet.yaml exists and every /health is 200."""
        self.fleet_yaml.unlink(missing_ok=True)
        self.urls = []
        cmd = [
            sys.executable,
            "-c",
            "from draftdata.cli import main; main()",
            "fleet",
            "sim",
            "--servers",
            str(self.n),
            "--out",
            str(self.fleet_yaml),
            *self.args,
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log.read_text(errors="replace")[-2000:]
                raise FleetError(f"fleet sim exited with {self.proc.returncode}: {text}")
            if not self.urls and self.fleet_yaml.exists():  # written once, when all listen
                self.urls = [e.url for e in read_fleet(self.fleet_yaml).endpoints]
            if self.urls and all(_healthy(u) for u in self.urls):
                return self
            time.sleep(0.05)
        self.stop()
        raise FleetError(f"fleet sim did not become ready within {self.timeout:.0f} s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL) and reap the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
