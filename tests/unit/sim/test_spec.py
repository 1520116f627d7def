"""The simulator's speculative decoding: draws whose averages are the configured rates."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.sim.spec import SpecCounters, draw, expected


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 6),
    p=st.floats(0.0, 0.95),
    seed=st.integers(0, 2**32 - 1),
)
def test_many_draws_average_to_the_expected_rates(k: int, p: float, seed: int) -> None:
    rng = random.Random(seed)
    counters = SpecCounters(k)
    for _ in range(60):
        tokens = rng.randint(50, 400)
        d = draw(tokens, k, p, rng)
        # the steps emit at least the tokens asked for, and at most K more
        emitted = d.verify_ct + d.accepted
        assert tokens <= emitted < tokens + k + 1
        assert d.proposed == d.verify_ct * k
        assert sum(d.histogram) == d.verify_ct
        assert sum(i * n for i, n in enumerate(d.histogram)) == d.accepted
        counters.add(d, tokens)
    rate, length = expected(k, p)
    assert abs(counters.accepted / counters.draft_tokens - rate) < 0.05
    assert abs(1 + counters.accepted / counters.drafts - length) < 0.15
    # position i is accepted no more often than position i-1 (a prefix is accepted)
    assert all(a >= b for a, b in zip(counters.per_pos, counters.per_pos[1:], strict=False))


def test_expected_rates_at_the_ends() -> None:
    assert expected(4, 0.0) == (0.0, 1.0)
    assert expected(4, 1.0) == (1.0, 5.0)
