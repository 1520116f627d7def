"""prepare's evaluation split (``holdout``): held out, never generated, the same whatever mix."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.cli import main
from draftdata.prepare.samples import sample_config, write_sample_sources
from draftdata.prepare.stage import hold_out, prepare
from draftdata.records import parse_prompt
from draftdata.store.prompts import iter_prompt_lines


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("samples")
    write_sample_sources(d)
    return d


def _ids(paths: list[Path]) -> list[str]:
    return [parse_prompt(raw, "x").id for p in paths for _, raw in iter_prompt_lines(p)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=4),
    n=st.integers(0, 12),
    seed=st.integers(0, 5),
)
def test_the_split_takes_n_per_domain_and_leaves_half(
    sizes: list[list[int]], n: int, seed: int
) -> None:
    names = ["code", "math", "general", "tool"]
    runs = [bytearray(s) for s in sizes]
    held = hold_out(seed, runs, names, n)
    assert held == hold_out(seed, runs, names, n)  # seeded
    for d in range(4):
        usable = sum(r.count(d) for r in runs)
        got = sum(1 for r, h in zip(runs, held, strict=True) for i in h if r[i] == d)
        assert got == min(n, usable // 2)


def test_held_out_prompts_are_never_generated_and_do_not_depend_on_the_mix(
    samples: Path, tmp_path: Path
) -> None:
    base = sample_config(samples, tmp_path / "a")
    cfg = msgspec.structs.replace(base, holdout=3)
    a = prepare(cfg)
    held_a = _ids(sorted((tmp_path / "a" / "eval").glob("prompts-*.jsonl")))
    assert held_a and a.report["holdout"]["prompts"] == len(held_a)
    assert not set(held_a) & set(_ids(a.shards))
    per = a.report["holdout"]["by_domain"]
    assert all(1 <= v <= 3 for v in per.values())
    # another mix and budget: the same split, still never among the prompts
    mix = {"code": 0.1, "math": 0.6, "general": 0.1, "tool": 0.1, "agent": 0.1}
    other = msgspec.structs.replace(cfg, out=str(tmp_path / "b"), mix=mix, budget=40)
    b = prepare(other)
    held_b = _ids(sorted((tmp_path / "b" / "eval").glob("prompts-*.jsonl")))
    assert held_b == held_a
    assert not set(held_b) & set(_ids(b.shards))
    # the same inputs and seed: byte-identical split
    again = prepare(msgspec.structs.replace(cfg, out=str(tmp_path / "c")))
    assert (tmp_path / "c" / "eval" / "prompts-00000.jsonl").read_bytes() == (
        tmp_path / "a" / "eval" / "prompts-00000.jsonl"
    ).read_bytes()
    assert again.report["holdout"] == a.report["holdout"]


def _main(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code in (0, None)


def test_cli_holdout_and_a_mix_from_a_suggested_mix_file(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "q.yaml"
    cfg = sample_config(samples, tmp_path / "out")
    config.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    suggested = tmp_path / "suggested_mix.json"
    mix = {"code": 0.1, "general": 0.2, "math": 0.5, "tool": 0.1, "agent": 0.1}
    suggested.write_text(json.dumps({"format": "draftdata.suggested_mix/1", "mix": mix}))
    _main(["prepare", str(config), "--holdout", "2", "--mix", str(suggested)])
    out = capsys.readouterr().out
    assert "held out" in out and "eval" in out
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    assert report["mix"] == dict(sorted(mix.items()))
    assert report["holdout"]["per_domain"] == 2
    # --force replaces the split with the rest of prepare's outputs
    _main(["prepare", str(config), "--force", "--mix", "code=0.5,math=0.5"])
    assert not list((tmp_path / "out" / "eval").glob("prompts-*.jsonl"))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("not json", "not JSON"),
        ('{"mix": {}}', "holds no mix"),
        ('{"mix": {"code": "a lot"}}', "is not a number"),
        ('{"code": -1}', "finite and >= 0"),
    ],
)
def test_a_bad_mix_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, why: str
) -> None:
    f = tmp_path / f"mix-{random.randrange(1 << 30)}.json"
    f.write_text(content)
    with pytest.raises(SystemExit) as done:
        main(["merge", "--add", str(tmp_path), "--mix", str(f), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 1 and len(err) == 1 and why in err[0], err
