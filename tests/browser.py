"""Open a page in headless Chromium over the DevTools protocol: console errors, what shows, a screenshot.

A few dozen lines of CDP over websocket-client rather than a browser-automation package: the
system Chromium is enough, and nothing tries to download a browser. The flags keep Chromium off
the network (no sync, updates, QUIC or first-run fetches); the browser runs in its own process
group, which is all that is ever signalled.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket

from llmload.process_group import start_in_group, stop_group

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")  # fmt: skip
PAGE_STATE = """({
  title: document.title,
  text: document.body.innerText,
  images: Array.from(document.images).map(i => ({alt: i.alt,
    complete: i.complete, width: i.naturalWidth, height: i.naturalHeight, shown: i.getBoundingClientRect().width})),
  page_width: document.documentElement.scrollWidth,
  viewport_width: window.innerWidth,
  tables: Array.from(document.querySelectorAll("table")).map(t => ({
    right: t.getBoundingClientRect().right,
    row_heights: Array.from(t.rows).map(r => r.getBoundingClientRect().height)})),
})"""


@dataclass
class PageReport:
    title: str
    text: str  # what a reader sees (innerText)
    images: list[dict[str, Any]]  # alt, complete, natural width/height, shown width (CSS px)
    errors: list[str]  # console errors, uncaught exceptions, refused loads (CSP, missing files)
    screenshot: Path | None
    page_width: int = 0  # the document's width (CSS px): wider than the viewport scrolls sideways
    viewport_width: int = 0
    tables: list[dict[str, Any]] = field(default_factory=list)  # each table's right edge and row heights (CSS px)


class _Cdp:
    """One DevTools websocket: calls answered by id, events kept for later."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._ws = websocket.create_connection(url, timeout=timeout_s, suppress_origin=True)
        self._timeout_s = timeout_s
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for(self, method: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout_s:g} s")
            self.events.append(json.loads(self._ws.recv()))

    def drain(self, seconds: float) -> None:
        """Collect what arrives in the next `seconds` (late console messages)."""
        self._ws.settimeout(seconds)
        with contextlib.suppress(websocket.WebSocketTimeoutException):
            while True:
                self.events.append(json.loads(self._ws.recv()))
        self._ws.settimeout(self._timeout_s)

    def close(self) -> None:
        self._ws.close()


def _errors(events: list[dict[str, Any]]) -> list[str]:
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
    return errors


@contextlib.contextmanager
def _chromium(timeout_s: float) -> Iterator[str]:
    """A fresh headless Chromium; yields the websocket URL of its page."""
    with tempfile.TemporaryDirectory(prefix="llmload-chromium-") as profile:
        command = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"]
        proc = start_in_group(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # helpers too
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + timeout_s
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not open its DevTools port (exit code {proc.poll()})")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout_s) as response:
                targets = json.load(response)
            yield next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        finally:
            stop_group(proc, timeout_s=5)


def inspect_page(
    page: Path | str, *, screenshot: Path | None = None, width: int = 1280, timeout_s: float = 30, settle_s: float = 0.5
) -> PageReport:
    """Load a local file (a Path) or a URL, let it settle, and report what it shows and every error it logged."""
    with _chromium(timeout_s) as ws_url:
        cdp = _Cdp(ws_url, timeout_s)
        try:
            for domain in ("Runtime", "Log", "Page"):
                cdp.call(f"{domain}.enable")
            cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
            url = page.resolve().as_uri() if isinstance(page, Path) else page
            navigated = cdp.call("Page.navigate", url=url)
            cdp.wait_for("Page.loadEventFired", timeout_s)
            cdp.drain(settle_s)
            state = cdp.call("Runtime.evaluate", expression=PAGE_STATE, returnByValue=True)["result"]["value"]
            if screenshot is not None:
                size = cdp.call("Page.getLayoutMetrics")["cssContentSize"]
                clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
                shot = cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            errors = _errors(cdp.events)
            if navigated.get("errorText"):
                errors.insert(0, f"navigation: {navigated['errorText']}")
        finally:
            cdp.close()
    return PageReport(
        state["title"], state["text"], state["images"], errors, screenshot, state["page_width"],
        state["viewport_width"], state["tables"],
    )  # fmt: skip
