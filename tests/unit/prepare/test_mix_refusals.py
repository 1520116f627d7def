"""prepare refuses what would quietly give the user another mix than the one asked for.

- a ``mix`` key that is no domain (``kode``): refused in one line wherever the mix comes from
  (the config's ``mix:``, ``--mix`` spelt out, ``--mix`` a suggested_mix.json), as ``merge
  --mix`` refuses it, and nothing is written;
- a source whose rows are all rejected (a wrong ``schema:``): an error naming the source and
  the schema its rows read as, nothing written; a source that reads is never refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from draftdata.cli import main
from draftdata.errors import ConfigError, InputError
from draftdata.prepare.config import SCHEMAS, PrepareConfig
from draftdata.prepare.samples import SAMPLE_FILES, sample_config, write_sample_sources
from draftdata.prepare.stage import prepare
from draftdata.shared.domains import DOMAINS

_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=2, max_size=10).filter(
    lambda s: s not in DOMAINS and s != "other"
)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("samples")
    write_sample_sources(folder)
    return folder


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    code = exit_.value.code
    return (0 if code is None else int(code)), capsys.readouterr().err


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example runs the CLI twice
)
@given(
    wrong=_NAMES,
    share=st.floats(0.01, 0.9),
    given_as=st.sampled_from(["config", "flag", "file"]),
    plan_only=st.booleans(),
)
def test_a_mix_key_that_is_no_domain_is_refused_wherever_the_mix_comes_from(
    samples: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    wrong: str,
    share: float,
    given_as: str,
    plan_only: bool,
) -> None:
    work = tmp_path_factory.mktemp("kode")
    out = work / "out"
    mix = {wrong: share, "math": 0.3, "general": 0.3}
    cfg = sample_config(samples, out)
    if given_as == "config":
        cfg = msgspec.structs.replace(cfg, mix=mix)
    config = work / "prep.yaml"
    config.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    argv = ["prepare", str(config)] + (["--plan-only"] if plan_only else [])
    if given_as == "flag":
        argv += ["--mix", ",".join(f"{k}={v}" for k, v in mix.items())]
    elif given_as == "file":
        (work / "suggested_mix.json").write_text(json.dumps({"mix": mix}))
        argv += ["--mix", str(work / "suggested_mix.json")]
    code, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and repr(wrong) in lines[0] and "code" in lines[0]
    assert not out.exists() or not any(out.iterdir())
    # merge refuses the same name
    data = work / "rows.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code, err = _run(["merge", "--existing", str(data), "--mix", argv[-1] if given_as != "config"
                      else ",".join(f"{k}={v}" for k, v in mix.items()),
                      "--out", str(work / "m")], capsys)  # fmt: skip
    assert code == 1 and f"domain {wrong};" in err, err


def test_a_fixed_domain_or_an_existing_label_is_a_domain(samples: Path, tmp_path: Path) -> None:
    cfg = sample_config(samples, tmp_path / "out")
    fixed = [msgspec.structs.replace(s, domain="legal") for s in cfg.sources[:1]]
    cfg = msgspec.structs.replace(
        cfg, sources=fixed + cfg.sources[1:], mix={"legal": 0.5, "math": 0.5}
    )
    plan = prepare(cfg, plan_only=True).plan
    assert {r.domain for r in plan.domains if r.new} >= {"legal", "math"}


def _single(samples: Path, out: Path, true: str, schema: str) -> PrepareConfig:
    cfg = sample_config(samples, out)
    source = next(s for s in cfg.sources if s.name == true)
    return msgspec.structs.replace(
        cfg,
        sources=[msgspec.structs.replace(source, schema=schema, domain="auto")],
        mix={},
        budget=None,
    )


@pytest.mark.parametrize("true", sorted(SAMPLE_FILES))
@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_source_that_yields_nothing_is_an_error_naming_the_likely_schema(
    samples: Path, tmp_path_factory: pytest.TempPathFactory, true: str, schema: str
) -> None:
    out = tmp_path_factory.mktemp("p") / "out"
    cfg = _single(samples, out, true, schema)
    try:
        result = prepare(cfg)
    except InputError as exc:
        line = str(exc)
        assert "\n" not in line and f"source {true}" in line and "all " in line
        assert f"schema {schema}" in line
        # the schema it names reads the rows: with it the same source yields prompts
        named = line.rsplit("`schema: ", 1)[1].rstrip("`")
        assert named in SCHEMAS and named != schema
        again = prepare(_single(samples, out.parent / "again", true, named))
        assert again.report["totals"]["usable"] > 0
        assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
        return
    # a source that is not refused gave prompts
    assert result.report["sources"][0]["usable"] > 0


def test_codefeedback_rows_under_the_webinstruct_schema_name_codefeedback(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _single(samples, tmp_path / "out", "codefeedback", "webinstruct")
    config = tmp_path / "prep.yaml"
    config.write_bytes(msgspec.yaml.encode(msgspec.to_builtins(cfg)))
    code, err = _run(["prepare", str(config), "-q"], capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "source codefeedback" in lines[0] and "`schema: codefeedback`" in lines[0], err
    assert not (tmp_path / "out").exists()  # nothing left (no rejects.jsonl to block a rerun)


def test_the_true_schema_is_among_the_fitting_ones(samples: Path) -> None:
    from draftdata.prepare.adapters import fitting_schemas
    from draftdata.prepare.load import iter_rows

    for source in write_sample_sources(samples):
        rows = [r for _, r in iter_rows(source)][:20]
        assert source.schema in fitting_schemas(rows, "last_assistant", 32_000), source.name


def test_shares_are_checked_in_one_place_for_every_stage() -> None:
    from draftdata.merge.config import MergeConfig, check_config
    from draftdata.prepare.config import check
    from draftdata.shared.mix import check_shares, mix_from_json, parse_mix

    bad = [{"code": -1.0}, {"code": 0.0, "math": 0.0}, {"code": float("nan")}]
    for mix in bad:
        with pytest.raises(ConfigError):
            check_shares(mix, "--mix")
        with pytest.raises(ConfigError):
            check_config(MergeConfig(existing=["x"], mix=mix))
        with pytest.raises(ConfigError):
            check(PrepareConfig(sources=sample_config(Path("."), Path("o")).sources, mix=mix))
        with pytest.raises(ConfigError):
            mix_from_json({"mix": mix}, "--mix f.json")
        with pytest.raises(ConfigError):
            parse_mix(",".join(f"{k}={v}" for k, v in mix.items()))
