"""What the report's charts and tables say is true of the data.

- one colour per series on the whole page: a series the row-mix and the token-mix charts both
  draw has the same colour in both, whatever series each chart has (a generator over the merge
  report's parts and the compared datasets);
- the drafter's acceptance stands beside the subject's share of loss tokens (the report's first
  input), for every kind of subject;
- the throughput chart is the fleet's rate over honest intervals: an endpoint that decodes
  steadily while its answers end in bursts (an answer's tokens counted when it ends) draws a
  steady line at its true rate, no spikes and no zeros while it runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.report.fixtures import merged_dir
from tests.unit.stats import builders as b

from draftdata.report import build_report
from draftdata.report.collect import collect

DOMAINS = ("code", "math", "general", "tool")
_SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _legends(html: str) -> dict[str, dict[str, str]]:
    """figure id -> {series label: colour} from the page's HTML legends."""
    out: dict[str, dict[str, str]] = {}
    for pid, items in re.findall(r'<ul class="legend" id="legend-([^"]+)">(.*?)</ul>', html):
        found = re.findall(r'<li><i style="background:([^"]+)"></i>(.*?)</li>', items)
        out[pid] = {label: colour for colour, label in found}
    return out


def _report(before: dict[str, int], after: dict[str, int], roles: list[str]) -> dict[str, Any]:
    inputs = [
        {"path": f"in{i}", "role": role, "rows": sum(before.values()), "by_domain": before}
        for i, role in enumerate(roles)
    ]
    return {
        "format": "draftdata.merge-report",
        "version": 1,
        "mix_by": "loss_tokens",
        "target": {d: 1 / len(after) for d in after},
        "before": before,
        "after": {"train": after, "eval": {}},
        "inputs": inputs,
        "dropped": {},
        "tokens": {
            "method": "estimate",
            "before": {d: 10 * n for d, n in before.items()},
            "after": {"train": {d: 30 * n for d, n in after.items()}, "eval": {}},
        },
    }


@_SETTINGS
@given(
    before=st.dictionaries(st.sampled_from(DOMAINS), st.integers(1, 50), min_size=1),
    after=st.dictionaries(st.sampled_from(DOMAINS), st.integers(1, 50), min_size=1),
    roles=st.lists(st.sampled_from(["existing", "add"]), max_size=2),
    compare=st.booleans(),
)
def test_a_series_has_one_colour_in_every_chart(
    tmp_path_factory: pytest.TempPathFactory,
    before: dict[str, int],
    after: dict[str, int],
    roles: list[str],
    compare: bool,
) -> None:
    root = tmp_path_factory.mktemp("colours")
    merged = merged_dir(root / "merged", _report(before, after, roles))
    inputs = [str(merged)]
    if compare:
        rows = b.write_jsonl(root / "live.jsonl", b.specforge_rows())
        inputs.append(str(rows))
    page = build_report(*inputs, out=root / "r.html").read_text()
    legends = _legends(page)
    rows_chart, tokens_chart = legends.get("domain-mix", {}), legends.get("domain-mix-tokens", {})
    both = set(rows_chart) & set(tokens_chart)
    assert "target" in both, (rows_chart, tokens_chart)
    for label in both:
        assert rows_chart[label] == tokens_chart[label], (label, rows_chart, tokens_chart)


def _acceptance(folder: Path, rates: dict[str, float]) -> Path:
    from draftdata.shared.speculation import Acceptance, DomainAcceptance

    folder.mkdir(parents=True)
    doc = Acceptance(
        created="2026-01-01T00:00:00+00:00",
        model="m",
        endpoints=[],
        settings={},
        by_domain={d: DomainAcceptance(prompts=5, acceptance_rate=r) for d, r in rates.items()},
        total=DomainAcceptance(prompts=5 * len(rates), acceptance_rate=0.5),
    )
    (folder / "acceptance.json").write_bytes(msgspec.json.encode(doc))
    return folder


