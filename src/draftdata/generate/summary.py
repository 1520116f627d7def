"""What a generate run did: one ``Tally`` fed by the engine, frozen into a ``GenerateSummary``.

The engine calls ``Tally.completion`` / ``Tally.failure`` for every record it hands the store;
counts are by outcome, finish reason (per completion: ``length`` when a turn was cut, else its
last turn's), failure reason, stop reason (a conversation that stopped before its last request,
``conversation.STOP_REASONS``), domain and endpoint, with token sums. The summary adds wall time
and each endpoint's share of the output tokens this command committed (the shares sum to 100%;
0% for all when it committed nothing), and renders as a dict (``to_dict``/``summary``: the Ray
driver and the metrics snapshot use it) or as the lines the CLI prints (``lines``).

``run`` holds the whole run's figures (``stats.runfigures``: every segment, committed work only,
wasted work apart) when the stage could count them; ``lines`` then leads with those, and this
command's own counts follow as such.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from draftdata.records import Completion, Failure
from draftdata.shared.tokens import ESTIMATE_ERROR, completion_tokens
from draftdata.stats.runfigures import RunFigures, completion_reason, stopped_lines


class DomainStats(msgspec.Struct, kw_only=True):
    """Tokens, finish reasons and failures of one domain."""

    completions: int = 0
    failures: dict[str, int] = msgspec.field(default_factory=dict)
    finish_reasons: dict[str, int] = msgspec.field(default_factory=dict)
    prompt_tokens: int = 0
    output_tokens: int = 0


class EndpointShare(msgspec.Struct, kw_only=True):
    """One endpoint's part of the run."""

    url: str
    state: str
    engine: str | None = None
    capacity: int | None = None
    concurrency: int = 0
    requests: int = 0
    completed: int = 0
    output_tokens: int = 0  # committed by this command (winning copies only)
    generated_tokens: int = 0  # every answer it returned, losing and uncommitted copies too
    share: float = 0.0  # of the output tokens committed by this command
    errors: dict[str, int] = msgspec.field(default_factory=dict)
    hedges_won: int = 0
    downs: int = 0
    fault: str | None = None  # why it was out of service at the end


