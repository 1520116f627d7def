"""What an endpoint knows of its server's default thinking mode, and the label of an answer.

The shape (generated): a server whose default flips at any moment (a restart with other
kwargs), restarts suspected (a connection error, a health check) any time after, probes that
tell the mode or fail, and requests that start and end in any order. An answer is labelled with
a mode only if it is the one the server had when the request started, whenever every flip
before the answer ended was suspected before it ended (what generate does: a restart drops
connections, and the health check or the reviver suspects and probes). A server restarted
twice between two probes (the same mode before and after) is the case a probe alone misses.
And a server that never flips, probed once, labels every later answer.
"""

from __future__ import annotations

import asyncio

from hypothesis import example, given, settings
from hypothesis import strategies as st

from draftdata.generate.answers.thinking import ThinkingMode, joined

EVENTS = st.lists(
    st.one_of(
        st.just(("flip", 0)),
        st.just(("suspect", 0)),
        st.tuples(st.just("probe"), st.integers(0, 1)),  # 1: the server tells
        st.tuples(st.just("start"), st.integers(0, 1)),
        st.tuples(st.just("end"), st.integers(0, 1)),
    ),
    max_size=24,
)
# a server restarted twice between two probes: the same mode before and after, another between
TWICE = [("probe", 1), ("flip", 0), ("start", 0), ("flip", 0), ("suspect", 0), ("probe", 1)]


@settings(max_examples=500, deadline=None)
@given(events=EVENTS, first=st.booleans())
@example(events=[*TWICE, ("end", 0)], first=False)
def test_a_label_is_never_a_mode_the_answer_was_not_written_in(
    events: list[tuple[str, int]], first: bool
) -> None:
    mode = ThinkingMode()
    true = first
    flips: list[int] = []  # event index of each flip
    suspects: list[int] = []  # event index of each suspected restart
    running: dict[int, tuple[object, bool, int]] = {}  # request -> (mark, written in, start)
    for at, (kind, arg) in enumerate(events):
        if kind == "flip":
            true = not true
            flips.append(at)
        elif kind == "suspect":
            mode.suspect()
            suspects.append(at)
        elif kind == "probe":
            mode.learn(true if arg else None)
        elif kind == "start" and arg not in running:
            running[arg] = (mode.mark(), true, at)
        elif kind == "end" and arg in running:
            mark, written, _ = running.pop(arg)
            label = mode.since(mark)  # type: ignore[arg-type]
            seen = all(any(f < s < at for s in suspects) for f in flips)
            if label is not None and seen:
                assert label == written, (events, arg)


@given(first=st.booleans(), n=st.integers(1, 5))
def test_a_steady_server_probed_once_labels_every_answer(first: bool, n: int) -> None:
    mode = ThinkingMode()
    calls = []

    async def probe() -> bool | None:
        calls.append(1)
        return first

    mode.probe = probe

    async def requests() -> list[bool | None]:
        await asyncio.gather(*(mode.first() for _ in range(n)))  # concurrent first requests
        marks = [mode.mark() for _ in range(n)]
        return [mode.since(m) for m in marks]

    assert asyncio.run(requests()) == [first] * n
    assert len(calls) == 1  # one probe for all of them


def test_turns_of_two_attempts_keep_a_mode_only_when_both_know_the_same() -> None:
    assert joined(True, True) is True and joined(False, False) is False
    assert joined(True, False) is None and joined(None, True) is None and joined(True, None) is None
