"""A newcomer's first mistakes cost one line and leave nothing behind (issue 23).

- ``--prompts`` on a file in another schema (SpecForge or ShareGPT ``conversations``, Alpaca,
  question/answer, arbitrary objects, not even JSON): one line naming the count, the reason,
  what the rows look like and the ``prepare`` config that converts them; exit 1; no request
  sent, no ``--out`` folder made. Generated over random files of each kind; the conversion the
  line names really works.
- A file whose first lines hold a prompt runs, and its bad lines are summarised on the console
  (the first few, then counts by reason), never one line per row.
- The first command against a wrong URL (404s) records nothing: the same command against the
  right endpoint then just runs, with the model that endpoint serves.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.generate.helpers import completions, fast_config, write_prompts

from draftdata.cli import main
from draftdata.errors import FleetUnavailableError, InputError
from draftdata.generate.prompts.rejects import SAMPLE, SHOWN
from draftdata.generate.stage import generate
from draftdata.sim.run import SimConfig, SimFleet
from draftdata.store.read import read_manifest

pytestmark = pytest.mark.integration
SIM = SimConfig(time_scale=0.0, mean_output_tokens=30, output_sigma=0.3)

text = st.text(alphabet=string.ascii_letters + " .?", min_size=1, max_size=40).filter(str.strip)


def _turns(speaker: str, said: str, roles: tuple[str, str]) -> st.SearchStrategy[Any]:
    pair = st.tuples(text, text).map(
        lambda qa: [{speaker: roles[0], said: qa[0]}, {speaker: roles[1], said: qa[1]}]
    )
    return st.lists(pair, min_size=1, max_size=3).map(lambda ps: [t for p in ps for t in p])


# (strategy of one row, the schema the line must name, or None)
KINDS: dict[str, tuple[st.SearchStrategy[Any], str | None]] = {
    "specforge": (
        st.fixed_dictionaries(
            {"id": text, "conversations": _turns("role", "content", ("user", "assistant"))}
        ),
        "openai",
    ),
    "sharegpt": (
        st.fixed_dictionaries(
            {"id": text, "conversations": _turns("from", "value", ("human", "gpt"))}
        ),
        "sharegpt",
    ),
    "alpaca": (
        st.fixed_dictionaries({"instruction": text, "input": text, "output": text}),
        "alpaca",
    ),
    "question_answer": (
        st.fixed_dictionaries({"question": text, "answer": text}),
        "question_answer",
    ),
    "query_response": (st.fixed_dictionaries({"query": text, "response": text}), "query_response"),
    "other": (
        st.dictionaries(
            st.sampled_from(["text", "prompt", "label", "meta", "score"]), text, min_size=1
        ),
        None,
    ),
}


def write_rows(path: Path, rows: list[Any], junk: list[str]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        for line in junk:
            f.write(line + "\n")


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), kind=st.sampled_from(sorted(KINDS)), n=st.integers(1, 150))
def test_a_file_in_another_schema_stops_in_one_line_and_claims_nothing(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, kind: str, n: int
) -> None:
    tmp = tmp_path_factory.mktemp("schema")
    strategy, schema = KINDS[kind]
    rows = data.draw(st.lists(strategy, min_size=n, max_size=n))
    junk = data.draw(st.lists(st.sampled_from(["not json", "{", "[1, 2]", '"x"']), max_size=2))
    write_rows(tmp / "rows.jsonl", rows, junk)
    with SimFleet(1, SIM) as fleet:
        with pytest.raises(InputError) as err:
            generate(fast_config(tmp / "rows.jsonl", tmp / "run", fleet.urls))
        assert fleet.stats(0).requests == 0
    line = str(err.value)
    assert "\n" not in line and "nothing was recorded" in line
    assert f"none of the first {min(SAMPLE, n + len(junk))} lines is a prompt" in line
    assert "draftdata prepare" in line
    if schema is not None:
        assert f"schema: {schema}," in line
    assert not (tmp / "run").exists()


def test_the_conversion_the_line_names_works(tmp_path: Path) -> None:
    rows = [
        {"id": f"s{i}", "conversations": [{"from": "human", "value": f"Q {i}?"}]} for i in range(40)
    ]
    write_rows(tmp_path / "sg.jsonl", rows, [])
    with SimFleet(1, SIM) as fleet:
        with pytest.raises(InputError) as err:
            generate(fast_config(tmp_path / "sg.jsonl", tmp_path / "run", fleet.urls))
        config = re.search(r"CONFIG holding `(sources: .*?)`", str(err.value))
        assert config is not None
        (tmp_path / "conv.yaml").write_text(config.group(1) + "\n", encoding="utf-8")
        with pytest.raises(SystemExit) as exit_:
            main(["prepare", str(tmp_path / "conv.yaml"), "--out", str(tmp_path / "prompts")])
        assert exit_.value.code in (0, None)
        summary = generate(fast_config(tmp_path / "prompts", tmp_path / "run", fleet.urls))
    assert summary.completed == 40


def test_bad_lines_among_prompts_are_summarised_not_listed(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 3)
    bad = [{"id": f"b{i}", "conversations": [{"role": "user", "content": "x"}]} for i in range(90)]
    bad += [{"id": f"r{i}", "messages": [{"role": "gpt", "content": "x"}]} for i in range(40)]
    with prompts.open("a", encoding="utf-8") as f:
        for row in bad:
            f.write(json.dumps(row) + "\n")
        f.write("not json\n")
    lines: list[str] = []
    with SimFleet(1, SIM) as fleet:
        summary = generate(
            fast_config(prompts, tmp_path / "run", fleet.urls), log=lambda x: lines.append(x)
        )
    assert summary.completed == 3 and summary.invalid_prompts == 131
    shown = [x for x in lines if x.startswith("generate: invalid prompt line ")]
    assert len(shown) == SHOWN
    assert sum("more invalid prompt lines" in x for x in lines) == 1
    (total,) = [x for x in lines if "invalid prompt lines skipped" in x]
    assert total.startswith("generate: 131 invalid prompt lines skipped (")
    assert "missing required field `messages` 90" in total
    assert "is not one of" in total and " 40" in total and "rejects/" in total
    assert len(lines) < 20  # never one line per row
    written = (tmp_path / "run" / "rejects").iterdir()
    (listing,) = list(written)
    assert len(listing.read_text(encoding="utf-8").splitlines()) == 131


def test_a_wrong_url_records_nothing_and_the_right_one_just_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 10)
    out = tmp_path / "run"
    with SimFleet(1, SIM) as fleet:
        wrong = fleet.urls[0].rstrip("/") + "/api"  # answers 404 to everything
        with pytest.raises(FleetUnavailableError, match="HTTP 404"):
            generate(fast_config(prompts, out, [wrong]))
        kept = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        assert all(k.startswith("lease/") for k in kept), kept  # a released lease, no run
        argv = ["generate", "-p", str(prompts), "-o", str(out), "--progress", "off"]
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "-e", fleet.urls[0]])
        err = capsys.readouterr().err
    assert exit_.value.code in (0, None), err
    assert {c.id for c in completions(out)} == set(ids)
    assert read_manifest(str(out))["settings"]["model"] == SIM.model


def test_a_run_an_older_draftdata_opened_against_a_wrong_url_takes_the_right_model(
    tmp_path: Path,
) -> None:
    """An older draftdata recorded the run (model 'default', nothing answered) at its first
    start; with no completion in it, the right fleet's model is taken, recorded as a change."""
    from draftdata.generate.preflight import run_settings
    from draftdata.generate.prompts.source import scan
    from draftdata.store.run import Run

    prompts = tmp_path / "p.jsonl"
    ids = write_prompts(prompts, 6)
    out = tmp_path / "run"
    lines: list[str] = []
    with SimFleet(1, SIM) as fleet:
        config = fast_config(prompts, out, fleet.urls)
        found = scan([prompts], limit=None, partition=None)
        Run.open(str(out), settings=run_settings(config, found, "default").to_json()).close()
        summary = generate(config, log=lines.append)
    assert summary.completed == 6 and {c.id for c in completions(out)} == set(ids)
    (changed,) = [x for x in lines if "settings changed" in x]
    assert f'(model: "default" -> "{SIM.model}")' in changed
