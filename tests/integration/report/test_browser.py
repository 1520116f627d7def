"""The report opened in a real headless chromium, driven over the DevTools protocol.

Proves, on a demo-like output (run + merge output + tokenized set): every plot decodes (natural
size > 0), the page makes no request other than file:/data:, a full-page screenshot is taken,
and there is no console error or uncaught exception. The same session shows the checks can
fail: a page with a broken image is caught, and a console.error is seen.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.unit.report.fixtures import PLOT_IDS, demo_dir

from draftdata.report import build_report

pytestmark = [pytest.mark.integration, pytest.mark.browser]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1100,1400",
]

IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
  id: i.id, w: i.naturalWidth, h: i.naturalHeight, complete: i.complete,
  scheme: i.src.split(':')[0]})))"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    reason = "chromium not installed (apt-get install -y chromium); report browser test skipped"
    print(reason, file=sys.stderr)
    pytest.skip(reason)


class Cdp:
    """A minimal DevTools protocol client: commands by id, events kept in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._id = 0

    async def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        mine = self._id
        await self.ws.send_json({"id": mine, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), deadline - time.monotonic())
            if msg.get("id") == mine:
                assert "error" not in msg, f"{method}: {msg['error']}"
                result: dict[str, Any] = msg.get("result", {})
                return result
            if "method" in msg:
                self.events.append(msg)

    async def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                self.events.remove(e)
                return e
        deadline = time.monotonic() + timeout
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), deadline - time.monotonic())
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)

    async def evaluate(self, expression: str) -> Any:
        r = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    async def load(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and failed loads so far."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value")) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:300])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", ""))
            elif m == "Network.loadingFailed":
                out.append("load failed: " + p.get("errorText", ""))
        return out

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


async def _devtools_port(proc: subprocess.Popen[bytes], profile: Path, log: Path) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"chromium exited {proc.returncode}: {log.read_text()[-2000:]}")
        if marker.exists():
            first = marker.read_text().split("\n", 1)[0].strip()
            if first.isdigit():
                return int(first)
        await asyncio.sleep(0.1)
    pytest.fail(f"chromium did not open its DevTools port: {log.read_text()[-2000:]}")


async def test_report_renders_every_plot_without_console_errors(tmp_path: Path) -> None:
    chromium = _chromium()
    report = build_report(demo_dir(tmp_path / "demo"), out=tmp_path / "report.html")
    profile = tmp_path / "profile"
    log = tmp_path / "chromium.log"
    with log.open("wb") as log_fh:
        proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=log_fh,
        )
    try:
        port = await _devtools_port(proc, profile, log)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                cdp = Cdp(ws)
                for domain in ("Page", "Runtime", "Log", "Network"):
                    await cdp.call(f"{domain}.enable")
                await cdp.load(report.as_uri())
                images = json.loads(await cdp.evaluate(IMAGES_JS))
                expected = int(
                    await cdp.evaluate(
                        "document.querySelector('meta[name=draftdata-plots]').content"
                    )
                )
                shot = await cdp.call(
                    "Page.captureScreenshot", format="png", captureBeyondViewport=True
                )
                png = base64.b64decode(shot["data"])
                (tmp_path / "screenshot.png").write_bytes(png)
                page_errors = cdp.errors()
                requests = cdp.requests()

                # the checks can fail: a broken image and a console.error are both caught
                broken = tmp_path / "broken.html"
                broken.write_text(
                    '<img id="bad" src="data:image/png;base64,AAAA">'
                    "<script>console.error('probe')</script>"
                )
                await cdp.load(broken.as_uri())
                bad = json.loads(await cdp.evaluate(IMAGES_JS))
                probe_errors = cdp.errors()[len(page_errors) :]
                await cdp.call("Browser.close")
    finally:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)

    ids = {i["id"].removeprefix("plot-") for i in images}
    assert ids == PLOT_IDS and len(images) == expected == len(PLOT_IDS)
    for img in images:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img
        assert img["scheme"] == "data", img
    assert page_errors == [], page_errors
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    w, h = _png_size(png)
    assert w >= 800 and h > 1400, (w, h)  # the full page, beyond the 1400 px viewport
    assert bad == [{"id": "bad", "w": 0, "h": 0, "complete": True, "scheme": "data"}]
    assert any("probe" in e for e in probe_errors), probe_errors
