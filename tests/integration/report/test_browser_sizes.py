"""The report at the sizes a reader sees it: a laptop (1280 px wide) and a phone (390 px).

A headless chromium (the DevTools client of ``test_browser.py``) lays out the page of a big
job: seven domains, seven mix series with long names, six-figure token counts, tens of
thousands of tokens per second. At each width:

- the page never scrolls sideways (wide tables scroll inside their own box), and every figure
  lies inside the viewport;
- every legend is HTML under its figure, its text at least 12 px and inside the viewport;
- the smallest text inside each figure, as the browser shows it (its size in the PNG times the
  scale the image is shown at), is at least 8 px;
- nothing is clipped: no figure has a drawn pixel on its outer frame;
- numbers carry thousands separators, in the cards and the tables (``65,293``; a rate of
  53,997 tokens/s has no ``.0``), and in every text drawn into a figure.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.integration.report.test_browser import FLAGS, Cdp, _chromium, _devtools_port

from draftdata.records import Completion, Message, Turn, Usage
from draftdata.report import build_report
from draftdata.report.build import render_report
from draftdata.report.collect import collect
from draftdata.store.run import Run

pytestmark = [pytest.mark.integration, pytest.mark.browser]

DOMAINS = {
    "code": 65_293,
    "math": 48_112,
    "general": 31_007,
    "tool": 12_450,
    "agent": 98_765,
    "translation-and-summarisation": 23_456,
    "unknown": 4_321,
}
WIDTHS = (1280, 390)
MIN_TEXT_PX = 8.0
MIN_LEGEND_PX = 12.0

PAGE_JS = """(async () => {
  const vw = window.innerWidth;
  const frame = async (img) => {
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d'); g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let inked = 0;
    for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
      if (x > 1 && x < c.width - 2 && y > 1 && y < c.height - 2) continue;
      const i = 4 * (y * c.width + x);
      if (d[i] < 235 || d[i + 1] < 235 || d[i + 2] < 235) inked++;
    }
    return inked;
  };
  const imgs = [];
  for (const img of document.querySelectorAll('img.plot')) {
    const r = img.getBoundingClientRect();
    imgs.push({id: img.id, shown: img.clientWidth, natural: img.naturalWidth,
               textPx: parseFloat(img.dataset.textPx), left: r.left, right: r.right,
               inked: await frame(img)});
  }
  const legends = Array.from(document.querySelectorAll('.legend li')).map(li => {
    const r = li.getBoundingClientRect();
    return {text: li.textContent, font: parseFloat(getComputedStyle(li).fontSize),
            left: r.left, right: r.right, figure: li.closest('figure').querySelector('img').id};
  });
  const cells = Array.from(document.querySelectorAll('td, .card .v')).map(e => e.textContent);
  return JSON.stringify({vw, scroll: document.documentElement.scrollWidth, imgs, legends, cells});
})()"""


def _completion(i: int, domain: str, tokens: int) -> Completion:
    usage = Usage(prompt_tokens=200, completion_tokens=tokens)
    return Completion(
        id=f"{domain}-{i}",
        source=f"source-{domain}",
        domain=domain,
        messages=[Message(role="user", content=f"question {i} about {domain}")],
        turns=[Turn(content=f"answer {i}", finish_reason="stop", usage=usage)],
        usage=usage,
        endpoint=f"http://gpu-node-{i % 8:02d}.cluster.internal:30000",
        created=1000.0 + i,
    )


def _big_job(root: Path) -> tuple[Path, Path, Path]:
    """A run, a merge output and a saved ``stats --json`` of the live set, all big."""
    run = root / "expansion_v1"
    with Run.open(str(run), settings={"model": "Qwen3.6-27B"}, writer_id="w1") as r:
        for domain, tokens in DOMAINS.items():
            for i in range(3):
                r.add_completion(_completion(i, domain, tokens + 7 * i))
        r.flush()
        total = sum(3 * t + 21 for t in DOMAINS.values())
        for t in (1, 2):
            r.write_metrics(
                {
                    "format": "draftdata.metrics/1",
                    "time": 1000.0 + 10 * t,
                    "elapsed_s": 10.0 * t,
                    "final": t == 2,
                    "summary": {
                        "completed": 21,
                        "failed": 0,
                        "output_tokens": total,
                        "wall_s": total / 53_997.0,
                        "endpoints": {
                            f"http://gpu-node-{k:02d}.cluster.internal:30000": {
                                "completed": 3,
                                "output_tokens": total // 8,
                                "errors": 0,
                            }
                            for k in range(8)
                        },
                    },
                }
            )
    counts = {d: 1_000 + 17 * n // 100 for d, n in DOMAINS.items()}
    merged = root / "train_v2"
    (merged / "train").mkdir(parents=True)
    from tests.unit.stats import builders as b

    b.conversations_parquet(merged / "train" / "part-00000.parquet", {"code": 3, "math": 3})
    report = {
        "format": "draftdata.merge-report",
        "version": 1,
        "target": {d: 1 / len(DOMAINS) for d in DOMAINS},
        "before": counts,
        "after": {
            "train": {d: n // 2 for d, n in counts.items()},
            "eval": dict.fromkeys(DOMAINS, 12),
        },
        "inputs": [
            {"path": "s3://bucket/completions/", "role": "existing", "by_domain": counts},
            {"path": str(run), "role": "add", "by_domain": dict.fromkeys(DOMAINS, 3)},
        ],
        "dropped": {"duplicate_id": 12_345, "over_target": 67_890},
    }
    (merged / "merge_report.json").write_text(json.dumps(report))
    before = root / "before.json"
    live = root / "live.jsonl"
    rows = []
    for d, n in DOMAINS.items():
        for i in range(n // 10_000 + 1):
            rows.append(
                {
                    "id": f"live-{d}-{i}",
                    "domain": d,
                    "conversations": [
                        {"role": "user", "content": f"q {i}"},
                        {"role": "assistant", "content": "a" * (n // 10)},
                    ],
                }
            )
    live.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from draftdata.stats import compute_stats

    before.write_text(json.dumps(compute_stats(str(live))))
    return run, merged, before


async def _measure(report: Path, tmp_path: Path) -> dict[int, dict[str, Any]]:
    chromium = _chromium()
    profile = tmp_path / "profile"
    log = tmp_path / "chromium.log"
    with log.open("wb") as log_fh:
        proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=log_fh,
        )
    out: dict[int, dict[str, Any]] = {}
    try:
        port = await _devtools_port(proc, profile, log)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                cdp = Cdp(ws)
                for domain in ("Page", "Runtime"):
                    await cdp.call(f"{domain}.enable")
                for width in WIDTHS:
                    await cdp.call(
                        "Emulation.setDeviceMetricsOverride",
                        width=width,
                        height=900,
                        deviceScaleFactor=1,
                        mobile=width < 600,
                    )
                    await cdp.load(report.as_uri())
                    r = await cdp.call(
                        "Runtime.evaluate",
                        expression=PAGE_JS,
                        awaitPromise=True,
                        returnByValue=True,
                    )
                    assert "exceptionDetails" not in r, r
                    out[width] = json.loads(r["result"]["value"])
                await cdp.call("Browser.close")
    finally:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
    return out


_BARE = re.compile(r"(?<![\d,.])\d{4,}(?![\d,])")  # 4+ digits with no separator


def _numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[\d,.%\s]+(s|min|h)?", text.strip())) and any(
        c.isdigit() for c in text
    )


def test_the_report_reads_at_a_laptop_and_a_phone_width(tmp_path: Path) -> None:
    run, merged, before = _big_job(tmp_path / "job")
    inputs = [str(run), str(merged), str(before)]
    report = build_report(*inputs, out=tmp_path / "report.html")
    measured = asyncio.run(_measure(report, tmp_path))

    for width, m in measured.items():
        assert m["vw"] == width
        assert m["scroll"] <= width, f"{width}px: the page scrolls sideways ({m['scroll']}px)"
        assert len(m["imgs"]) >= 5
        for img in m["imgs"]:
            assert img["left"] >= 0 and img["right"] <= width + 0.5, (width, img)
            shown = img["textPx"] * img["shown"] / img["natural"]
            assert shown >= MIN_TEXT_PX, f"{width}px: {img['id']} text {shown:.1f}px"
            assert img["inked"] == 0, f"{width}px: {img['id']} is cut at its edge"
        mix = [li for li in m["legends"] if li["figure"] == "plot-domain-mix"]
        assert len(mix) >= 6, m["legends"]
        for li in m["legends"]:
            assert li["font"] >= MIN_LEGEND_PX, (width, li)
            assert li["left"] >= 0 and li["right"] <= width + 0.5, (width, li)
        numbers = [c for c in m["cells"] if _numeric(c)]
        assert numbers and not [c for c in numbers if _BARE.search(c)], numbers
        assert not [c for c in numbers if re.search(r"\d,\d{3}\.\d", c)], numbers  # 53,997.0

    cells = measured[WIDTHS[0]]["cells"]
    assert "65,293" in " ".join(cells) or "195,900" in " ".join(cells), cells
    # what is drawn into the figures carries separators too
    data = collect(inputs)
    page = render_report(data)
    assert 'id="legend-domain-mix"' in page
    from draftdata.report import plots

    drawn = plots.grouped_bars("t", "t", {"a": {"x": 65_293.0}}, "tokens")
    assert drawn is not None and "65,293" in drawn.texts
    boxes = plots.length_boxes(
        "b",
        "b",
        {
            "agent": {
                "count": 3,
                "p5": 9e4,
                "p25": 9.5e4,
                "p50": 98_765,
                "p75": 1e5,
                "p95": 1.2e5,
                "mean": 98_770,
            }
        },
        "tokens",
    )
    assert boxes is not None and not [t for t in boxes.texts if _BARE.search(t)], boxes.texts
