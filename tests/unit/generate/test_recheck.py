"""The refusal verdicts' two checks, as pure parts (``opening.OpeningCheck``, ``recheck.py``):
generated outcomes in generated orders. The opening judges the first jobs *sent*, whatever
order their outcomes come back in; a canary round's held records go out once or are dropped,
never both, and the command stops only where no canary was answered."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftdata.errors import FatalRequestError, RetryableServerError, ServerError
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
        st.integers(0, 5),  # which canary asked so far (stale ones too)
        st.one_of(st.none(), st.just(NOTHING), st.sampled_from(SAID)),
    ),
)


@given(events=st.lists(event, max_size=60))
def test_canary_rounds_write_or_drop_each_record_once(events: list[tuple]) -> None:
    """Random holds and canary outcomes (stale ones too): a held record is written at most
    once and never after its round stopped the command; a round is settled as soon as one
    canary is answered, and stops the command only when every canary it asked came back,
    none answered and one refused."""
    check = Recheck()
    asked: list[tuple[int, str]] = []  # (round, url) asked, in order
    answered: set[int] = set()  # rounds a canary of which was answered
    refusals: dict[int, list[str]] = {}  # round -> the URLs whose canary was refused
    written: list[str] = []
    dropped: set[str] = set()
    held_by_round: dict[int, list[str]] = {}
    n = 0
    for e in events:
        if e[0] == "hold":
            _, said, urls = e
            n += 1
            pid = f"p{n}"
            number, ask = check.hold(said, sorted(urls), [_failure(pid)])
            held_by_round.setdefault(number, []).append(pid)
            asked.extend((number, u) for u in ask)
            assert check.busy
            continue
        _, k, out = e
        if not asked:
            continue
        number, url = asked.pop(k % len(asked))  # each canary comes back once
        live = number in held_by_round
        verdict = check.came(number, url, out)
        if not live:
            assert verdict is None  # a round settled before: nothing more of it
            continue
        if out is None:
            answered.add(number)
        elif isinstance(out, str):
            refusals.setdefault(number, []).append(url)
        if verdict is None:
            assert any(n == number for n, _ in asked)  # its other canaries are still out
            continue
        ids = held_by_round.pop(number)
        if isinstance(verdict, Changed):
            assert number not in answered and verdict.prompts == len(ids)
            assert verdict.endpoints == tuple(refusals[number])
            assert not any(n == number for n, _ in asked)  # every canary came back
            dropped.update(ids)
        else:
            assert sorted(f.id for f in verdict) == sorted(ids)
            written.extend(ids)
            assert out is None or not refusals.get(number)
    assert len(written) == len(set(written)) and not set(written) & dropped
    assert check.busy == bool(held_by_round)
    assert check.held == sum(len(v) for v in held_by_round.values())


def test_a_round_that_every_endpoint_refuses_stops() -> None:
    check = Recheck()
    number, ask = check.hold(SAID[0], ["u0", "u1"], [_failure("a")])
    assert ask == ["u0", "u1"]
    again, more = check.hold(SAID[0], ["u1", "u2"], [_failure("b")])  # joins the round
    assert again == number and more == ["u2"]
    assert check.came(number, "u0", SAID[1]) is None
    assert check.came(number, "u1", NOTHING) is None  # no answer: no evidence either way
    v = check.came(number, "u2", SAID[0])
    assert isinstance(v, Changed) and v.prompts == 2 and v.endpoints == ("u0", "u2")
    assert "\n" not in v.message() and "changed mid-run" in v.message()
    assert not check.busy and check.came(number, "u0", None) is None  # stale


def test_a_round_no_canary_came_back_from_writes_its_records() -> None:
    check = Recheck()
    number, _ = check.hold(SAID[0], ["u0"], [_failure("a")])
    v = check.came(number, "u0", NOTHING)
    assert isinstance(v, list) and [f.id for f in v] == ["a"]


# -- one endpoint's canary ----------------------------------------------------------------------


def _refusal(said: str = "bad") -> ServerError:
    return FatalRequestError(said, status=400)


@given(
    script=st.lists(st.sampled_from(["answer", "refuse", "fail", "hang"]), max_size=12),
    known=st.integers(1, 5),
)
def test_ask_again_is_refused_only_when_each_answered_request_is(
    script: list[str], known: int
) -> None:
    """The sends follow ``script`` (then answer): None as soon as one is answered; a refusal's
    ``said`` only when each request that came back was refused (a refusal moves to the next
    of the newest ``CANARY_PROMPTS``); ``NOTHING`` when none came back; at most ``tries``
    failures or hangs in all (a hung endpoint is given up on, not waited for)."""
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
        failures += 1
        if failures >= 2:
            break
    assert got == expect
    assert set(sent) <= set(range(min(known, CANARY_PROMPTS)))
    assert sum(1 for w in script[: len(sent)] if w in ("fail", "hang")) <= 2
