"""The refusal verdicts' two checks, as pure parts (``opening.OpeningCheck``, ``recheck.py``):
generated outcomes in generated orders. The opening judges the first jobs *sent*, whatever
order their outcomes come back in; a canary round's held records go out once or are dropped,
never both, and the command stops only where no canary was answered."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import (
    ContextLengthError,
    FatalRequestError,
    RetryableServerError,
    ServerError,
)
from draftdata.generate.engine.opening import FIRST, OpeningCheck, Refused, Stop, is_refusal
from draftdata.generate.engine.recheck import (
    CANARY_PROMPTS,
    NOTHING,
    Changed,
    Recheck,
    ask_again,
)
from draftdata.records import Failure

SAID = ["HTTP 400: bad A", "HTTP 400: bad B"]


def _failure(pid: str) -> Failure:
    return Failure(id=pid, reason="invalid_request", message="x", attempts=1)


# -- the opening: the first jobs sent, in any order back ------------------------------------

outcome = st.one_of(st.just("answered"), st.just("other"), st.sampled_from(SAID))


@given(
    outcomes=st.lists(outcome, min_size=1, max_size=40),
    order=st.randoms(use_true_random=False),
    resumed=st.booleans(),
)
def test_the_opening_judges_the_first_jobs_sent_in_any_order_back(
    outcomes: list[str], order: object, resumed: bool
) -> None:
    """Jobs 0..n-1 are sent in that order and end in a random order: the verdict (stop or
    not, with what) is the same as in the order sent, and it stops exactly when one refusal
    ended more than half of the first ``FIRST`` and none of them was answered, nor any job
    sent beside them (all are sent here before any ends; a resumed command's fewer than
    ``FIRST`` only when that is more than half of ``FIRST``)."""

    def run(back: list[int]) -> tuple[object, list[str]]:
        """The verdict, and every refusal that went on (held then let go, or after)."""
        check = OpeningCheck()
        for job in range(len(outcomes)):
            check.sent(job)
        verdict: object = None
        went_on: list[str] = []
        for k, job in enumerate(back):
            o = outcomes[job]
            if o in SAID and not check.open:  # the dispatcher's: no longer the opening's
                went_on.append(str(job))
            elif o in SAID:
                check.refused(job, Refused(o, ("u",), [_failure(str(job))]))
            else:
                check.settled(job, answered=o == "answered")
            v = check.verdict(ended=k == len(back) - 1, resumed=resumed)
            if v is not None:
                assert verdict is None  # said once
                verdict = v
                if isinstance(v, list):
                    went_on.extend(r.records[0].id for r in v)
        assert verdict is not None and not check.open
        return verdict, went_on

    sent = list(range(len(outcomes)))
    shuffled = sent[:]
    order.shuffle(shuffled)  # type: ignore[attr-defined]
    (a, on_a), (b, on_b) = run(sent), run(shuffled)
    first = outcomes[:FIRST]
    counts = {s: first.count(s) for s in SAID}
    top = max(counts.values())
    judged = len(first) >= FIRST or not resumed
    stops = "answered" not in outcomes and (2 * top > FIRST or (judged and 2 * top > len(first)))
    assert isinstance(a, Stop) == stops == isinstance(b, Stop)
    if isinstance(a, Stop) and isinstance(b, Stop):
        assert (a.count, a.seen) == (b.count, b.seen) == (top, len(first))
    else:  # every refusal goes on, whoever ended when
        refusals = sorted(str(j) for j, o in enumerate(outcomes) if o in SAID)
        assert sorted(on_a) == sorted(on_b) == refusals


def test_a_job_sent_again_counts_once() -> None:
    check = OpeningCheck(first=2)
    check.sent("a")
    check.sent("a")  # a retry
    check.sent("b")
    check.sent("c")  # not among the first two
    check.refused("c", Refused(SAID[0], ("u",), []))
    assert check.verdict(ended=False) is None
    check.refused("a", Refused(SAID[0], ("u",), []))
    assert check.verdict(ended=False) is None  # "b" has not ended
    check.refused("b", Refused(SAID[0], ("u",), []))
    v = check.verdict(ended=False)
    assert isinstance(v, Stop) and (v.count, v.seen) == (2, 2)


@pytest.mark.parametrize("witness", ["answered", "refused"])
def test_a_stop_due_waits_for_the_jobs_out_then_and_no_later_ones(witness: str) -> None:
    """The first jobs all refused while a job sent beside them runs: no verdict until it
    ends; its answer lets the refusals go on, its refusal stops (a job sent after the stop
    was due is not waited for)."""
    check = OpeningCheck(first=2)
    for job in "abc":
        check.sent(job)
    check.refused("a", Refused(SAID[0], ("u",), [_failure("a")]))
    check.refused("b", Refused(SAID[0], ("u",), [_failure("b")]))
    assert check.verdict(ended=False) is None  # "c" may be answered
    check.sent("d")
    assert check.verdict(ended=False) is None
    if witness == "answered":
        check.settled("c", answered=True)
        v = check.verdict(ended=False)
        assert isinstance(v, list) and sorted(r.records[0].id for r in v) == ["a", "b"]
    else:
        check.refused("c", Refused(SAID[0], ("u",), [_failure("c")]))
        v = check.verdict(ended=False)
        assert isinstance(v, Stop) and (v.count, v.seen) == (2, 2)
    assert not check.open


# -- the mid-run canary rounds ----------------------------------------------------------------

URLS = ["u0", "u1", "u2"]
event = st.one_of(
    st.tuples(st.just("hold"), st.sampled_from(SAID), st.sets(st.sampled_from(URLS), min_size=1)),
    st.tuples(
        st.just("came"),
        st.integers(0, 5),  # which canary out comes back
        st.one_of(st.none(), st.just(NOTHING), st.sampled_from(SAID)),
    ),
)


@given(events=st.lists(event, max_size=60))
def test_canary_rounds_write_or_drop_each_record_once(events: list[tuple]) -> None:
    """Random holds and canary outcomes: a held record is written at most once and never
    once the command stopped; at most one round of a refusal is out at a time, and a refusal
    held while it is out waits for the next; a round is settled as soon as one canary is
    answered, and stops the command only when every endpoint it asked refused the way its
    prompts were refused; every record is written or dropped in the end."""
    check = Recheck()
    out: list[tuple[int, str]] = []  # canaries sent, not back
    said_of: dict[int, str] = {}  # round -> its refusal
    held: dict[int, list[str]] = {}  # round -> the ids held in it
    round_of: dict[str, int] = {}  # id -> round
    refused: dict[int, list[str]] = {}
    written: list[str] = []
    stopped = False
    n = 0

    def send() -> None:
        due = check.due()
        for number, _ in due:  # one round of a refusal out at a time
            live = [k for k, _ in out if k in held]
            assert number in held and all(said_of[k] != said_of[number] for k in live)
        out.extend(due)

    for e in events:
        if stopped:
            break
        if e[0] == "hold":
            _, said, urls = e
            n += 1
            pid = f"p{n}"
            before = {k for k, _ in out}
            check.hold(said, sorted(urls), [_failure(pid)])
            number = next(r.number for r in check._rounds if r.said == said and not r.sealed)
            assert number not in before  # a round out takes no more
            said_of[number] = said
            held.setdefault(number, []).append(pid)
            round_of[pid] = number
            send()
            continue
        _, k, outcome = e
        if not out:
            continue
        number, url = out.pop(k % len(out))
        verdict = check.came(number, url, outcome)
        if number not in held:
            assert verdict is None  # its round was settled before
            continue
        if outcome == said_of[number]:
            refused.setdefault(number, []).append(url)
        if verdict is None:
            assert outcome != None and any(j == number for j, _ in out)  # noqa: E711
            continue
        ids = held.pop(number)
        if isinstance(verdict, Changed):
            assert outcome is not None and verdict.endpoints == tuple(refused[number])
            assert not any(j == number for j, _ in out)
            assert verdict.prompts == len(ids) + sum(len(v) for v in held.values())
            stopped = True
        else:
            assert sorted(f.id for f in verdict) == sorted(ids)
            written.extend(ids)
            send()
    assert len(written) == len(set(written))
    if not stopped:
        assert check.busy == bool(held)
        assert check.held == sum(len(v) for v in held.values())


def test_a_round_that_every_endpoint_refuses_stops() -> None:
    check = Recheck()
    check.hold(SAID[0], ["u0", "u1"], [_failure("a")])
    (number, _), (_, _) = sent = check.due()
    assert [u for _, u in sent] == ["u0", "u1"]
    check.hold(SAID[0], ["u1", "u2"], [_failure("b")])  # waits: the round is out
    assert check.due() == []
    assert check.came(number, "u0", SAID[0]) is None
    v = check.came(number, "u1", SAID[0])
    assert isinstance(v, Changed) and v.prompts == 2 and v.endpoints == ("u0", "u1")
    assert "\n" not in v.message() and "answered earlier in this run" in v.message()
    assert not check.busy and check.came(number, "u0", None) is None  # stale


def test_a_canary_refused_otherwise_or_unanswered_proves_nothing() -> None:
    """Refused with another answer than the prompts (something of the canary's own), or no
    answer at all: the records are written, the command goes on."""
    for other in (SAID[1], NOTHING):
        check = Recheck()
        check.hold(SAID[0], ["u0", "u1"], [_failure("a")])
        (number, _), _ = check.due()
        assert check.came(number, "u0", SAID[0]) is None
        v = check.came(number, "u1", other)
        assert isinstance(v, list) and [f.id for f in v] == ["a"]


def test_the_round_that_waited_goes_out_when_the_one_before_is_answered() -> None:
    check = Recheck()
    check.hold(SAID[0], ["u0"], [_failure("a")])
    ((first, _),) = check.due()
    check.hold(SAID[0], ["u0"], [_failure("b")])  # after the canary left: the next round
    v = check.came(first, "u0", None)
    assert isinstance(v, list) and [f.id for f in v] == ["a"]
    ((second, url),) = check.due()
    assert second != first and url == "u0" and check.held == 1


# -- one endpoint's canary ----------------------------------------------------------------------


def _refusal(said: str = "bad") -> ServerError:
    return FatalRequestError(said, status=400)


@given(
    script=st.lists(st.sampled_from(["answer", "refuse", "fail", "hang", "long"]), max_size=12),
    known=st.integers(1, 5),
)
def test_ask_again_is_refused_only_when_each_answered_request_is(
    script: list[str], known: int
) -> None:
    """The sends follow ``script`` (then answer): None as soon as one is answered; a refusal's
    ``said`` only when each request that came back was refused (a refusal moves to the next
    of the newest ``CANARY_PROMPTS``); ``NOTHING`` when none came back; at most ``tries``
    failures or hangs in all (a hung endpoint is given up on, not waited for). A request too
    long for the endpoint (``long``: a conversation answered where the context is larger)
    moves to the next at once, neither a refusal nor a failure: it was asked again the same
    request ``tries`` times before, and never the next."""
    sent: list[int] = []
    it = iter(script)

    async def send(item: int) -> None:
        sent.append(item)
        what = next(it, "answer")
        if what == "refuse":
            raise _refusal()
        if what == "fail":
            raise RetryableServerError("HTTP 503")
        if what == "hang":
            await asyncio.sleep(60)
        if what == "long":
            raise ContextLengthError("This model's maximum context length is 4096", status=400)

    got = asyncio.run(
        ask_again(
            send,
            list(range(known)),
            refusal=is_refusal,
            backoff=lambda _t: 0.0,
            tries=2,
            timeout=0.01,
        )
    )
    # replay the rule
    expect: object = NOTHING
    failures, item, steps = 0, 0, iter(script)
    while item < min(known, CANARY_PROMPTS):
        what = next(steps, "answer")
        if what == "answer":
            expect = None
            break
        if what == "refuse":
            expect, item = "HTTP 400: bad", item + 1
            continue
        if what == "long":
            item += 1
            continue
        failures += 1
        if failures >= 2:
            break
    assert got == expect
    assert set(sent) <= set(range(min(known, CANARY_PROMPTS)))
    assert sum(1 for w in script[: len(sent)] if w in ("fail", "hang")) <= 2
    assert all(sent[i] < sent[i + 1] for i, w in enumerate(script[: len(sent) - 1]) if w == "long")


def test_rounds_of_one_refusal_and_other_shapes_are_asked_apart() -> None:
    """Prompts with tools and plain ones refused the same way: two rounds, both out at once,
    each of its shape (the dispatcher's canaries of that shape), settled apart."""
    check = Recheck()
    check.hold(SAID[0], ["u0"], [_failure("t")], "tools")
    check.hold(SAID[0], ["u0"], [_failure("p")], "plain")
    sent = check.due()
    assert len(sent) == 2 and {check.kind_of(n) for n, _ in sent} == {"tools", "plain"}
    tools = next(n for n, _ in sent if check.kind_of(n) == "tools")
    plain = next(n for n, _ in sent if check.kind_of(n) == "plain")
    v = check.came(plain, "u0", None)
    assert isinstance(v, list) and [f.id for f in v] == ["p"]
    v = check.came(tools, "u0", SAID[0])
    assert isinstance(v, Changed) and v.prompts == 1 and check.kind_of(tools) == ""
