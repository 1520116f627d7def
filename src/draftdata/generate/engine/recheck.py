"""The mid-run check on refusals: is a prompt refused by every endpoint the prompt's fault, or
did the fleet change since it answered?

The opening check (``opening.OpeningCheck``) judges a command's first outcomes: one refusal of
most of them stops the command before anything of them is recorded. After it, a refusal that
every serving endpoint gave a prompt is that prompt's Failure (``invalid_request``). Two things
look alike there: a prompt with something the chat template or the server refuses, and a fleet
that changed mid-run (restarted with another template, engine version, model or launch
options): then every prompt left is refused the same way, each is recorded as failed, the
command ends with exit 0, and the same command skips them as settled.

Telling them apart takes one question, not a streak rule (bad prompts often come together: one
source's rows carrying the same thing the template refuses): the record of such a refusal is
held, and each endpoint that refused the prompt is asked again a request the run had answered
(a canary: the same request, its output limited to a token or so; ``ask_again``; of a
conversation, its last request, with the history it was answered with, one with history
first): one this command
answered, or, for a resumed command's opening (``opening.py``), one an earlier command
answered.

- answered by one of them: the fleet still answers what it answered, the refusals are the
  prompts' own: the held records go out (``Recheck.came`` returns them);
- refused by every endpoint asked, the way the prompts were: the fleet (or the command's
  requests) changed: the command stops in one line quoting the refusal (``Changed``), and
  the held records are dropped: nothing is recorded for those prompts, so the same command
  asks them again once the servers answer;
- neither (a canary refused otherwise, or failed: timeouts, server errors, ``CANARY_TRIES``
  of them per endpoint, each waited for ``CANARY_TIMEOUT_S`` at most): the records go out, as
  they would have without the check.

Refusals are grouped in rounds by the server's answer (``said``) and the prompts' shape (with
tools or not, one turn or several: the canaries are requests of that shape where the run
answered one, since a template that turned to refuse tools answers plain prompts still). A
round is sealed once its canaries are out: a refusal that comes later waits for the next
round of its answer, sent when this one settles (a canary sent before the fleet changed says
nothing of the refusals the change brings). A canary refused otherwise than the round's
prompts were (something of its own, its one token) proves nothing, as does one that got no
answer. A canary is asked of up to ``CANARY_PROMPTS`` answered requests in turn, so that one
refusal of a request that was answered (a server refusing at random) is not taken for a
changed fleet: each must be refused; one too long for the endpoint asked (a conversation's
last request, answered where the context is larger) moves to the next at once.

It decides only, and knows endpoints by their URL; the dispatcher holds the records, sends the
canaries (``Caller.ask_again``) and stops the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from draftdata.errors import ContextLengthError, ServerError
from draftdata.records import Failure

CANARY_PROMPTS = 3  # answered requests an endpoint is asked again, each to be refused
CANARY_TRIES = 3  # failures of an endpoint's canary other than refusals (timeouts, errors)
CANARY_TIMEOUT_S = 120.0  # for one canary's answer (a token; it may queue behind a full batch)

Known = TypeVar("Known")
NOTHING = object()  # a canary's outcome when nothing came back (no answer, no refusal)


@dataclass(frozen=True, slots=True)
class Changed:
    """The endpoints refused requests this run had answered: the command stops."""

    said: str  # the canaries' refusal, as ServerError.said shows it
    prompts: int  # prompts whose refusals were held (not recorded)
    endpoints: tuple[str, ...]

    def message(self) -> str:
        """The one line the command ends with."""
        where = ", ".join(self.endpoints[:3]) + (" ..." if len(self.endpoints) > 3 else "")
        return (
            f"the servers now refuse requests they answered earlier in this run ({self.said}, "
            f"by {where}): the servers changed (restarted with another chat template, engine "
            "version, model or options?), or this command's requests did (a sampling option, "
            f"--reasoning, --extra-body); the {self.prompts:,} prompts refused since are not "
            "recorded, and what was answered before is kept. Fix it, then run the same "
            "command: it asks those prompts again"
        )


@dataclass(slots=True)
class _Round:
    """One question to the fleet about one refusal (``said``): the records held for it, the
    endpoints to ask, and what came back. Sealed once its canaries are out: a refusal that
    comes after them waits for the next round (a canary sent before the fleet changed says
    nothing of the refusals the change brings)."""

    number: int
    said: str
    kind: str = ""  # the prompts' shape (the dispatcher's: tools, turns): canaries of it
    held: list[Failure] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    asked: dict[str, None] = field(default_factory=dict)  # the endpoints to ask, in order
    sealed: bool = False
    pending: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # url -> the canary's refusal
    unknown: int = 0  # canaries that came back with nothing (no answer, no refusal)


@dataclass(slots=True)
class Recheck:
    """Holds refusal records until a canary round settles them (module docstring)."""

    _rounds: list[_Round] = field(default_factory=list)  # open, in the order started
    _numbered: int = 0

    @property
    def busy(self) -> bool:
        """Whether records are held for a round not settled yet."""
        return bool(self._rounds)

    @property
    def held(self) -> int:
        """Prompts whose refusal records are held now."""
        return sum(len(r.ids) for r in self._rounds)

    def hold(
        self, said: str, refusers: Iterable[str], records: Sequence[Failure], kind: str = ""
    ) -> None:
        """A prompt's refusal ``said`` by ``refusers`` (URLs in service): its ``records`` are
        held in the round of ``said`` and ``kind`` (the prompt's shape: a template that turned
        to refuse prompts with tools answers the rest) that is not sealed yet (``due`` sends
        it)."""
        key = (said, kind)
        r = next((r for r in self._rounds if (r.said, r.kind) == key and not r.sealed), None)
        if r is None:
            self._numbered += 1
            r = _Round(self._numbered, said, kind)
            self._rounds.append(r)
        r.held.extend(records)
        r.ids.update(f.id for f in records)
        r.asked.update(dict.fromkeys(refusers))

    def due(self) -> list[tuple[int, str]]:
        """The canaries to send now, (round, URL): each round not sealed whose refusal has
        no round out (sealed here)."""
        out: list[tuple[int, str]] = []
        busy = {(r.said, r.kind) for r in self._rounds if r.sealed}
        for r in self._rounds:
            if r.sealed or (r.said, r.kind) in busy:
                continue
            r.sealed = True
            r.pending = set(r.asked)
            busy.add((r.said, r.kind))
            out.extend((r.number, url) for url in r.asked)
        return out

    def kind_of(self, number: int) -> str:
        """The prompts' shape of round ``number`` ("" once it is settled)."""
        return next((r.kind for r in self._rounds if r.number == number), "")

    def came(self, number: int, url: str, outcome: object) -> Changed | list[Failure] | None:
        """The canary of round ``number`` asked of ``url`` came back: None answered, a
        ``ServerError.said`` refused, ``NOTHING`` neither. Returns the records to write (the
        round settled as the prompts' refusals), ``Changed`` (the command stops; the records
        held are dropped), or None (undecided, or the round was settled before). The fleet
        changed only when every endpoint asked refused, each the way the round's prompts
        were refused: a canary refused otherwise (something of the canary's own, its one
        token) or not answered at all proves nothing, and the records go out."""
        r = next((r for r in self._rounds if r.number == number), None)
        if r is None or url not in r.pending:
            return None
        r.pending.discard(url)
        if outcome is None:
            self._rounds.remove(r)
            return r.held
        if isinstance(outcome, str) and outcome == r.said:
            r.refused[url] = outcome
        else:
            r.unknown += 1
        if r.pending:
            return None
        self._rounds.remove(r)
        if r.unknown or not r.refused:
            return r.held
        dropped = r.ids.union(*(x.ids for x in self._rounds))  # every round's, held no more
        self._rounds.clear()
        return Changed(r.said, len(dropped), tuple(r.refused))


