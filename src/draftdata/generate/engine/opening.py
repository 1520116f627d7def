"""The first outcomes' verdict: one request refusal that ends most of a command's first requests
stops the command before it records anything.

When the server answers the same HTTP 400 to every request ("Unsupported parameter: top_k"),
the request is wrong, not the prompts: recording each prompt as a fatal ``invalid_request``
would end the command with exit 0 and leave a run that the same command, fixed, then skips.
So the dispatcher holds back the Failure records of request refusals (a ``FatalRequestError``
that is no ``ContextLengthError``: a too-long prompt is the prompt's own) until the first
``FIRST`` outcomes are in (every job that ended: answered or failed; a retried attempt did
not end one), or the command has no more to give. If one refusal (the same status and
message) ended more than half of them, the command stops in one line quoting the server and
the held records are dropped: nothing is recorded, and the fixed command just runs (a command
resuming a run that earlier commands settled prompts of is judged on fewer only when one refusal
ended more than half of ``FIRST``: its few prompts are the run's tail). Otherwise
the held records go out as they would have, and the check steps aside for the rest of the
command: a few prompts refused among good answers are each recorded, as always.

It decides only; the dispatcher holds back the records and stops the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from draftdata.errors import ContextLengthError, FatalRequestError, ServerError
from draftdata.records import Failure

FIRST = 16  # outcomes judged: enough that a few prompts refused among them are no majority


def is_refusal(err: ServerError) -> bool:
    """Whether ``err`` is a refusal of the request itself (what the check counts)."""
    return isinstance(err, FatalRequestError) and not isinstance(err, ContextLengthError)


@dataclass(frozen=True, slots=True)
class Stop:
    """One refusal ended ``count`` of the first ``seen`` outcomes: the command stops."""

    said: str  # the server's answer, as ServerError.said shows it
    count: int
    seen: int
    endpoints: tuple[str, ...]

    def message(self) -> str:
        """The one line the command ends with."""
        where = ", ".join(self.endpoints[:3]) + (" ..." if len(self.endpoints) > 3 else "")
        return (
            f"{self.count:,} of the first {self.seen:,} requests were refused with the same "
            f"answer ({self.said}, by {where}): the request is wrong for this server, not the "
            "prompts; nothing was recorded for them. Change what the requests carry (the "
            "sampling options, --reasoning, --extra-body, --model) or the server, then run the "
            "command again"
        )


@dataclass(slots=True)
class OpeningCheck:
    """Judges a command's first ``first`` outcomes (module docstring)."""

    first: int = FIRST
    open: bool = True  # still judging: refusals' records are held
    seen: int = 0
    held: list[Failure] = field(default_factory=list)
    _said: Counter[str] = field(default_factory=Counter)
    _where: dict[str, list[str]] = field(default_factory=dict)  # said -> endpoints, in order

    def settled(self) -> None:
        """A job ended otherwise: answered, or failed for another reason."""
        if self.open:
            self.seen += 1

    def refused(self, err: ServerError, endpoint: str, records: list[Failure]) -> None:
        """A refusal of the request (``is_refusal``) ended a job; its ``records`` are held."""
        self.seen += 1
        self._said[err.said] += 1
        where = self._where.setdefault(err.said, [])
        if endpoint not in where:
            where.append(endpoint)
        self.held.extend(records)

    def verdict(self, *, ended: bool, resumed: bool = False) -> Stop | list[Failure] | None:
        """``Stop`` when one refusal ended more than half of the first outcomes (at once when
        it is more than half of ``first``; else once ``first`` are in, or the command has
        ``ended`` with fewer); the held records to write when it did not (once: the check is
        then closed); None while undecided or closed. A command that ``resumed`` a run whose
        earlier commands settled prompts is not judged on fewer than ``first``: its few
        prompts are the tail of the run, which a stop would leave unrecorded for every next
        command to stop on again (the run could never end)."""
        if not self.open:
            return None
        top, count = self._said.most_common(1)[0] if self._said else ("", 0)
        short = ended and not resumed  # the whole command, fewer than ``first``, judged
        if 2 * count > self.first or ((self.seen >= self.first or short) and 2 * count > self.seen):
            self.open = False
            return Stop(top, count, self.seen, tuple(self._where[top]))
        if self.seen < self.first and not ended:
            return None
        self.open = False
        held, self.held = self.held, []
        return held
