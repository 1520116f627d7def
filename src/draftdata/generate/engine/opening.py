"""The verdicts on request refusals: whose fault a refusal is, the endpoint's or the prompt's, and
when one refusal of most of a command's first requests stops the command before it records
anything.

A refusal is an HTTP 400 of the request itself (a ``FatalRequestError`` that is no
``ContextLengthError``: a too-long prompt is the prompt's own). The same refusal can mean three
things, and two parts here tell them apart:

- **one endpoint is wrong** (``EndpointRefusals``): a server of a fleet that refuses every
  request with the same answer while the others answer (another engine version, another chat
  template, a LoRA name it lacks). A refused prompt is asked again on another endpoint that has
  not refused it (``Verdict.job`` "elsewhere": requeued, the attempt not charged to the
  prompt), and an endpoint whose latest requests are mostly refused the same way (three
  quarters of the ``RECENT`` sent last before the newest that came back, in the order they
  were sent; those still out count as answers to come) is a suspect from its next such
  refusal until that holds no longer, an endpoint in good standing refuses the same way, or a
  prompt it refused turns out the prompt's (a run of prompts every server refuses). A
  suspect gets no new work while a non-suspect endpoint serves (so a server that answers 400
  at once cannot take every job of the run before the verdict). Once a prompt it refused is
  answered elsewhere while that holds, it is taken out as a faulty endpoint
  (``Verdict.out``; the dispatcher says so in one line, quoting the refusal, and probes it: a
  trial that refuses the same way takes it out again, an answer clears it). The order sent
  decides because a refusal comes back at once and an answer takes its time: in the order
  they come back, a healthy server's few refused prompts would lead its outcomes, and a
  server that turned wrong would seem to answer while it finishes what it took before. This
  holds at any time of the run: a server that starts refusing mid-run is judged on its
  latest requests the same way;
- **the prompt is wrong**: every endpoint in service that is no suspect has refused it (the
  one server of a fleet of one at once; in a fleet, each server that answers others): its
  Failure (``invalid_request``) is recorded, as always (where the endpoint left to ask is
  out of service for a while, a breaker open or a restart, the job waits for it: "later", a
  retry after a backoff within ``max_attempts``). A refusal is not taken for the prompt's on
  one server's word while another could answer it: a server that turned wrong a moment ago
  still looks healthy, and a good prompt recorded as failed is lost for good (the same
  command skips it as settled), while asking again costs one more request, refused at once
  where the prompt is bad. The Failure quotes the refuser in best standing (``witness``);
- **the request is wrong for the whole fleet** (``OpeningCheck``): the records of the
  prompts' refusals are held until the first ``FIRST`` jobs sent have ended (answered or
  failed; a retried or re-asked attempt did not end one), or the command has no more to
  give. In the order sent, not the order they come back: a refusal comes back at once and an
  answer takes its time, so in the order they come back a few percent of prompts the
  template refuses would be most of the first outcomes of a big fleet. If one refusal (the
  same status and message) ended more than half of them and none of them was answered, nor
  any job sent beside them (a stop due waits for those still out then: bad prompts come
  together, and a prompt file whose first rows the template refuses would otherwise stop,
  every time, a fleet that answers the rest), the command stops in one line quoting the
  server and the held records are dropped: nothing is recorded, and the fixed command just
  runs (a command resuming a run that earlier commands settled prompts of is judged on fewer
  only when one refusal ended more than half of ``FIRST``: its few prompts are the run's
  tail; and before it stops, the dispatcher asks the fleet again a prompt an earlier command
  answered, ``recheck.py``: answered, the refusals are the prompts' own). Otherwise the
  held refusals go on as any later one does (``recheck.py``: held until the fleet is asked
  again a request it answered, then recorded, or the command stops if the fleet changed), and
  the check steps aside for the rest of the command. A refusal confined to some endpoints
  never ends a job (it is asked elsewhere), so it cannot stop the command.

It decides only: the dispatcher holds back the records, requeues, takes endpoints out and
stops the run. It knows endpoints by their URL and nothing else of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from draftdata.errors import ContextLengthError, FatalRequestError, ServerError
from draftdata.records import Failure

FIRST = 16  # outcomes judged: enough that a few prompts refused among them are no majority
OTHER = object()  # a request's outcome that is neither an answer nor a refusal (``came``)
RECENT = 8  # an endpoint's latest requests (in the order sent) it is judged on


def is_refusal(err: ServerError) -> bool:
    """Whether ``err`` is a refusal of the request itself (what the check counts)."""
    return isinstance(err, FatalRequestError) and not isinstance(err, ContextLengthError)


@dataclass(frozen=True, slots=True)
class Refused:
    """A job ended by a refusal: the server's answer (``ServerError.said``), the endpoints
    that refused it (URLs, in order), and the job's Failure records (not written yet)."""

    said: str
    endpoints: tuple[str, ...]
    records: list[Failure]
    kind: str = ""  # the job's shape (``recheck.py``'s rounds)


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
    """Judges how the first ``first`` jobs a command sent ended (module docstring). Jobs are
    any hashable objects, told once each: ``sent`` when first launched, then ``settled`` or
    ``refused`` when they end."""

    first: int = FIRST
    open: bool = True  # still judging: refusals' records are held
    seen: int = 0  # of the first ``first`` jobs sent, those that ended
    answered: int = 0  # jobs answered while the check is open (the first ones or others)
    held: list[Refused] = field(default_factory=list)
    _out: set[object] = field(default_factory=set)  # the first ones sent, not ended yet
    _numbered: int = 0
    _said: Counter[str] = field(default_factory=Counter)
    _where: dict[str, list[str]] = field(default_factory=dict)  # said -> endpoints, in order
    _others: set[object] = field(default_factory=set)  # ... sent, not ended yet
    _witness: set[object] | None = None  # those out when a stop was due: it waits for them

    def sent(self, job: object) -> None:
        """``job`` is launched (again: it counts once, by its first launch)."""
        if not self.open or job in self._out or job in self._others:
            return
        if self._numbered < self.first:
            self._numbered += 1
            self._out.add(job)
        else:
            self._others.add(job)

    def split(self, job: object, parts: list[object]) -> None:
        """``job``, sent, is asked again as ``parts`` (one per sample: the server ignores
        ``n``): it never ends itself, its parts end for it (the first one in its place)."""
        if not self.open or not parts:
            return
        if job in self._out:
            self._out.discard(job)
            self._out.add(parts[0])
            parts = parts[1:]
        elif job not in self._others:
            return
        self._others.discard(job)
        self._others.update(parts)
        if self._witness is not None and job in self._witness:
            self._witness.discard(job)
            self._witness.update(parts)

    def _ended(self, job: object) -> bool:
        """Whether ``job`` is one of the first sent (it ends now)."""
        self._others.discard(job)
        if self._witness is not None:
            self._witness.discard(job)
        if job not in self._out:
            return False
        self._out.discard(job)
        self.seen += 1
        return True

    def settled(self, job: object, *, answered: bool) -> None:
        """``job`` ended otherwise than refused: ``answered``, or failed for another reason."""
        if self.open:
            self._ended(job)
            self.answered += answered

    def refused(self, job: object, refusal: Refused) -> None:
        """A refusal of the request (``is_refusal``) ended ``job``; its records are held."""
        self.held.append(refusal)
        if not self._ended(job):
            return
        self._said[refusal.said] += 1
        where = self._where.setdefault(refusal.said, [])
        for endpoint in refusal.endpoints:
            if endpoint not in where:
                where.append(endpoint)

    def verdict(self, *, ended: bool, resumed: bool = False) -> Stop | list[Refused] | None:
        """Once the first ``first`` jobs sent have ended (or the command has ``ended`` with
        fewer): ``Stop`` when one refusal ended more than half of them and none was answered,
        nor any job sent beside them (a stop due waits for the jobs out then: bad prompts come
        together, and a file whose first rows the template refuses must not stop, every time,
        a fleet that answers the rest); else the held refusals (once: the check is then
        closed; they go on to ``recheck.py``'s question). None while undecided or closed. A
        command that ``resumed`` a run whose earlier commands settled prompts is judged on
        fewer than ``first`` only when one refusal ended more than half of ``first``: its few
        prompts are the tail of the run, which a stop would leave unrecorded for every next
        command to stop on again (the run could never end)."""
        if not self.open:
            return None
        if not ended and (self._numbered < self.first or self._out):
            return None
        top, count = self._said.most_common(1)[0] if self._said else ("", 0)
        judged = self.seen >= self.first or not resumed
        most = 2 * count > self.first or (judged and 2 * count > self.seen)
        stop = most and not self.answered
        if stop and not ended:  # the jobs sent beside the first ones may yet be answered
            if self._witness is None:
                self._witness = set(self._others)
            if self._witness:
                return None
        self.open = False
        self._others, self._witness = set(), None
        if stop:
            return Stop(top, count, self.seen, tuple(self._where[top]))
        held, self.held = self.held, []
        return held


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one refusal means for its job: ``prompts``, the prompt's (record its Failure);
    ``elsewhere``, another endpoint in service is to be asked (requeue the job, uncharged,
    away from every endpoint that refused it); ``later``, the one left to ask is out of
    service now (a breaker open, a restart): ask it when it is back (a retry after a backoff,
    charged: a fleet that never comes back ends the prompt's tries). ``out``: endpoints to
    take out as faulty now, each with the refusal it gave (its URL, the server's answer)."""

    job: Literal["prompts", "elsewhere", "later"]
    out: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class EndpointRefusals:
    """Per endpoint, whether its refusals are its own fault (module docstring). Endpoints are
    their URLs; ``in_service`` is the URLs of the endpoints that take work now."""

    _sent: Counter[str] = field(default_factory=Counter)  # url -> requests numbered so far
    _top: Counter[str] = field(default_factory=Counter)  # url -> 1 + newest number back
    # url -> request number -> its refusal, for the latest ``RECENT`` numbers below its top
    _refused: dict[str, dict[int, str]] = field(default_factory=dict)
    _said: Counter[tuple[str, str]] = field(default_factory=Counter)  # (url, refusal) -> times
    suspects: dict[str, str] = field(default_factory=dict)  # url -> the refusal it is held for
    faulty: dict[str, str] = field(default_factory=dict)  # url -> the refusal it was taken out for

    def sent(self, url: str) -> int:
        """A request goes to ``url``: its number there (``came`` takes it back)."""
        number = self._sent[url]
        self._sent[url] = number + 1
        return number

    def came(self, url: str, number: int, outcome: object) -> None:
        """Request ``number`` of ``url`` came back: None answered, a ``ServerError.said``
        refused (``is_refusal``), ``OTHER`` anything else (another failure, cancelled)."""
        refused = self._refused.setdefault(url, {})
        if isinstance(outcome, str):
            self._said[url, outcome] += 1
            refused[number] = outcome
        if number >= self._top[url]:
            self._top[url] = top = number + 1
            for old in [n for n in refused if n < top - RECENT]:
                del refused[old]

    def mostly(self, url: str, said: str) -> bool:
        """Whether ``url``'s latest requests are mostly refused with ``said``: three quarters
        of the ``RECENT`` sent last before the newest that came back (those still out count
        as answers to come). In the order they were sent, not the order they come back: a
        refusal comes back at once and an answer takes its time, so a healthy server's few
        refused prompts would lead, and a server that turned wrong would seem to answer
        while it finishes what it took before."""
        top = self._top[url]
        if top < RECENT:
            return False
        refused = self._refused.get(url, {})
        count = sum(1 for n, s in refused.items() if s == said and n >= top - RECENT)
        return 4 * count >= 3 * RECENT

    def _trusted(self, url: str) -> bool:
        return url not in self.suspects and url not in self.faulty

    def held_out(self, url: str, in_service: Collection[str]) -> bool:
        """Whether ``url`` gets no new work now: a suspect, while another endpoint in service
        is none (the last one serving is never held out: a fleet of one keeps its server)."""
        if url not in self.suspects:
            return False
        return any(u != url and self._trusted(u) for u in in_service)

    def refused(
        self,
        url: str,
        said: str,
        refusers: Mapping[str, str],
        in_service: Collection[str],
        out_of_service: Collection[str] = (),
    ) -> Verdict:
        """``url`` refused a job with ``said`` (``came`` told); ``refusers``: every endpoint
        that refused that job so far (this one included), URL -> its answer;
        ``out_of_service``: the endpoints out now that may come back (not those taken out for
        refusing). The job is the prompt's when no endpoint that is no suspect is left to
        ask, in service or back soon."""
        out: tuple[tuple[str, str], ...] = ()
        if self.faulty.get(url) == said:  # a trial after it was taken out, refused the same way
            out = ((url, said),)
        elif (
            url not in self.suspects
            and self.mostly(url, said)
            and any(u != url and self._trusted(u) for u in in_service)
        ):
            self.suspects[url] = said
        if self._trusted(url):  # it refuses the same way: that refusal is no one server's
            for u in [u for u, s in self.suspects.items() if s == said]:
                del self.suspects[u]
        if any(u not in refusers and self._trusted(u) for u in in_service):
            return Verdict("elsewhere", out)
        if any(u not in refusers and self._trusted(u) for u in out_of_service):
            return Verdict("later", out)
        for u, s in refusers.items():  # the prompt's refusal, not theirs
            if self.suspects.get(u) == s:
                del self.suspects[u]
        return Verdict("prompts", out)

    def witness(self, refusers: Mapping[str, str]) -> str:
        """Which of a failed job's ``refusers`` (URL -> answer) the prompt's Failure quotes:
        the one in best standing (no suspect, the fewest times it gave that same answer; the
        latest to refuse among equals), so that a server refusing everything alike, not yet
        judged, is not quoted where a good one refused the prompt."""

        def standing(url: str) -> tuple[bool, int]:
            return (self._trusted(url), -self._said[url, refusers[url]])

        best = list(refusers)[-1]
        for url in reversed(list(refusers)):
            if standing(url) > standing(best):
                best = url
        return best

    def answered(self, url: str, refusers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """``url`` answered a job (``came`` told) that ``refusers`` (URL -> answer) had
        refused: its fault ends, and its suspicion once its latest requests are no longer
        mostly refused (``mostly``); each refuser whose latest requests are mostly refused
        the way it refused this job is faulty (returned, to take out)."""
        self.faulty.pop(url, None)
        held = self.suspects.get(url)
        if held is not None and not self.mostly(url, held):
            del self.suspects[url]
        out = []
        for u, said in refusers.items():
            if u != url and u not in self.faulty and self.mostly(u, said):
                self.suspects.pop(u, None)
                self.faulty[u] = said
                out.append((u, said))
        return tuple(out)
