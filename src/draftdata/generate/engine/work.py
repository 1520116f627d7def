"""Units of work: a ``Job`` is one prompt's request chain for one or more samples.

``plan`` turns a Prompt into Jobs. A single-turn prompt with ``n`` samples is one Job whose
request asks the server for ``n`` choices (split into one Job per sample on a server that
answers fewer); a multi-turn prompt (several requests, see ``conversation.TurnPlan``) is one
Job per sample, since each sample's later turns are conditioned on its own earlier answers.
Samples the run already settled are left out. A Job keeps a checkpoint of the turns done so far
(multi-turn), so a retry continues where the last attempt stopped.

Seeds: with a sampling ``seed`` S, a request for samples ``[k, ...]`` sends ``seed`` S + k, so
the samples of one prompt differ even when each is its own request (multi-turn jobs, servers
that ignore ``n``); a request for all ``n`` samples at once sends S.

``Copy`` is one attempt of a Job running on one endpoint: the first attempt, a retry, or a
hedge (a second copy of a tail request on an idle endpoint; the first to answer wins).
This module holds data and the per-prompt planning only; ``dispatch.py`` runs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgspec

from draftdata.errors import ServerError
from draftdata.generate.config import GenerateConfig, Reasoning, Sampling
from draftdata.generate.engine.endpoint import Endpoint
from draftdata.generate.engine.limits import FALLBACK_MAX_TOKENS
from draftdata.records import Completion, Failure, Prompt, Turn, Usage
from draftdata.shared.conversation import TurnPlan


class Job:
    """One prompt (some of its samples) on its way through the fleet."""

    __slots__ = (
        "attempts",
        "avoid",
        "copies",
        "cost",
        "done",
        "expected",
        "expected_se",
        "hedged",
        "max_tokens",
        "plan",
        "prefix",
        "prompt",
        "prompt_chars",
        "ready_since",
        "reasoning",
        "refused",
        "samples",
        "sampling",
        "turns",
        "turns_thinking",
    )

    def __init__(
        self,
        prompt: Prompt,
        samples: list[int],
        turn_plan: TurnPlan,
        *,
        sampling: Sampling,
        max_tokens: int | None,
        reasoning: Reasoning,
        prefix: str | None,
        cost: int,
    ) -> None:
        self.prompt = prompt
        self.samples = samples
        self.plan = turn_plan
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.reasoning = reasoning
        self.prefix = prefix  # shared-prefix key (system prompt + tools) for cache steering
        self.cost = cost  # estimated tokens (prompt + max output), the dispatch tie-breaker
        self.turns: list[Turn] = []  # checkpoint: turns done (multi-turn, one sample)
        self.turns_thinking: bool | None = None  # the servers' mode the checkpoint was written in
        self.attempts = 0
        self.avoid: set[str] = set()  # endpoints to steer a retry away from
        # endpoint URL -> its refusal of this job (opening.py), in order
        self.refused: dict[str, ServerError] = {}
        self.copies: list[Copy] = []
        self.done = False
        self.hedged = False
        self.prompt_chars = -1  # characters of the prompt's contents (length.prompt_tokens)
        self.ready_since = 0.0
        self.expected = -1.0  # output tokens expected of a sample when first sent (-1: not yet)
        self.expected_se = 0.0  # ... and the estimate's standard error then

    @property
    def multi_turn(self) -> bool:
        """Whether the job regenerates more than one assistant turn."""
        return len(self.plan) > 1

    @property
    def request_sampling(self) -> Sampling:
        """The sampling of this job's requests: seed + first sample (module docstring)."""
        seed = self.sampling.seed
        if seed is None or not self.samples or self.samples[0] == 0:
            return self.sampling
        return msgspec.structs.replace(self.sampling, seed=seed + self.samples[0])

    def split(self) -> list[Job]:
        """One job per sample (for servers without a working ``n``); each keeps the attempts
        made so far, so a split retries the prompt rather than restarting its count."""
        jobs = [self.with_samples([s]) for s in self.samples]
        for j in jobs:
            j.attempts = self.attempts
        return jobs

    def with_samples(self, samples: list[int]) -> Job:
        """A fresh job for the same prompt and settings with other samples."""
        return Job(
            self.prompt,
            samples,
            self.plan,
            sampling=self.sampling,
            max_tokens=self.max_tokens,
            reasoning=self.reasoning,
            prefix=self.prefix,
            cost=self.cost,
        )