class GenerateSummary(msgspec.Struct, kw_only=True):
    """The outcome of one ``generate`` command (this process; a resumed run adds to it)."""

    out: str
    run_id: str | None = None
    model: str = ""
    partition: str | None = None
    total: int | None = None  # (prompt, sample) pairs in scope
    already_done: int = 0  # settled before this command started
    completed: int = 0
    failed: dict[str, int] = msgspec.field(default_factory=dict)
    finish_reasons: dict[str, int] = msgspec.field(default_factory=dict)  # per completion
    truncated: int = 0  # completions with a turn cut by max tokens
    max_tokens: int | None = None  # the --max-tokens this command ran with (None: fill the context)
    clamped: int = 0  # answered requests sent with less than max_tokens, to fit the context
    # conversations that stopped before their last request, by reason (conversation.STOP_*)
    stopped: dict[str, int] = msgspec.field(default_factory=dict)
    prompt_tokens: int = 0
    output_tokens: int = 0
    estimated_answers: int = 0  # whose servers counted no output tokens: estimated from text
    cached_tokens: int = 0
    requests: int = 0
    retries: int = 0
    hedges: int = 0  # hedge copies sent
    hedges_won: int = 0  # ... whose answer was committed
    hedges_wasted: int = 0  # ... thrown away (the original answered first, or the copy failed)
    invalid_prompts: int = 0
    wall_s: float = 0.0
    interrupted: bool = False
    signal: str | None = None  # the signal that interrupted it (SIGINT, SIGTERM), if one did
    remaining: int | None = None
    peak_uncommitted: int = 0  # most records waiting for the store at once
    endpoints: list[EndpointShare] = msgspec.field(default_factory=list)
    domains: dict[str, DomainStats] = msgspec.field(default_factory=dict)
    # per domain, of this command's committed answers: how many, the output tokens expected of
    # them when they were sent (and the estimates' standard errors), and what they took (sums)
    lengths: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    run: RunFigures | None = None  # the whole run (all segments), counted from its shards

    @property
    def failures(self) -> int:
        """All failures recorded by this command."""
        return sum(self.failed.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data

    def lines(self) -> list[str]:
        """The final summary as printed by the CLI."""
        head = "generate: interrupted" if self.interrupted else "generate: done"
        fails = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        if self.run is not None:
            return self._run_lines(head)
        rate = self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0
        finish = ", ".join(f"{k} {v}" for k, v in sorted(self.finish_reasons.items())) or "-"
        out = [
            f"{head}: {self.completed} completions, {self.failures} failures ({fails}) in "
            f"{self.wall_s:.1f} s into {self.out}",
            f"  finish reasons per completion: {finish}; cut by max tokens: {self.truncated}",
            *stopped_lines(self.stopped),
            f"  tokens: {self.prompt_tokens} prompt ({self.cached_tokens} cached), "
            f"{'~' if self.estimated_answers else ''}{self.output_tokens} output "
            f"({rate:.0f} output tok/s)"
            + (
                f"; {self.estimated_answers} answers had no output token count from their "
                f"servers: their tokens are {ESTIMATE_ERROR}"
                if self.estimated_answers
                else ""
            ),
            f"  requests: {self.requests}, retries: {self.retries}, hedges sent: {self.hedges} "
            f"(won {self.hedges_won}, wasted {self.hedges_wasted}); "
            f"already done before: {self.already_done}"
            + (f"; invalid prompt lines: {self.invalid_prompts}" if self.invalid_prompts else ""),
        ]
        out.extend(_cut_warning(self.truncated, self.completed, self.max_tokens))
        out.extend(self._clamp_line())
        for e in self.endpoints:
            errs = ", ".join(f"{k} {v}" for k, v in sorted(e.errors.items())) or "no errors"
            out.append(
                f"  {e.url}: {e.share:.0%} of output tokens, {e.completed} completions, "
                f"concurrency {e.concurrency}, {errs}, {e.state}"
                + (f" ({e.fault})" if e.fault and e.state == "down" else "")
            )
        if len(self.domains) > 1 or (self.domains and "" not in self.domains):
            for name, d in sorted(self.domains.items()):
                f = sum(d.failures.values())
                cut = d.finish_reasons.get("length", 0)
                out.append(
                    f"  domain {name or '(none)'}: {d.completions} completions, {f} failures, "
                    f"{d.output_tokens} output tokens, cut by max tokens {cut}"
                )
        return out

    def _run_lines(self, head: str) -> list[str]:
        """Whole-run figures first; this command's own counts on one line; endpoint states."""
        assert self.run is not None
        run = self.run
        fails = ", ".join(f"{k} {v}" for k, v in sorted(run.failed.items())) or "none"
        out = [
            f"{head}: {run.completions} completions, {run.failures} failures ({fails}) "
            f"in the whole run ({run.prompts} prompts; {run.when()}), into {self.out}",
            *run.lines()[1:],
            f"  this command: {self.completed} completions, {self.failures} failures in "
            f"{self.wall_s:.1f} s; already done before: {self.already_done}"
            + (f"; invalid prompt lines: {self.invalid_prompts}" if self.invalid_prompts else ""),
            *_cut_warning(run.cut, run.completions, self.max_tokens),
            *self._clamp_line(),
        ]
        for e in self.endpoints:
            errs = ", ".join(f"{k} {v}" for k, v in sorted(e.errors.items())) or "no errors"
            out.append(
                f"  {e.url} now: {e.state}, concurrency {e.concurrency}, "
                f"{e.completed} completions this command, {errs}"
                + (f" ({e.fault})" if e.fault and e.state == "down" else "")
            )
        return out

    def _clamp_line(self) -> list[str]:
        """One line when this command lowered the configured limit of some requests to fit the
        context (none otherwise)."""
        if not self.clamped:
            return []
        return [
            f"  output limit: {self.clamped:,} of {self.requests:,} requests got less than "
            "the configured max_tokens, to fit the context (the context length minus the "
            "request's prompt); --strict-limit refuses instead"
        ]


CUT_WARNING_SHARE = 0.05  # warn when more answers than this were cut by the output limit


def _cut_warning(cut: int, completed: int, max_tokens: int | None) -> list[str]:
    """One warning line when more than 5% of ``completed`` answers were cut (none otherwise):
    cut answers have no end of turn to learn. The advice depends on whether ``--max-tokens``
    was set (raise it or unset it) or the limit already filled the context (a longer context)."""
    if not completed or cut <= CUT_WARNING_SHARE * completed:
        return []
    advice = (
        f"leave --max-tokens unset to fill the context, or raise it (now {max_tokens})"
        if max_tokens is not None
        else "the limit already fills each endpoint's context: serve the model with a longer "
        "context length, or shorten the prompts"
    )
    return [
        f"  warning: {cut / completed:.0%} of answers were cut by the output limit "
        f"(finish_reason length, {cut} of {completed}); cut answers have no end of turn to "
        f"learn: {advice}"
    ]


class Tally:
    """Running counts; ``freeze`` makes the summary."""

    def __init__(self) -> None:
        self.completed = 0
        self.failed: Counter[str] = Counter()
        self.finish: Counter[str] = Counter()
        self.truncated = 0
        self.stopped: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.estimated_answers = 0
        self.cached_tokens = 0
        self.domains: dict[str, DomainStats] = {}
        self.endpoint_tokens: Counter[str] = Counter()  # url -> committed output tokens

    def _domain(self, name: str) -> DomainStats:
        d = self.domains.get(name)
        if d is None:
            d = self.domains[name] = DomainStats()
        return d

    def completion(self, c: Completion) -> None:
        """Count one completion handed to the store."""
        self.completed += 1
        d = self._domain(c.domain)
        d.completions += 1
        reasons = [t.finish_reason for t in c.turns]
        reason = completion_reason(reasons)
        self.finish[reason] += 1
        d.finish_reasons[reason] = d.finish_reasons.get(reason, 0) + 1
        self.truncated += "length" in reasons
        # usage, else token ids, else the text
        out, estimated = completion_tokens(c.usage.completion_tokens, c.turns)
        self.estimated_answers += estimated
        self.endpoint_tokens[c.endpoint] += out
        if c.stop_reason:
            self.stopped[c.stop_reason] += 1
        self.prompt_tokens += c.usage.prompt_tokens
        self.output_tokens += out
        self.cached_tokens += c.usage.cached_tokens
        d.prompt_tokens += c.usage.prompt_tokens
        d.output_tokens += out

    def failure(self, f: Failure) -> None:
        """Count one failure handed to the store."""
        self.failed[f.reason] += 1
        d = self._domain(f.domain)
        d.failures[f.reason] = d.failures.get(f.reason, 0) + 1

    def share(self, url: str) -> float:
        """``url``'s share of the output tokens handed to the store (0 when there are none)."""
        return self.endpoint_tokens[url] / self.output_tokens if self.output_tokens else 0.0

    @property
    def done(self) -> int:
        """Completions plus failures so far."""
        return self.completed + sum(self.failed.values())

    def freeze(self, **fields: Any) -> GenerateSummary:
        """The summary with these counts and the given other fields."""
        return GenerateSummary(
            completed=self.completed,
            failed=dict(self.failed),
            finish_reasons=dict(self.finish),
            truncated=self.truncated,
            stopped=dict(self.stopped),
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            estimated_answers=self.estimated_answers,
            cached_tokens=self.cached_tokens,
            domains=dict(sorted(self.domains.items())),
            **fields,
        )
