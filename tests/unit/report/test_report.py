"""report: finding parts, headline numbers, sections, self-containment, the CLI."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tests.unit.report.fixtures import PLOT_IDS, demo_dir, merged_dir
from tests.unit.stats import builders as b

from draftdata.errors import InputError
from draftdata.report import build_report
from draftdata.report.collect import collect
from draftdata.report.find import find_parts


class _Page(HTMLParser):
    """Every src/href and the ids of the plot images of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.plots: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        a = dict(attrs)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "img" and "plot" in (a.get("class") or ""):
            self.plots.append((a.get("id") or "").removeprefix("plot-"))


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text())
    return p


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A demo-like folder and its report (built once for the module)."""
    root = demo_dir(tmp_path_factory.mktemp("report") / "demo")
    return root, build_report(root, out=root.parent / "sub" / "r.html")


def test_find_parts_of_a_demo_folder(tmp_path: Path) -> None:
    root = demo_dir(tmp_path / "demo")
    parts = find_parts(str(root))
    assert parts.runs == (str(root / "run"),)
    assert parts.merged == (str(root / "merged"),)
    assert parts.tokenized == (str(root / "tokenized"),)
    assert parts.prompts == (str(root / "prompts"),)
    assert parts.datasets == ()
    # tokenize's output is also known by its summary.json, whatever the folder's name
    tok = b.tokenized_parquet(tmp_path / "other" / "samples-x" / "part-0.parquet").parent
    summary = {"format": "draftdata.tokenize-summary/1"}
    (tok / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "other" / "summary.json").write_text(json.dumps({"format": "something else"}))
    assert find_parts(str(tmp_path / "other")).tokenized == (str(tok),)
    # a run's own folders are never taken for datasets; a plain file is a dataset
    assert find_parts(str(root / "run")).runs == (str(root / "run"),)
    f = b.write_jsonl(tmp_path / "x.jsonl", b.specforge_rows())
    assert find_parts(str(f)).datasets == (str(f),)
    with pytest.raises(InputError, match="no such file"):
        find_parts(str(tmp_path / "missing"))


def test_headline_numbers(demo: tuple[Path, Path]) -> None:
    data = collect([str(demo[0])])
    h = data.headline()
    assert h["completions"] == 7 and h["failures"] == 2 and h["prompts"] == 9
    assert h["output_tokens"] == 830
    assert h["wall_s"] == 20.0 and h["output_tokens_per_s"] == pytest.approx(41.5)
    assert h["endpoints"] == 2
    assert h["train_rows"] == 8 and h["eval_rows"] == 1 and h["dropped"] == 84
    assert h["tokenized_samples"] == 3 and h["training_tokens"] == 35
    assert h["prepared_prompts"] == 6
    assert data.finish_reasons() == {"stop": 6, "length": 1}
    assert data.finish_by_domain()["math"] == {"length": 1, "stop": 1}
    assert data.failures_by_reason() == {"context_length": 1, "exhausted_retries": 1}
    # e1 commits 300 tokens per 10 s snapshot interval, e2 100
    assert data.throughput() == {
        "http://e1": [(5.0, 30.0), (15.0, 30.0)],
        "http://e2": [(5.0, 10.0), (15.0, 10.0)],
    }


def test_demo_report_has_every_plot_and_no_external_link(demo: tuple[Path, Path]) -> None:
    out = demo[1]
    page = _parse(out)
    assert set(page.plots) == PLOT_IDS
    assert page.links and all(link.startswith("data:") for link in page.links)
    assert "script" not in page.tags
    text = out.read_text()
    assert "merge_report.json" in text  # the mix came from the merge report
    for label in ("before (merge inputs)", "target", "after: train", "after: eval"):
        assert label in text
    # finish reasons per domain: math has one of its two turns cut by max tokens
    assert "<tr><td>math</td><td>2</td><td>50.0%</td><td>50.0%</td></tr>" in text
    assert not list(out.parent.glob(".r.html.*"))  # no temp file left


def test_run_only_report_without_metrics_says_so(tmp_path: Path) -> None:
    run = b.run_dir(tmp_path / "run", with_metrics=False)
    out = build_report(run, out=tmp_path / "r.html")
    page = _parse(out)
    assert "throughput" not in page.plots
    assert {"domain-mix", "output-length", "finish-reasons", "failures"} <= set(page.plots)
    assert "no metrics snapshots" in out.read_text()


def test_merged_without_report_uses_compared_inputs(tmp_path: Path) -> None:
    merged = merged_dir(tmp_path / "merged", report=None)
    (merged / "merge_report.json").write_text("{}")  # unreadable shape: ignored
    before = b.write_jsonl(tmp_path / "existing.jsonl", b.specforge_rows())
    data = collect([str(merged), str(before)])
    assert [u for u, _ in data.compare] == [str(before)]
    out = build_report(merged, before, out=tmp_path / "r.html")
    page = _parse(out)
    text = out.read_text()
    assert "existing.jsonl (conversations)" in text and "merged (conversations)" in text
    # no run: finish reasons, failures and throughput are notes, not empty charts
    assert set(page.plots) == {
        "domain-mix",
        "domain-mix-tokens",
        "output-length",
        "tokens-per-domain",
    }
    assert text.count("no generate run in the inputs") == 3


def test_report_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from draftdata.cli import app

    root = merged_dir(tmp_path / "merged")
    out = tmp_path / "report.html"
    r = CliRunner().invoke(app, ["report", str(root), "--out", str(out), "--title", "Demo X"])
    assert r.exit_code == 0, r.output
    assert "report: wrote" in r.stdout and "<title>Demo X</title>" in out.read_text()
    # --compare takes several datasets, repeated or after one flag
    a = b.write_jsonl(tmp_path / "a.jsonl", b.specforge_rows())
    c = b.write_jsonl(tmp_path / "c.jsonl", b.specforge_rows()[:2])
    both = tmp_path / "both.html"
    args = ["report", str(root), "--out", str(both), "--compare", str(a), str(c)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "a.jsonl" in both.read_text() and "c.jsonl" in both.read_text()
    bad = CliRunner().invoke(app, ["report", str(root), "--out", "s3://b/r.html"])
    assert bad.exit_code != 0 and isinstance(bad.exception, InputError)


def test_conversations_stopped_early_are_counted(tmp_path: Path) -> None:
    """Completions the stop rule ended early show up by reason in stats and the report."""
    import msgspec

    from draftdata.records import Message
    from draftdata.stats.compute import compute_stats
    from draftdata.store.run import Run

    run = Run.open(str(tmp_path / "run"), settings={"model": "test"}, writer_id="w1")
    with run:
        for i, reason in enumerate(["length", "tool_mismatch", "length", None]):
            c = b.completion(i, "math", finish="length" if reason == "length" else "stop")
            two_turns = [*c.messages, Message(role="assistant", content="a"), *c.messages]
            run.add_completion(msgspec.structs.replace(c, messages=two_turns, stop_reason=reason))
        run.flush()
    stats = compute_stats(str(tmp_path / "run"))
    assert stats["stopped"] == {"length": 2, "tool_mismatch": 1}
    assert collect([str(tmp_path / "run")]).stopped() == {"length": 2, "tool_mismatch": 1}
    text = build_report(tmp_path / "run", out=tmp_path / "r.html").read_text()
    assert "<th>conversation stopped early by</th>" in text
    assert "<tr><td>length</td><td>2</td></tr>" in text