class Copy:
    """One running attempt of a job on one endpoint."""

    __slots__ = (
        "detached",
        "endpoint",
        "hedge",
        "job",
        "number",
        "sent",
        "seqs",
        "started",
        "task",
        "told",
    )

    def __init__(self, job: Job, endpoint: Endpoint, *, hedge: bool, seqs: int, started: float):
        self.job = job
        self.endpoint = endpoint
        self.hedge = hedge
        self.seqs = seqs
        self.started = started
        self.sent = started  # when the request running now was sent (a later turn's is later)
        self.detached = False
        self.task: asyncio.Task[None] | None = None
        self.number = -1  # its request's number on its endpoint (opening.EndpointRefusals)
        self.told = False  # its outcome told to the refusal verdicts


def prefix_key(prompt: Prompt) -> str | None:
    """A key shared by prompts with the same system prompt and tools (None if neither)."""
    system = [m.content or "" for m in prompt.messages if m.role == "system"]
    if not system and not prompt.tools:
        return None
    h = hashlib.blake2b(digest_size=8)
    h.update(msgspec.json.encode(system))
    h.update(msgspec.json.encode(prompt.tools or []))
    return h.hexdigest()


def plan(
    prompt: Prompt, config: GenerateConfig, is_done: Callable[[str, int], bool]
) -> tuple[list[Job], int]:
    """The jobs for ``prompt`` and how many of its samples were already settled."""
    samples = [s for s in range(config.n) if not is_done(prompt.id, s)]
    settled = config.n - len(samples)
    if not samples:
        return [], settled
    turn_plan = TurnPlan(prompt.messages)
    sampling, max_tokens, reasoning = config.settings_for(prompt.source, prompt.domain)
    chars = sum(len(m.content or "") for m in prompt.messages)
    job = Job(
        prompt,
        samples,
        turn_plan,
        sampling=sampling,
        max_tokens=max_tokens,
        reasoning=reasoning,
        prefix=prefix_key(prompt) if config.prefix_steering else None,
        cost=chars // 4 + (max_tokens or FALLBACK_MAX_TOKENS) * len(turn_plan),
    )
    job.prompt_chars = chars
    if job.multi_turn and len(samples) > 1:
        return job.split(), settled
    return [job], settled


def completions(
    job: Job,
    per_sample: list[list[Turn]],
    body: dict[str, Any],
    *,
    endpoint: str,
    latency: float,
    stop_reason: str | None = None,
    model: str | None = None,
    server_thinking: bool | None = None,
) -> list[Completion]:
    """The records of a job's winning answer: one per sample, with the exact request
    parameters (the last request body without messages and tools), ``model`` (the model the
    endpoint reported, else the requested name), for a conversation that stopped before its
    last request, why (``conversation.STOP_REASONS``), and the server's default thinking mode
    the answer was written in where the request left it to the server (``thinking.py``)."""
    sampling = dict(body)  # the body less messages and tools, in the body's order
    sampling.pop("messages", None)
    sampling.pop("tools", None)
    kwargs = sampling.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "enable_thinking" in kwargs:
        server_thinking = None  # the request chose the mode: the server's default is moot
    p = job.prompt
    out = []
    now = time.time()
    latency = round(latency, 4)
    for sample, turns in zip(job.samples, per_sample, strict=False):
        if len(turns) == 1:
            usage = turns[0].usage
        else:
            usage = Usage(
                prompt_tokens=sum(t.usage.prompt_tokens for t in turns),
                completion_tokens=sum(t.usage.completion_tokens for t in turns),
                cached_tokens=sum(t.usage.cached_tokens for t in turns),
            )
        out.append(
            Completion(
                id=p.id,
                sample=sample,
                source=p.source,
                domain=p.domain,
                messages=p.messages,
                tools=p.tools,
                turns=turns,
                usage=usage,
                model=model or str(sampling.get("model") or ""),
                sampling=sampling,
                endpoint=endpoint,
                latency_s=latency,
                attempts=job.attempts,
                created=now,
                stop_reason=stop_reason,
                server_thinking=server_thinking,
            )
        )
    return out


def failures(job: Job, reason: str, message: str, *, endpoint: str) -> list[Failure]:
    """The records of a job that failed with ``reason`` (one per sample)."""
    p = job.prompt
    return [
        Failure(
            id=p.id,
            sample=sample,
            reason=reason,
            message=message[:1000],
            attempts=job.attempts,
            source=p.source,
            domain=p.domain,
            endpoint=endpoint,
            created=time.time(),
        )
        for sample in job.samples
    ]
