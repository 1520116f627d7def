"""The serving engine: hidden states from a vLLM fleet launched to extract them.

``--engine vllm --fleet fleet.yaml`` reads the fleet that ``fleet up --engine vllm
--hidden-states DIR`` started (fleet.yaml's ``hidden_states``: the folder every server writes
to and the layers it captures; the simulator's ``fleet up --engine sim --hidden-states`` speaks
the same protocol). For every sample it sends one prefill-only request, ``/v1/completions``
with the sample's token ids as the prompt and ``max_tokens: 1``, and reads the file the
server's hidden-states connector names in ``kv_transfer_params.hidden_states_path``
(``staged.py``: under the connector's lock, its ``token_ids`` checked against the sample's,
removed once read).

The requests run through generate's dispatcher (``generate/engine/dispatch.py``) over generate's
endpoints: one queue over the fleet, each endpoint's concurrency controller and circuit
breaker, retries with backoff elsewhere (``max_attempts``), a refusing or impossible-answering
endpoint taken out and its work moved on uncharged, a dead one found by its health check and
revived when it answers again (``generate/engine/keeper.py``). Only the attempt differs: the
``PrefillCaller`` below sends one prefill request instead of a chat conversation, and a file
the server failed to write is a ``MalformedAnswerError`` (retried elsewhere), a file of other
tokens an ``ImpossibleAnswerError`` (the endpoint is taken out). When no
endpoint can serve for ``unavailable_timeout`` seconds (or every one refuses), ``states`` raises
FleetUnavailableError; a sample that fails for good (its ``max_attempts`` spent, or too long
for the servers' context) raises FleetError naming it. Either way nothing of the batch was
committed, and the same command resumes.

**Layers.** The file holds the fleet's layers in the fleet's order (vLLM's index space: id
``i`` < N is Hugging Face's ``hidden_states[i]``; N is the last layer *before* the final norm).
The backend takes the capture's aux ids and N from it; a capture the fleet does not hold is a
ConfigError naming both. For a writer that stores the last layer after the final norm
(SpecForge), the target's final RMSNorm is applied here, with its weight read from the model
folder's safetensors (``FinalNorm``: Hugging Face's arithmetic, float32 then the weight in the
model's dtype); a model whose final norm is not a plain RMSNorm is refused in one line.

**Batches.** ``states(batch)`` sends every sample of the batch at once and returns when all
are read: ``--batch-tokens`` is what the fleet holds in flight, so size it to the fleet
(servers × concurrency × a sample's tokens). It runs its dispatcher on an event loop of its
own in a background thread (``states`` is called from the stage's worker thread).

Options (``HiddenConfig.options``, from the CLI): ``fleet`` (required), ``concurrency``
(``auto`` or a number per endpoint), ``api_key_env``, ``max_attempts``, ``read_timeout``,
``unavailable_timeout``, ``lock_timeout`` (how long a file may stay locked after its answer).
Needs ``draftdata[hidden]`` (torch, safetensors).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import numpy as np

from draftdata.errors import (
    ConfigError,
    EndpointRefusedError,
    FleetError,
    FleetUnavailableError,
    ImpossibleAnswerError,
    MalformedAnswerError,
)
from draftdata.generate.config import GenerateConfig, Sampling
from draftdata.generate.engine.caller import Answer
from draftdata.generate.engine.client import EndpointClient
from draftdata.generate.engine.dispatch import Dispatcher
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.keeper import EndpointKeeper
from draftdata.generate.engine.request import Request
from draftdata.generate.engine.work import Copy
from draftdata.generate.stage import make_endpoints
from draftdata.hidden.backend import (
    BackendSpec,
    Engine,
    ModelFacts,
    TokenIds,
    read_model_facts,
    register,
)
from draftdata.hidden.layers import Capture
from draftdata.hidden.staged import read_staged, remove_staged, sweep
from draftdata.records import Completion, Failure, Prompt, Turn, Usage
from draftdata.shared.endpoints import api_key_from_env, probe_capacity
from draftdata.shared.fleetspec import FleetSpec, read_fleet
from draftdata.support.redact import redact_url
from draftdata.support.tables import human_bytes

if TYPE_CHECKING:
    import torch

Log = Callable[[str], None]
SWEEP_AGE_S = 3600.0  # staged files older than this whose lock nobody holds are removed
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
STRAGGLER_WAIT_S = 30.0  # at close, how long cancelled attempts may take to remove their files


def _log(line: str) -> None:
    import sys

    print(time.strftime("%H:%M:%S ") + line, file=sys.stderr, flush=True)


# -- the layers ---------------------------------------------------------------------------------


def fleet_slots(capture: Capture, num_layers: int, fleet_layers: Sequence[int]) -> list[int]:
    """Where each captured layer sits in the fleet's files: the aux ids, then N (the last
    layer before the final norm). ConfigError when the fleet does not capture one of them."""
    want = [*capture.aux, num_layers]
    missing = [i for i in want if i not in fleet_layers]
    if missing:
        raise ConfigError(
            f"--engine vllm: the fleet captures layers {list(fleet_layers)}, this set needs "
            f"{want} (aux {list(capture.aux)} and the last, {num_layers}); relaunch it with "
            f"`fleet up --engine vllm --hidden-states DIR --hidden-layers "
            f"{','.join(str(i) for i in capture.aux)}`"
        )
    return [list(fleet_layers).index(i) for i in want]


class FinalNorm:
    """The target's final RMSNorm, applied to the last layer's pre-norm states (module
    docstring): ``weight * (x * rsqrt(mean(x²) + eps))`` computed in float32, cast back to the
    states' dtype before the weight, as Hugging Face's Llama/Qwen/Mistral norms do."""

    # model types whose final norm is not ``weight * normed`` (Gemma's is ``(1 + weight)``)
    OTHER_NORMS = ("gemma", "gemma2", "gemma3", "gemma3_text", "olmo", "cohere", "phi")

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    @classmethod
    def load(cls, model: str) -> FinalNorm:
        """The final norm of the model folder ``model`` (its config.json and weights)."""
        folder = Path(model)
        try:
            cfg = json.loads((folder / "config.json").read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--model {model}: cannot read config.json ({exc})") from exc
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        eps = text.get("rms_norm_eps")
        kind = str(cfg.get("model_type", ""))
        if not isinstance(eps, int | float) or kind in cls.OTHER_NORMS:
            raise ConfigError(
                f"--model {model}: --engine vllm gives the last layer before the final norm, "
                f"and this format stores it after; the final norm of a {kind or 'this'} model "
                "is not a plain RMSNorm draftdata applies: use --engine transformers"
            )
        return cls(_norm_weight(folder), float(eps))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * h.to(x.dtype)


def _norm_weight(folder: Path) -> torch.Tensor:
    """The final norm's weight (``model.norm.weight``, or a wrapper's
    ``model.language_model.norm.weight``) from the folder's safetensors files."""
    from safetensors import safe_open

    names = ("model.norm.weight", "model.language_model.norm.weight", "norm.weight")
    index = folder / "model.safetensors.index.json"
    files: list[Path]
    if index.is_file():
        weight_map = json.loads(index.read_text("utf-8")).get("weight_map", {})
        files = [folder / weight_map[n] for n in names if n in weight_map]
    else:
        files = sorted(folder.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for n in names:
                if n in fh.keys():  # noqa: SIM118 (safe_open is no mapping)
                    weight: torch.Tensor = fh.get_tensor(n)
                    return weight
    raise ConfigError(
        f"--model {folder}: no final norm weight ({' / '.join(names)}) in its safetensors files"
    )


# -- one attempt --------------------------------------------------------------------------------


class PrefillCaller:
    """One attempt of a sample: a prefill-only request, then the file it names, read, checked
    and removed (``staged.py``). What it read is kept in ``results`` by the sample's key."""

    def __init__(
        self,
        ids: dict[str, TokenIds],
        clients: dict[str, EndpointClient],
        *,
        model: str,
        lock_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ids = ids
        self.clients = clients
        self.model = model
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.results: dict[str, torch.Tensor] = {}
        self.stragglers: set[asyncio.Future[tuple[torch.Tensor, str]]] = set()
        self.requests_ok = 0
        self.clamped = 0  # never: a prefill asks one token

    async def call(self, copy: Copy) -> Answer:
        """Send the request and read its file; the ``ServerError`` leaf on failure.

        The request, the read and the removal run as a task of their own that a cancelled
        attempt (its endpoint taken out, the batch stopped) does not cancel: it still waits
        for the server's file and removes it, so no staged file outlives its request
        (``stragglers`` holds those still running)."""
        key = copy.job.prompt.id
        ep = copy.endpoint
        sent = copy.sent = self.clock()
        fetch = asyncio.ensure_future(self._fetch(ep, key))
        self.stragglers.add(fetch)
        fetch.add_done_callback(self.stragglers.discard)
        fetch.add_done_callback(_retrieved)  # a straggler's failure is nobody's to raise
        states, model = await asyncio.shield(fetch)
        ids = self.ids[key]
        self.results[key] = states
        self.requests_ok += 1
        ep.record_success(1, len(ids), latency=self.clock() - sent, seqs=1)
        usage = Usage(prompt_tokens=len(ids), completion_tokens=1)
        return Answer([[Turn(finish_reason="length", usage=usage)]], {"model": model})

    async def _fetch(self, ep: Endpoint, key: str) -> tuple[torch.Tensor, str]:
        ids = self.ids[key]
        request = prefill_request(ep.model or self.model, ids.tolist())
        answer = await self.clients[ep.url].send_json(request)
        params = answer.get("kv_transfer_params")
        path = params.get("hidden_states_path") if isinstance(params, dict) else None
        if not isinstance(path, str) or not path:
            raise EndpointRefusedError(
                "answers without kv_transfer_params.hidden_states_path: it does not extract "
                "hidden states (launch it with `fleet up --hidden-states DIR`)"
            )
        try:
            states = await asyncio.to_thread(read_staged, path, ids, self.lock_timeout)
        except (MalformedAnswerError, ImpossibleAnswerError) as exc:
            raise type(exc)(ep.redact(str(exc))) from exc
        finally:
            await asyncio.to_thread(remove_staged, path)
        return states, request.model


def prefill_request(model: str, ids: list[int]) -> Request:
    """The prefill-only request of one sample: its token ids as the prompt of a
    ``/v1/completions`` call for one greedy token (the server's connector writes the hidden
    states of the prompt)."""
    return Request(
        call="completion",
        model=model,
        prompt=ids,
        max_tokens=1,
        sampling=Sampling(temperature=0.0),
    )


def _retrieved(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


# -- the batch's jobs through the dispatcher ---------------------------------------------------


class _BatchReader:
    """The dispatcher's reader over one batch: a prompt per sample, keyed by its position."""

    def __init__(self, keys: list[str]) -> None:
        self._left = [Prompt(id=k, messages=[]) for k in keys]
        self.exhausted = not self._left
        self.invalid = 0

    def take_sized(self, k: int, max_bytes: int | None = None) -> list[tuple[Prompt, int]]:
        out, self._left = self._left[:k], self._left[k:]
        self.exhausted = not self._left
        return [(p, 0) for p in out]  # no text: the token ids are the caller's


class _Sink:
    """Settled samples: answered ones are in the caller's results; failures are kept."""

    def __init__(self) -> None:
        self.failures: list[Failure] = []

    def completion(self, c: Completion) -> None:
        pass  # the states are in PrefillCaller.results, keyed as this record's id

    def failure(self, f: Failure) -> None:
        self.failures.append(f)


class VllmBackend:
    """A hidden-states fleet as one backend (see the module docstring)."""

    def __init__(self, spec: BackendSpec, *, log: Log = _log) -> None:
        opts = dict(spec.options)
        fleet_path = opts.get("fleet")
        if not fleet_path:
            raise ConfigError(
                "--engine vllm needs --fleet FLEET.yaml: a fleet started with `draftdata fleet "
                "up --engine vllm --hidden-states DIR`"
            )
        self.fleet: FleetSpec = read_fleet(str(fleet_path))
        hs = self.fleet.hidden_states
        if hs is None:
            raise ConfigError(
                f"--fleet {fleet_path}: the fleet does not extract hidden states (no "
                "hidden_states in it); start one with `draftdata fleet up --engine vllm "
                "--hidden-states DIR`"
            )
        if not Path(hs.path).is_dir():
            raise ConfigError(
                f"--fleet {fleet_path}: its hidden-states folder {hs.path} is not visible here; "
                "run hidden-states where the servers' folder is (the same host or a shared "
                "file system)"
            )
        self.staging = hs.path
        self.spec = spec
        self.log = log
        model_facts = read_model_facts(spec.model)
        self.slots = fleet_slots(spec.capture, model_facts.num_layers, hs.layers)
        self.norm = FinalNorm.load(spec.model) if spec.capture.last == "post_norm" else None
        self.config = GenerateConfig(
            prompts="-",
            out="-",
            model=None,
            order="file",
            hedge=False,
            tail_plan=False,
            prefix_steering=False,
            token_ids="off",
            concurrency=_concurrency(opts.get("concurrency", "auto")),
            max_attempts=int(opts.get("max_attempts", 6)),
            read_timeout=float(opts.get("read_timeout", 600.0)),
            unavailable_timeout=float(opts.get("unavailable_timeout", 300.0)),
            api_key_env=opts.get("api_key_env"),
            progress="off",
        )
        self.lock_timeout = float(opts.get("lock_timeout", 300.0))
        self._facts = model_facts
        removed = sweep(self.staging, SWEEP_AGE_S)
        if removed:
            log(f"hidden-states: removed {removed} stale files from {self.staging}")
        # the event loop the dispatcher runs on, in a thread of its own
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self._call(self._open())
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    async def _open(self) -> None:
        cfg = self.config
        self.api_key = api_key_from_env(cfg.api_key_env) if cfg.api_key_env else None
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self.session = aiohttp.ClientSession(headers=headers)
        urls = [e.url for e in self.fleet.endpoints]
        timeout = min(10.0, cfg.connect_timeout)
        caps = list(
            await asyncio.gather(*(probe_capacity(self.session, u, timeout=timeout) for u in urls))
        )
        if all(c is None for c in caps):
            shown = ", ".join(redact_url(u) for u in urls[:4])
            raise FleetError(
                f"hidden-states --engine vllm: no endpoint of the fleet answers ({shown}); "
                "start it (draftdata fleet up) or check --fleet"
            )
        self.served = next((c.model for c in caps if c is not None and c.model), None)
        self.endpoints: list[Endpoint] = make_endpoints(
            cfg,
            urls,
            caps,
            [e.max_running_requests for e in self.fleet.endpoints],
            self.api_key,
            self.log,
            [e.context_length for e in self.fleet.endpoints],
        )
        self.clients: dict[str, EndpointClient] = {}
        for ep in self.endpoints:
            assert isinstance(ep.client, EndpointClient)
            self.clients[ep.url] = ep.client
        self.keeper = EndpointKeeper(cfg, self.endpoints, self.session, log=self.log)
        self._stragglers: set[asyncio.Future[Any]] = set()

    @property
    def facts(self) -> ModelFacts:
        """The target's facts (its config.json; the servers serve it)."""
        return self._facts

    def staged_bytes(self, tokens: int) -> int:
        """The bytes ``tokens`` tokens in flight put in the fleet's folder: per token, every
        layer the fleet captures in the model's dtype (the connector writes the dtype the
        server computes in) and its int64 token id."""
        per_value = DTYPE_BYTES.get(self._facts.dtype, 4)
        hs = self.fleet.hidden_states
        assert hs is not None
        return tokens * (len(hs.layers) * self._facts.hidden_size * per_value + 8)

    def check_room(self, tokens: int, longest: int = 0) -> None:
        """Refuse, in one line, a batch whose files cannot fit in the fleet's folder (a
        ``/dev/shm`` too small for ``--batch-tokens``): the servers would fail every write
        that does not fit and the run would retry them for ever. ``longest`` is the batch's
        longest sample: one that cannot fit alone is a batch of its own whatever
        ``--batch-tokens`` says, so the line then names what does help."""
        need = self.staged_bytes(tokens)
        free = shutil.disk_usage(self.staging).free
        if need <= free:
            return
        fits = free // max(1, self.staged_bytes(1))
        if longest > fits:
            cut = f", or cut samples with --max-length {fits:,}" if fits else ""
            raise ConfigError(
                f"hidden-states: a sample of {longest:,} tokens alone puts "
                f"{human_bytes(self.staged_bytes(longest))} of hidden states in the fleet's "
                f"folder {self.staging}, which has {human_bytes(free)} free (a sample longer "
                "than --batch-tokens is a batch of its own, so a smaller --batch-tokens does not "
                f"help); give the servers' --hidden-states folder more room{cut}"
            )
        raise ConfigError(
            f"--batch-tokens: a batch of {tokens:,} tokens puts {human_bytes(need)} of hidden "
            f"states in the fleet's folder {self.staging}, which has {human_bytes(free)} free; "
            f"use --batch-tokens {fits:,} or less, or give the servers' --hidden-states folder "
            "more room"
        )

    def states(self, batch: Sequence[TokenIds]) -> list[torch.Tensor]:
        """Each sample's states ``[T, count, hidden]``, in the batch's order."""
        if not batch:
            return []
        self.check_room(sum(len(b) for b in batch), max(len(b) for b in batch))
        got: list[torch.Tensor] = self._call(self._run(list(batch)))
        return got

    async def _run(self, batch: list[TokenIds]) -> list[torch.Tensor]:
        keys = [str(i) for i in range(len(batch))]
        ids = {k: np.asarray(a, dtype=np.int64) for k, a in zip(keys, batch, strict=True)}
        caller = PrefillCaller(
            ids, self.clients, model=self.served or self.spec.model, lock_timeout=self.lock_timeout
        )
        sink = _Sink()
        dispatcher = Dispatcher(
            self.config,
            self.endpoints,
            _BatchReader(keys),
            sink,
            model=self.served or self.spec.model,
            is_done=lambda _pid, _sample: False,
            check_alive=self.keeper.check_alive,
            revive=self.keeper.revive,
            log=self.log,
            caller=caller,
        )
        self.keeper.attach(dispatcher)
        for e in self.endpoints:
            if e.breaker.state != "up":
                dispatcher.spawn(self.keeper.revive(e))
        fatal: list[BaseException] = []
        watch = asyncio.ensure_future(self._watch(dispatcher, fatal))
        try:
            await dispatcher.run()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            dispatcher.abort()
            await asyncio.gather(*dispatcher.tasks, return_exceptions=True)
        self._stragglers |= caller.stragglers  # cancelled attempts still cleaning up
        if fatal:
            raise fatal[0]
        if sink.failures:
            f = sink.failures[0]
            raise FleetError(
                f"hidden-states --engine vllm: a sample of {len(batch[int(f.id)]):,} tokens "
                f"failed ({f.reason}: {f.message}) on {f.endpoint}"
                + (
                    "; the servers' context is shorter: pass --max-length"
                    if f.reason == "context_length"
                    else ""
                )
                + "; nothing of its batch was committed, the same command resumes"
            )
        out = []
        for k in keys:
            states = caller.results[k][:, self.slots]
            if self.norm is not None:
                states = states.clone()
                states[:, -1] = self.norm(states[:, -1])
            out.append(states)
        return out

    async def _watch(self, d: Dispatcher, fatal: list[BaseException]) -> None:
        """Stop the batch when no endpoint can serve for ``unavailable_timeout`` s, or at
        once when every endpoint refuses and none has answered (as generate's watch does)."""
        since: float | None = None
        while True:
            await asyncio.sleep(0.25)
            if any(e.breaker.serving for e in self.endpoints):
                since = None
                continue
            now = time.monotonic()
            refusing = all(e.breaker.refusal is not None for e in self.endpoints)
            if refusing and not any(e.meter.served for e in self.endpoints):
                each = ", ".join(f"{e.url} ({e.breaker.refusal})" for e in self.endpoints)
                fatal.append(
                    FleetUnavailableError(
                        f"hidden-states --engine vllm: every endpoint refuses: {each}; fix the "
                        "fleet, then run the same command"
                    )
                )
                d.abort()
                return
            since = now if since is None else since
            if now - since >= self.config.unavailable_timeout:
                why = "; ".join(
                    f"{e.url}: {e.breaker.fault or e.breaker.state}" for e in self.endpoints
                )
                fatal.append(
                    FleetUnavailableError(
                        f"hidden-states --engine vllm: no endpoint could serve for "
                        f"{now - since:.0f} s ({why}); stopped. Committed files are kept: fix "
                        "the fleet and run the same command to resume"
                    )
                )
                d.abort()
                return

    def close(self) -> None:
        """Close the connections and stop the loop (the fleet keeps running)."""
        if self._loop.is_closed():
            return

        async def shut() -> None:
            pending = [f for f in getattr(self, "_stragglers", ()) if not f.done()]
            if pending:  # attempts cancelled mid-request: let them remove their files
                await asyncio.wait(pending, timeout=STRAGGLER_WAIT_S)
            for c in getattr(self, "clients", {}).values():
                await c.close()
            session = getattr(self, "session", None)
            if session is not None:
                await session.close()

        with contextlib.suppress(Exception):
            self._call(shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def _concurrency(value: Any) -> int | Literal["auto"]:
    if value in (None, "auto"):
        return "auto"
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--concurrency {value!r}: auto or a number >= 1") from None
    if n < 1:
        raise ConfigError(f"--concurrency {n}: auto or a number >= 1")
    return n


def devices(gpus: str) -> list[str]:
    """The fleet is one device: one worker drives every server through one dispatcher
    (``--gpus`` is the fleet's business: ``fleet up --gpus``)."""
    del gpus
    return ["fleet"]


register(Engine(name="vllm", open=VllmBackend, devices=devices))
