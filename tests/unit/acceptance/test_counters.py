"""Reading speculative counts from each engine's own shape, and the suggested mix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.acceptance.measure import Job, chunks
from draftdata.shared.speculation import SpecCounts, from_sglang, from_vllm_metrics, suggest_mix

VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 360.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 40.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_vllm_counters_are_summed_over_engines_and_ordered_by_position() -> None:
    c = from_vllm_metrics(VLLM_METRICS)
    assert c is not None
    assert (c.drafts, c.draft_tokens, c.accepted) == (120.0, 360.0, 150.0)
    assert c.per_position == [80.0, 40.0, 30.0]
    assert c.acceptance_rate == pytest.approx(150 / 360)
    assert c.mean_accept_length == pytest.approx(1 + 150 / 120)
    assert c.position_rates() == pytest.approx([80 / 120, 40 / 120, 30 / 120])


def test_a_server_without_spec_counters_reads_as_none() -> None:
    assert from_vllm_metrics('vllm:num_requests_running{engine="0"} 3.0\n') is None


def test_a_difference_of_readings_is_what_accrued() -> None:
    before = SpecCounts(drafts=10, draft_tokens=30, accepted=12, per_position=[6, 4, 2])
    after = SpecCounts(drafts=25, draft_tokens=75, accepted=33, per_position=[14, 11, 8])
    d = after.minus(before)
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position) == (15, 45, 21, [8, 7, 6])


def test_sglang_details_per_choice_and_the_histogram_gives_positions() -> None:
    one = {
        "spec_verify_ct": 10,
        "spec_num_proposed_drafts": 30,
        "spec_num_correct_drafts": 14,
        # steps that accepted exactly 0, 1, 2, 3 drafts
        "spec_correct_drafts_histogram": [2, 3, 3, 2],
    }
    c = from_sglang({"sglext": {"spec_tokens_details": one}})
    assert c is not None
    assert (c.drafts, c.draft_tokens, c.accepted) == (10, 30, 14)
    assert c.per_position == [8, 5, 2]  # accepted >= 1, >= 2, >= 3
    both = from_sglang({"sglext": {"spec_tokens_details": [one, one]}})
    assert both is not None and both.accepted == 28 and both.per_position == [16, 10, 4]
    assert from_sglang({"choices": []}) is None


@settings(max_examples=200, deadline=None)
@given(
    rates=st.dictionaries(
        st.sampled_from(["code", "math", "general", "tool", "agent", "other"]),
        st.floats(0.0, 1.0),
        min_size=1,
    ),
    floor=st.floats(0.0, 0.3),
)
def test_the_suggested_mix_sums_to_one_keeps_every_domain_and_favours_the_weak(
    rates: dict[str, float], floor: float
) -> None:
    mix = suggest_mix(dict(rates), floor)
    assert set(mix) == set(rates)
    assert sum(mix.values()) == pytest.approx(1.0, abs=1e-3)
    effective = min(floor, 1 / len(rates))
    assert all(s >= effective - 1e-3 for s in mix.values())
    # lower acceptance never gets a smaller share than higher acceptance
    for a in rates:
        for b in rates:
            if rates[a] < rates[b]:
                assert mix[a] >= mix[b] - 1e-3


@settings(max_examples=100, deadline=None)
@given(
    domains=st.lists(st.sampled_from(["code", "math", "tool"]), min_size=1, max_size=60),
    size=st.integers(1, 9),
)
def test_chunks_hold_one_domain_each_and_every_job_once(domains: list[str], size: int) -> None:
    jobs = [Job(f"p{i}", d, {}) for i, d in enumerate(domains)]
    out = chunks(jobs, size)
    assert all(len({j.domain for j in c}) == 1 and 1 <= len(c) <= size for c in out)
    flat = [j.id for c in out for j in c]
    assert sorted(flat) == sorted(j.id for j in jobs)
    for d in set(domains):  # each domain's prompts keep their order
        mine = [j.id for c in out for j in c if j.domain == d]
        assert mine == [j.id for j in jobs if j.domain == d]
