"""merge end to end on local folders: determinism, mix, dedup, formats, split, HF loading."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.merge.helpers import (
    chat_rows,
    file_hashes,
    run_dir,
    token_samples,
    write_jsonl,
)

from draftdata.errors import AlreadyExistsError, ConfigError, InputError
from draftdata.merge.config import MergeConfig
from draftdata.merge.stage import merge
from draftdata.store.merge_report import read_report

MIX = {"code": 0.35, "math": 0.2, "general": 0.3, "tool": 0.1, "agent": 0.05}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An existing tokenized set at 77% code and a balanced expansion (3 shards)."""
    root = tmp_path_factory.mktemp("inputs")
    existing = token_samples(
        root / "existing", {"code": 3850, "math": 300, "general": 850}, prefix="e"
    )
    added = token_samples(
        root / "added",
        {"code": 200, "math": 700, "general": 600, "tool": 350, "agent": 150},
        prefix="a",
        seed=1,
        shards=3,
        content_from=100_000,
    )
    return existing, added


def _config(existing: Path, added: Path, out: Path, **kw: Any) -> MergeConfig:
    base: dict[str, Any] = {
        "existing": [str(existing)],
        "add": [str(added)],
        "mix": MIX,
        "out": str(out),
        "eval_fraction": 0.05,
        "shard_rows": 700,
        "allow_drop": True,  # the expansion's agent rows bound the mix: most code is dropped
    }
    base.update(kw)
    return MergeConfig(**base)


