"""The plan: first copy of an id, empty and loss-free samples left out and counted, cuts to the
longest allowed, the dataset's identity, and batches under the token budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.hidden.helpers import sample_rows, write_samples

from draftdata.hidden.plan import batches, iter_rows, make_plan, rows_of_pilot
from draftdata.hidden.writer import SampleRow


def test_plan_counts_what_it_leaves_out(tmp_path: Path) -> None:
    rows = sample_rows(20, lo=10, hi=60)
    rows.append(dict(rows[3]))  # a copy of s0003: the first counts
    rows.append({**rows[0], "id": "empty", "input_ids": [], "loss_mask": [], "num_tokens": 0})
    rows.append({**rows[0], "id": "noloss", "loss_mask": [0] * len(rows[0]["input_ids"])})
    long = {
        **rows[1],
        "id": "long",
        "input_ids": list(range(100)),
        "loss_mask": [0] * 50 + [1] * 50,
    }
    rows.append(long)
    cut_out = {
        **rows[1],
        "id": "loss-after-cut",
        "input_ids": list(range(100)),
        "loss_mask": [0] * 90 + [1] * 10,
    }
    rows.append(cut_out)
    plan = make_plan(str(write_samples(tmp_path / "tok", rows, shards=3)), max_length=80)
    assert plan.dropped == {"duplicates": 1, "empty": 1, "no_loss_tokens": 2}
    assert plan.ids[:20] == [f"s{i:04d}" for i in range(20)] and plan.ids[20] == "long"
    assert plan.num_tokens[20] == 80 and bool(plan.truncated[20])
    again = list(iter_rows(plan))
    assert [s.row for s in again] == list(range(plan.samples))
    assert np.array_equal(again[20].input_ids, np.arange(80))


def test_identity_follows_every_token(tmp_path: Path) -> None:
    rows = sample_rows(10)
    a = make_plan(str(write_samples(tmp_path / "a", rows)), None).sha256
    rows[7]["input_ids"][-1] ^= 1
    b = make_plan(str(write_samples(tmp_path / "b", rows)), None).sha256
    rows[7]["input_ids"][-1] ^= 1
    rows[7]["loss_mask"][0] ^= 1
    c = make_plan(str(write_samples(tmp_path / "c", rows)), None).sha256
    assert len({a, b, c}) == 3
    assert (
        make_plan(str(write_samples(tmp_path / "d", sample_rows(10), shards=4)), None).sha256 == a
    )


@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(1, 1000))
def test_batches_stay_in_budget_and_hold_every_sample_once(lengths: list[int], budget: int) -> None:
    samples = [
        SampleRow(row=i, id=str(i), input_ids=np.zeros(n, np.int64), loss_mask=np.ones(n, np.int64))
        for i, n in enumerate(lengths)
    ]
    got = list(batches(samples, budget))
    rows = sorted(s.row for b in got for s in b)
    assert rows == list(range(len(lengths)))
    for b in got:
        assert len(b) == 1 or max(len(s.input_ids) for s in b) * len(b) <= budget


def test_the_pilot_is_the_same_draw_each_time(tmp_path: Path) -> None:
    plan = make_plan(str(write_samples(tmp_path / "t", sample_rows(200))), None)
    todo = set(range(200))
    first = rows_of_pilot(plan, 0.1, todo)
    assert len(first) == 20 and first == rows_of_pilot(plan, 0.1, todo)
    assert rows_of_pilot(plan, 0.1, todo - first) == set()  # a rerun finds the pilot done
    assert len(rows_of_pilot(plan, 7, todo)) == 7


_WS = st.text(alphabet=" \t\r\n", max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from(["blank", "array", "gzip-blank", "gzip-array"]),
    a=_WS,
    b=_WS,
    c=_WS,
)
def test_an_empty_input_is_refused_as_empty_not_as_conversations(
    tmp_path_factory: pytest.TempPathFactory, shape: str, a: str, b: str, c: str
) -> None:
    """Any empty shape (blank text, an empty JSON array with white space anywhere, gzip of
    either) is "holds nothing to read", never "conversations: run tokenize first"."""
    import gzip

    from draftdata.errors import EmptyInputError
    from draftdata.hidden.plan import open_input

    text = (a + b + c) if "blank" in shape else f"{a}[{b}]{c}"
    data = text.encode()
    name = "empty.jsonl" if "blank" in shape else "empty.json"
    if shape.startswith("gzip"):
        data, name = gzip.compress(data), name + ".gz"
    path = tmp_path_factory.mktemp("empty") / name
    path.write_bytes(data)
    with pytest.raises(EmptyInputError, match="holds nothing to read"):
        open_input(str(path))