def _cells(html: str, header: str) -> dict[str, str]:
    """domain -> the cell under ``header`` in the acceptance table."""
    section = html[html.index("Draft acceptance per domain") :]
    table = section[section.index("<table") : section.index("</table>")]
    heads = re.findall(r"<th>(.*?)</th>", table)
    col = heads.index(header)
    out = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]:
        cells = re.findall(r"<td>(.*?)</td>", row)
        out[cells[0]] = cells[col]
    return out


@pytest.mark.parametrize("subject", ["run", "merged"])
def test_acceptance_stands_beside_the_subjects_share(tmp_path: Path, subject: str) -> None:
    run = b.run_dir(tmp_path / "run")
    merged = merged_dir(
        tmp_path / "merged",
        _report({"code": 40, "math": 5}, {"code": 3, "math": 9, "general": 1}, ["existing"]),
    )
    acc = _acceptance(tmp_path / "acc", {"code": 0.8, "math": 0.4, "general": 0.6})
    first, other = (run, merged) if subject == "run" else (merged, run)
    page = build_report(str(first), str(other), str(acc), out=tmp_path / "r.html").read_text()
    data = collect([str(first), str(other)])
    if subject == "run":
        want = data.runs[0].stats.domain_loss_token_shares()
        header = "loss-token share: run (run)"
    else:
        after = {"code": 3 * 30, "math": 9 * 30, "general": 30}
        want = {d: n / sum(after.values()) for d, n in after.items()}
        header = "loss-token share: merged (merged)"
    cells = _cells(page, header)
    for d, share in want.items():
        if d in cells:
            assert cells[d] == f"{100 * share:.1f}%", (d, cells, want)


@_SETTINGS
@given(
    slots=st.integers(2, 12),
    answer_s=st.floats(5.0, 60.0),
    tokens=st.integers(200, 4000),
    answers=st.integers(6, 12),
)
def test_throughput_is_the_steady_rate_not_bursts_of_ended_answers(
    tmp_path_factory: pytest.TempPathFactory,
    slots: int,
    answer_s: float,
    tokens: int,
    answers: int,
) -> None:
    """One endpoint, ``slots`` requests at a time, each answering ``tokens`` in ``answer_s``
    seconds, back to back, the slots staggered: it decodes at slots * tokens / answer_s all
    along. The snapshots tick every second with the cumulative tokens of the answers ended."""
    from draftdata.records import Completion, Message, Turn, Usage
    from draftdata.store.run import Run

    root = tmp_path_factory.mktemp("tput")
    t0 = 1_800_000_000.0
    url = "http://e1"
    ends: list[float] = []
    with Run.open(str(root / "run"), settings={}, writer_id="w") as run:
        for s in range(slots):
            offset = answer_s * s / slots
            for k in range(answers):
                end = t0 + offset + answer_s * (k + 1)
                if offset and k == answers - 1:
                    continue  # every slot ends before the last full round: a steady middle
                ends.append(end)
                run.add_completion(
                    Completion(
                        id=f"s{s}-{k}",
                        messages=[Message(role="user", content="q")],
                        turns=[Turn(content="a", usage=Usage(completion_tokens=tokens))],
                        usage=Usage(completion_tokens=tokens),
                        endpoint=url,
                        created=end,
                        latency_s=answer_s,
                    )
                )
        run.flush()
        last = max(ends)
        series = []
        for tick in range(int(last - t0) + 2):
            done = sum(tokens for e in ends if e <= t0 + tick)
            series.append([float(tick), 0, done, {url: done}])
        run.write_metrics(
            {"kind": "progress", "time": last + 1, "elapsed_s": last + 1 - t0, "series": series}
        )
    true = slots * tokens / answer_s
    points = collect([str(root / "run")]).runs[0].throughput[url]
    half = (points[1][0] - points[0][0]) / 2 if len(points) > 1 else 0.0
    # bins wholly inside the steady stretch (after every slot started, before any stopped)
    middle = [y for x, y in points if answer_s <= x - half and x + half <= (last - t0) - answer_s]
    assert middle, points
    for y in middle:
        assert 0.75 * true <= y <= 1.25 * true, (y, true, points)
    json.dumps(points)