async def ask_again(
    send: Callable[[Known], Awaitable[object]],
    known: Sequence[Known],
    *,
    refusal: Callable[[ServerError], bool],
    backoff: Callable[[int], float],
    prompts: int = CANARY_PROMPTS,
    tries: int = CANARY_TRIES,
    timeout: float = CANARY_TIMEOUT_S,
) -> object:
    """One endpoint's canary (module docstring): ``send`` each of the newest ``prompts`` of
    ``known`` (answered requests, newest first) until one is answered (None); a ``refusal``
    moves to the next; any other failure, or no answer within ``timeout`` seconds, is tried
    again after ``backoff(failures)`` seconds, ``tries`` such failures in all. Returns None
    (one was answered), the last refusal's ``said`` when every request that came back was
    refused, or ``NOTHING`` (none came back). A request too long for the endpoint
    (``ContextLengthError``: a conversation answered on an endpoint with a larger context,
    or the fleet restarted with a smaller one) came back with nothing of the question: it
    moves to the next, neither a refusal nor a failure (asked again, it would be too long
    again). A hung endpoint costs ``tries * timeout`` at most, not a run's read timeout: the
    command waits for its canaries before it ends."""
    refused: object = NOTHING
    failures = 0
    items = list(known[:prompts])
    i = 0
    while i < len(items):
        try:
            await asyncio.wait_for(send(items[i]), timeout)
        except ContextLengthError:
            i += 1
            continue
        except ServerError as err:
            if refusal(err):
                refused = err.said
                i += 1
                continue
        except TimeoutError:
            pass
        else:
            return None
        failures += 1
        if failures >= tries:
            break
        await asyncio.sleep(backoff(failures))
    return refused