def _rows(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in sorted(folder.glob("*.parquet")):
        out.extend(pq.read_table(p).to_pylist())
    return out


def test_same_inputs_and_seed_give_byte_identical_output(
    skewed: tuple[Path, Path], tmp_path: Path
) -> None:
    a = merge(_config(*skewed, tmp_path / "a", seed=7))
    merge(_config(*skewed, tmp_path / "b", seed=7))
    # many small buckets must give the same global order as one big one
    merge(_config(*skewed, tmp_path / "c", seed=7, bucket_bytes=4096))
    ha, hb, hc = (file_hashes(tmp_path / n) for n in "abc")
    assert len([k for k in ha if k.startswith("train/")]) >= 3
    assert ha == hb == hc
    merge(_config(*skewed, tmp_path / "d", seed=8))
    hd = file_hashes(tmp_path / "d")
    assert hd["train/part-00000.parquet"] != ha["train/part-00000.parquet"]
    train = _rows(tmp_path / "a" / "train")
    assert len(train) == a.train_rows
    assert [r["id"] for r in train] != sorted(r["id"] for r in train)  # shuffled


def test_mix_lands_within_one_point_and_the_report_has_the_agreed_shape(
    skewed: tuple[Path, Path], tmp_path: Path
) -> None:
    s = merge(_config(*skewed, tmp_path / "out", mix_by="rows"))
    report = json.loads((tmp_path / "out" / "merge_report.json").read_text())
    assert report == msgspec.to_builtins(s.report)  # the file is the typed record
    assert read_report((tmp_path / "out" / "merge_report.json").read_bytes(), "report") == s.report
    for key in ("format", "version", "target", "before", "after", "inputs", "dropped", "seed"):
        assert key in report
    assert report["format"] == "draftdata.merge-report" and report["version"] == 1
    assert set(report["after"]) == {"train", "eval"}
    assert report["inputs"][0]["by_domain"] == {"code": 3850, "general": 850, "math": 300}
    assert report["before"]["code"] == 4050 and report["reachable"]
    # the train split really holds that mix: count the written rows
    rows = _rows(tmp_path / "out" / "train")
    total = len(rows)
    assert total == s.train_rows
    for domain, share in MIX.items():
        got = sum(1 for r in rows if r["domain"] == domain) / total
        assert abs(got - share) <= 0.01, (domain, got)
    assert report["dropped"]["over_target"] > 0
    # agent (its 150 rows less those set aside for eval, at 5% +- 0.5 point) bounds the train
    assert "agent" in report["limited_by"]
    agent = 150 - report["plan"]["eval"]["rows"]["agent"]
    assert agent / 0.055 <= total <= agent / 0.045 + 1


def test_eval_split_has_the_requested_size_and_no_row_in_both(
    skewed: tuple[Path, Path], tmp_path: Path
) -> None:
    s = merge(_config(*skewed, tmp_path / "out", eval_fraction=0.1))
    # of the unique rows a plan on every row keeps (the split is taken before the train plan)
    held = s.report.plan.eval
    assert s.eval_rows == round(0.1 * held.of_rows) == sum(held.rows.values())
    train = {r["id"] for r in _rows(tmp_path / "out" / "train")}
    evals = {r["id"] for r in _rows(tmp_path / "out" / "eval")}
    assert len(evals) == s.eval_rows and not train & evals


def test_a_mix_domain_left_without_rows_by_dedup_is_reported_with_the_closest_mix(
    tmp_path: Path,
) -> None:
    """The inputs hold tool rows, but every one repeats an existing row's content: the mix
    cannot be reached; the other domains keep their ratios and the report says why."""
    existing = token_samples(
        tmp_path / "ex", {"code": 300, "math": 100, "general": 100}, prefix="e"
    )
    copies = token_samples(tmp_path / "dup", {"tool": 40}, prefix="d", content_from=0)
    mix = {"code": 0.35, "math": 0.2, "general": 0.3, "tool": 0.15}
    for mix_by in ("rows", "tokens"):
        s = merge(
            MergeConfig(
                existing=[str(existing)],
                add=[str(copies)],
                mix=mix,
                out=str(tmp_path / mix_by),
                tolerance=0.01,
                mix_by=mix_by,
                allow_drop=True,
            )
        )
        assert not s.reachable
        assert s.report.missing == ["tool"]
        msg = s.message or ""
        assert msg.startswith("cannot reach the mix") and "tool (target 15.0%)" in msg
        # the closest mix keeps code:math:general at 35:20:30 (in the mix's unit)
        achieved = s.report.achieved
        assert achieved["code"] == pytest.approx(35 / 85, abs=0.0101)
        assert achieved["math"] == pytest.approx(20 / 85, abs=0.0101)


def test_dedup_across_inputs_by_id_and_by_content(tmp_path: Path) -> None:
    existing = token_samples(tmp_path / "ex", {"code": 100, "math": 100}, prefix="x")
    # same ids, other contents: dropped as duplicate ids
    same_ids = token_samples(tmp_path / "ids", {"code": 30}, prefix="x", content_from=5000)
    # other ids, same contents as existing rows 0..39: dropped as duplicate contents
    same_text = token_samples(tmp_path / "txt", {"math": 40}, prefix="y", content_from=0)
    s = merge(
        MergeConfig(
            existing=[str(existing)],
            add=[str(same_ids), str(same_text)],
            out=str(tmp_path / "o"),
            eval_fraction=0,
        )
    )
    assert s.report.dropped["duplicate_id"] == 30
    assert s.report.dropped["duplicate_content"] == 40
    rows = _rows(tmp_path / "o" / "train")
    assert len(rows) == 200 and len({r["id"] for r in rows}) == 200
    assert all(r["id"].startswith("x") for r in rows)  # the existing copies won
    assert len({tuple(r["input_ids"]) for r in rows}) == 200
    dups = [i.duplicates for i in s.report.inputs]
    assert dups[1] == {"duplicate_id": 30, "duplicate_content": 0}
    assert dups[2] == {"duplicate_id": 0, "duplicate_content": 40}
    # unrelated id spaces: only content dedup
    kept = merge(
        MergeConfig(
            existing=[str(existing)],
            add=[str(same_ids), str(same_text)],
            out=str(tmp_path / "o2"),
            eval_fraction=0,
            dedup_ids=False,
        )
    )
    assert kept.report.dropped["duplicate_id"] == 0
    assert kept.train_rows == 230


def test_chat_inputs_of_every_kind_merge_into_conversations(tmp_path: Path) -> None:
    specforge = write_jsonl(
        tmp_path / "sf" / "train.jsonl", chat_rows({"code": 20, "general": 20}, prefix="s")
    )
    sharegpt = write_jsonl(
        tmp_path / "sg.jsonl", chat_rows({"math": 15}, prefix="g", style="sharegpt")
    )
    prompts = write_jsonl(
        tmp_path / "prompts" / "prompts" / "part-00000.jsonl",
        [
            {"id": f"p{i}", "domain": "tool", "messages": [{"role": "user", "content": f"q {i}"}]}
            for i in range(10)
        ],
    )
    run = run_dir(str(tmp_path / "run"), {"math": 12}, prefix="r")
    s = merge(
        MergeConfig(
            existing=[str(specforge.parent)],
            add=[str(sharegpt), str(prompts.parent.parent), run],
            out=str(tmp_path / "o"),
            eval_fraction=0,
            format="sharegpt",
        )
    )
    by_input = [i.by_domain for i in s.report.inputs]
    assert by_input == [{"code": 20, "general": 20}, {"math": 15}, {"tool": 10}, {"math": 12}]
    assert [i.kind for i in s.report.inputs] == ["conversations"] * 2 + ["prompts", "run"]
    assert s.report.data == "conversations"
    rows = _rows(tmp_path / "o" / "train")
    assert len(rows) == 77
    by_id = {r["id"]: r for r in rows}
    assert by_id["g0"]["domain"] == "math"
    assert by_id["g0"]["conversations"][0]["role"] == "user"  # ShareGPT roles mapped
    assert by_id["r0"]["conversations"][-1]["reasoning_content"] == "hmm"  # the run's turn
    lines = [
        json.loads(line)
        for p in sorted((tmp_path / "o" / "sharegpt").glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    assert [ln["id"] for ln in lines] == [r["id"] for r in rows]
    assert lines[0]["conversations"][0].keys() >= {"role", "content"}


def test_hf_datasets_loads_the_output(skewed: tuple[Path, Path], tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    s = merge(_config(*skewed, tmp_path / "out"))
    out = str(tmp_path / "out")
    cache = str(tmp_path / "hf")
    by_dir = datasets.load_dataset("parquet", data_dir=out, cache_dir=cache)
    assert by_dir["train"].num_rows == s.train_rows
    assert set(by_dir["train"].column_names) >= {"id", "domain", "input_ids", "loss_mask"}
    by_card = datasets.load_dataset(out, cache_dir=cache)
    assert sorted(by_card) == ["eval", "train"]
    assert by_card["eval"].num_rows == s.eval_rows
    assert by_card["train"][0]["id"] == _rows(tmp_path / "out" / "train")[0]["id"]


def test_hf_datasets_loads_chat_output_beside_the_jsonl_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasets = pytest.importorskip("datasets")
    src = write_jsonl(tmp_path / "in.jsonl", chat_rows({"code": 30, "math": 30}, prefix="c"))
    s = merge(
        MergeConfig(
            existing=[str(src)], out=str(tmp_path / "o"), format="sharegpt", eval_fraction=0.1
        )
    )
    d = datasets.load_dataset(
        "parquet", data_dir=str(tmp_path / "o"), cache_dir=str(tmp_path / "hf")
    )
    assert d["train"].num_rows == s.train_rows == 54
    assert d["train"][0]["conversations"][0]["role"] == "user"
    # chat output is deterministic too, JSONL export included, with the classifier in 2
    # worker processes (9 chunks of 7 rows) as well as in this one
    import draftdata.merge.inputs

    monkeypatch.setattr(draftdata.merge.inputs, "_CHAT_CHUNK", 7)
    merge(
        MergeConfig(
            existing=[str(src)],
            out=str(tmp_path / "o2"),
            format="sharegpt",
            eval_fraction=0.1,
            workers=2,
        )
    )
    assert file_hashes(tmp_path / "o") == file_hashes(tmp_path / "o2")


def test_upsample_repeats_train_rows_only(tmp_path: Path) -> None:
    src = token_samples(tmp_path / "in", {"code": 800, "math": 100}, prefix="u")
    mix = {"code": 0.5, "math": 0.5}
    s = merge(
        MergeConfig(
            existing=[str(src)],
            mix=mix,
            out=str(tmp_path / "o"),
            upsample=True,
            max_repeat=3,
            tolerance=0,
            eval_fraction=0.05,
            mix_by="rows",
            allow_drop=True,
        )
    )
    train = _rows(tmp_path / "o" / "train")
    evals = _rows(tmp_path / "o" / "eval")
    # eval first: 5% of the 400 unique rows a plan on every row keeps (300 code, 100 math),
    # stratified; then the train split on the rest: 95 math rows x 3 against 285 code rows
    assert Counter(r["domain"] for r in evals) == {"code": 15, "math": 5}
    assert Counter(r["domain"] for r in train) == {"code": 285, "math": 285}
    copies = [r for r in train if "~r" in r["id"]]
    assert len(copies) == 190 and all(r["domain"] == "math" for r in copies)
    assert not any("~r" in r["id"] for r in evals)
    originals = {r["id"] for r in evals}
    assert not any(r["id"].split("~r")[0] in originals for r in copies)
    assert s.report.upsampled == {"math": 190}


def test_unnamed_domains_are_dropped_or_pooled_into_other(tmp_path: Path) -> None:
    src = token_samples(tmp_path / "in", {"code": 100, "math": 60, "general": 40}, prefix="o")
    dropped = merge(MergeConfig(existing=[str(src)], mix={"code": 1}, out=str(tmp_path / "a")))
    assert dropped.report.dropped["not_in_mix"] == 100
    assert set(dropped.report.after.train) == {"code"}
    pooled = merge(
        MergeConfig(
            existing=[str(src)],
            mix={"code": 0.5, "other": 0.5},
            out=str(tmp_path / "b"),
            tolerance=0,
            eval_fraction=0,
            mix_by="rows",
        )
    )
    after = pooled.report.after.train
    assert after["code"] == 100 and after.get("math", 0) + after.get("general", 0) == 100
    assert pooled.report.pooled_into_other == ["general", "math"]
    from draftdata.merge.report import mix_rows

    table = {r[0]: r for r in mix_rows(pooled.report)}
    assert table["other"][4:] == ["50.0%", "100", "0", "50.0%"]
    assert table["math"][4] == "(other)"


def test_refusals(skewed: tuple[Path, Path], tmp_path: Path) -> None:
    existing, added = skewed
    out = tmp_path / "full"
    out.mkdir()
    (out / "x.txt").write_text("keep me")
    with pytest.raises(AlreadyExistsError, match="not empty"):
        merge(_config(existing, added, out))
    assert (out / "x.txt").read_text() == "keep me"
    chat = write_jsonl(tmp_path / "c.jsonl", chat_rows({"code": 2}, prefix="c"))
    with pytest.raises(InputError, match="mix tokenized samples and chat rows"):
        merge(MergeConfig(existing=[str(existing)], add=[str(chat)], out=str(tmp_path / "m")))
    with pytest.raises(ConfigError, match="sharegpt"):
        merge(MergeConfig(existing=[str(existing)], format="sharegpt", out=str(tmp_path / "s")))
    with pytest.raises(ConfigError, match="at least one input"):
        merge(MergeConfig(out=str(tmp_path / "n")))
    assert not (tmp_path / "m").exists() and not (tmp_path / "s").exists()


def test_cli_prints_the_plan_and_the_mix_tables(
    skewed: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from draftdata.cli import main

    existing, added = skewed
    out = tmp_path / "cli"
    args = ["merge", "--existing", str(existing), "--add", str(added), "--out", str(out)]
    with pytest.raises(SystemExit) as ok:
        main([*args, "--mix", "code=0.4,math=0.3,general=0.3", "--seed", "3", "--allow-drop"])
    assert ok.value.code == 0
    text = capsys.readouterr().out
    # the plan comes first, then the result
    assert text.index("plan (loss tokens)") < text.index("domain mix in rows (before / target")
    assert "loss tokens (before / target / train; exact)" in text
    assert json.loads((out / "merge_report.json").read_text())["seed"] == 3
    with pytest.raises(SystemExit) as exc:
        main(["merge", "--existing", str(existing), "--out", str(out), "-q"])
    assert exc.value.code == 1
    assert "not empty" in capsys.readouterr().err


def test_nothing_to_keep_still_writes_a_loadable_empty_train_split(tmp_path: Path) -> None:
    src = token_samples(tmp_path / "in", {"code": 10}, prefix="z")
    same = token_samples(tmp_path / "dup", {"math": 10}, prefix="m", content_from=0)
    s = merge(
        MergeConfig(existing=[str(src)], add=[str(same)], mix={"math": 1}, out=str(tmp_path / "o"))
    )
    assert s.train_rows == 0 and s.report.message.startswith("cannot reach the mix")
    assert pq.read_table(tmp_path / "o" / "train" / "part-00000.parquet").num_rows == 0


def _jsonl(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for p in sorted(folder.glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]


@pytest.mark.parametrize("fmt", ["specforge", "openai", "modelopt", "eagle"])
def test_trainer_formats_of_chat_inputs(fmt: str, tmp_path: Path) -> None:
    """Every trainer format keeps id, source and domain; specforge writes one row per assistant
    turn, the history before it without earlier turns' reasoning."""
    multi = {
        "id": "mt",
        "source": "chat",
        "domain": "math",
        "conversations": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Add."},
            {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "Add again."},
        ],
    }
    lead = {
        "id": "lead",
        "domain": "general",
        "conversations": [
            {"role": "assistant", "content": "Welcome."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
        ],
    }
    src = write_jsonl(tmp_path / "in.jsonl", [multi, lead, *chat_rows({"code": 5}, prefix="c")])
    merge(MergeConfig(existing=[str(src)], out=str(tmp_path / "o"), format=fmt, eval_fraction=0))
    lines = _jsonl(tmp_path / "o" / fmt)
    by_id = {ln["id"]: ln for ln in lines}
    assert all(ln["domain"] for ln in lines)
    if fmt == "eagle":  # lead does not start with the user: EAGLE's scripts cannot read it
        assert len(lines) == 6 and "lead" not in by_id
        report = json.loads((tmp_path / "o" / "merge_report.json").read_text())
        assert report["jsonl_left_out"] == {"eagle": {"not_alternating": 1}}
    elif fmt != "specforge":
        assert len(lines) == 7
    if fmt != "specforge":
        assert by_id["mt"]["domain"] == "math"
        assert by_id["mt"]["source"] == "chat"
        return
    assert len(lines) == 8  # mt: 2 turns; lead: its leading assistant answers nothing
    assert by_id["mt#0"]["conversations"] == multi["conversations"][:2]
    assert by_id["mt#1"]["conversations"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        *multi["conversations"][2:],
    ]
    # a leading assistant message answers nothing: not a turn, not context (SpecForge's
    # parser drops it as well)
    assert [m["content"] for m in by_id["lead"]["conversations"]] == ["Hi", "Hello!"]
    assert by_id["mt#1"]["domain"] == "math"


def test_speculators_format_of_tokenized_inputs(skewed: tuple[Path, Path], tmp_path: Path) -> None:
    s = merge(_config(*skewed, tmp_path / "o", format="speculators"))
    rows = _rows(tmp_path / "o" / "train")
    lines = _jsonl(tmp_path / "o" / "speculators")
    assert len(lines) == s.train_rows + s.eval_rows
    first = {ln["id"]: ln for ln in lines}[rows[0]["id"]]
    assert first["input_ids"] == rows[0]["input_ids"]
    assert first["loss_mask"] == rows[0]["loss_mask"]
    assert (first["primary_id"], first["domain"]) == (rows[0]["id"], rows[0]["domain"])


def test_formats_refuse_the_other_kind_of_input(skewed: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--format specforge"):
        merge(_config(*skewed, tmp_path / "a", format="specforge"))
    src = write_jsonl(tmp_path / "in.jsonl", chat_rows({"code": 5}, prefix="c"))
    with pytest.raises(ConfigError, match="--format speculators"):
        merge(MergeConfig(existing=[str(src)], out=str(tmp_path / "b"), format="speculators"))


def test_merge_specforge_rows_of_a_run_equal_exports(tmp_path: Path) -> None:
    """Merging a run with --format specforge writes the rows export writes (one per turn, the
    same history), whatever order the shuffle puts them in."""
    from tests.unit.export.test_trainers import _records, _run

    from draftdata.export.stage import export_run

    run = _run(tmp_path, _records())
    export_run(run, "specforge", tmp_path / "sf.jsonl")
    exported = [json.loads(x) for x in (tmp_path / "sf.jsonl").read_text().splitlines()]
    merge(MergeConfig(existing=[run], out=str(tmp_path / "o"), format="specforge", eval_fraction=0))
    merged = _jsonl(tmp_path / "o" / "specforge")
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(merged, key=key) == sorted(exported, key=key)


def test_protect_refuses_an_overlapping_output_before_any_write(tmp_path: Path) -> None:
    from draftdata.cli import main
    from draftdata.errors import ProtectedPrefixError

    chat = write_jsonl(tmp_path / "c.jsonl", chat_rows({"code": 3, "math": 2}, prefix="c"))
    live = tmp_path / "live"
    live.mkdir()
    (live / "keep.txt").write_text("live data")
    for out, how in ((live, "equals"), (live / "v2", "lies inside"), (tmp_path, "contains")):
        with pytest.raises(ProtectedPrefixError, match=how):
            merge(MergeConfig(add=[str(chat)], out=str(out), protect=[str(live)]))
    assert [p.name for p in live.iterdir()] == ["keep.txt"]
    with pytest.raises(SystemExit) as info:
        main(["merge", "--add", str(chat), "--out", str(live / "m"), "--protect", str(live)])
    assert info.value.code == 1
    done = merge(MergeConfig(add=[str(chat)], out=str(tmp_path / "live_v2"), protect=[str(live)]))
    assert done.train_rows + done.eval_rows == 5


_ROLES = st.sampled_from(["system", "user", "assistant", "tool"])


@settings(max_examples=25, deadline=None)
@given(
    convs=st.lists(
        st.tuples(st.lists(_ROLES, min_size=1, max_size=6), st.booleans()), min_size=1, max_size=8
    )
)
def test_eagle_jsonl_holds_only_rows_its_scripts_read(
    convs: list[tuple[list[str], bool]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Random speaker sequences (system, tool results, tools, any order) through
    ``merge --format eagle``: every JSONL row alternates human/gpt from the human (what EAGLE's
    scripts assert), and every merged row is either there or counted under the reason
    ``eagle_problem`` gives it."""
    from draftdata.records import Message
    from draftdata.shared.trainer_rows import eagle_problem

    tmp = tmp_path_factory.mktemp("eagle")
    rows, want = [], Counter[str]()
    for i, (roles, tools) in enumerate(convs):
        conv = [
            {"role": r, "content": f"{r} {k} of row {i} about sorting lists in python"}
            | ({"tool_call_id": f"c{k}"} if r == "tool" else {})
            for k, r in enumerate(roles)
        ]
        tool_list = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        rows.append(
            {"id": f"r{i}", "domain": "code", "conversations": conv}
            | ({"tools": tool_list} if tools else {})
        )
        why = eagle_problem(
            [Message(role=r, content="x") for r in roles], tool_list if tools else None
        )
        if why:
            want[why] += 1
    src = write_jsonl(tmp / "in.jsonl", rows)
    s = merge(MergeConfig(existing=[str(src)], out=str(tmp / "o"), format="eagle", eval_fraction=0))
    lines = _jsonl(tmp / "o" / "eagle")
    for ln in lines:
        speakers = [t["from"] for t in ln["conversations"]]
        assert speakers == ["human", "gpt"] * (len(speakers) // 2) + ["human"] * (len(speakers) % 2)
    left = (s.report.jsonl_left_out or {}).get("eagle", {})
    assert len(lines) + sum(left.values()) == s.train_rows
    assert Counter(left) == want
