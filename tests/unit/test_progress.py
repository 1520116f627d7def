"""Row-loop progress, the one look of every stage: plain lines off a terminal (throttled, the
last count of each input always shown), rich's live view on one; the clock is injected."""

from __future__ import annotations

import io
import re

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from draftdata.support.progress import RowProgress, fmt_duration

LINE = re.compile(r"^prepare: (?P<what>\S+): (?P<rows>[\d,]+) rows \((?P<rate>[\d,]+) rows/s\)$")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _plain() -> tuple[io.StringIO, Console]:
    out = io.StringIO()
    return out, Console(file=out, force_terminal=False, width=40)


# (what, rows so far, seconds since the call before), in call order; rows grow per input
_calls = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 5000), st.floats(0, 3)),
    max_size=25,
)


@given(calls=_calls)
def test_plain_lines_are_throttled_and_end_with_each_inputs_last_count(
    calls: list[tuple[str, int, float]],
) -> None:
    out, console = _plain()
    clock = _Clock()
    progress = RowProgress("prepare", console=console, interval=2.0, clock=clock)
    last: dict[int, tuple[str, int]] = {}  # run of calls on one input -> its last count
    run, prev, printed = -1, None, []
    for what, rows, wait in calls:
        clock.now += wait
        if what != prev:
            run, prev = run + 1, what
        progress(what, rows)
        last[run] = (what, rows)
        printed.append(clock.now)
    progress.close()
    lines = out.getvalue().splitlines()
    got = [LINE.match(line) for line in lines]
    assert all(got), lines  # one line each, never wrapped, whatever the console width
    # the last line of each run of calls on one input shows its last count
    shown = [(m["what"], int(m["rows"].replace(",", ""))) for m in got if m]
    ends = [i for i in range(len(shown)) if i + 1 == len(shown) or shown[i + 1][0] != shown[i][0]]
    assert [shown[i] for i in ends] == [last[r] for r in sorted(last)]
    assert len(lines) <= len(calls) + 1


def test_lines_are_at_most_one_per_interval_within_an_input() -> None:
    out, console = _plain()
    clock = _Clock()
    progress = RowProgress("prepare", console=console, interval=2.0, clock=clock)
    for i in range(1, 101):
        clock.now = i * 0.1  # 10 s of calls, ten a second
        progress("src", i * 100)
    progress.close()
    lines = out.getvalue().splitlines()
    assert 5 <= len(lines) <= 7  # at 0.1 s, then every 2 s, and the last count at close
    assert lines[-1] == "prepare: src: 10,000 rows (1,000 rows/s)"


def test_names_that_look_like_markup_print_as_they_are() -> None:
    out, console = _plain()
    progress = RowProgress("merge", console=console, clock=_Clock())
    progress("s3://b/[x]/data", 3)
    progress.close()
    assert out.getvalue().splitlines() == ["merge: s3://b/[x]/data: 3 rows (3,000,000,000 rows/s)"]


def test_on_a_terminal_the_live_view_shows_each_input_and_no_plain_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with RowProgress("prepare", console=console) as progress:
        progress("infinity", 5_000)
        progress("infinity", 12_345)
        progress("metamath", 777)
        progress.close()  # a plan printed between two phases
        console.print("the plan")
        progress("route", 42)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert "12,345 rows" in text and "777 rows" in text and "42 rows" in text
    assert "infinity" in text and "metamath" in text and "route" in text
    assert text.index("the plan") < text.rindex("route")
    assert not any(LINE.match(line) for line in text.splitlines())


def test_durations() -> None:
    assert fmt_duration(None) == "?"
    assert fmt_duration(65) == "1m05s"
    assert fmt_duration(3 * 3600 + 120) == "3h02m"
    assert fmt_duration(5000 * 3600) == "5,000h00m"
