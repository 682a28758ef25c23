"""A real headless Chromium driven through the DevTools protocol, for the report's tests.

Chromium comes from Debian's packages (scripts/browser.sh, run by scripts/test.sh). The browser is
started with a fresh profile and no network features; the page is loaded from a file:// URL and every
console message, exception and failed load is recorded.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise AssertionError("chromium is not installed: run scripts/browser.sh (scripts/test.sh does)")
    return found


@dataclass
class Page:
    """What a page did while it loaded, and how it looks."""

    errors: list[str] = field(default_factory=list)
    screenshot: bytes = b""
    values: dict[str, Any] = field(default_factory=dict)


class Browser:
    def __init__(self, width: int = 1280, height: int = 2000) -> None:
        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="jobgen-chromium-"))
        self.proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.port = self._port()
        self._id = 0

    def _port(self) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.proc.poll() is not None:
                raise AssertionError(f"chromium exited with {self.proc.returncode} before it listened")
            time.sleep(0.1)
        raise AssertionError("chromium did not open its DevTools port within 30 s")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def load(self, path: Path, expressions: dict[str, str], width: int | None = None) -> Page:
        """Open the file, wait for its load event, evaluate `expressions` (name -> JS), take a screenshot.
        `width`: the viewport's width for this page (default: the browser's)."""
        import websocket

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as answer:
            target = next(t for t in json.load(answer) if t["type"] == "page")
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        page = Page()
        try:
            for method in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
                self._call(ws, page, method)
            self._call(
                ws,
                page,
                "Emulation.setDeviceMetricsOverride",
                width=width or self.width,
                height=self.height,
                deviceScaleFactor=1,
                mobile=False,
            )
            # Enabling the domains replays what an earlier page of this tab logged: only this page's count.
            page.errors.clear()
            self._call(ws, page, "Page.navigate", url=path.resolve().as_uri())
            self._wait(ws, page, "Page.loadEventFired")
            for name, expression in expressions.items():
                answer = self._call(ws, page, "Runtime.evaluate", expression=expression, returnByValue=True)
                page.values[name] = answer["result"].get("value")
            shot = self._call(ws, page, "Page.captureScreenshot", format="png")
            page.screenshot = base64.b64decode(shot["data"])
        finally:
            ws.close()
        return page

    def _call(self, ws: Any, page: Page, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]
            self._note(page, message)

    def _wait(self, ws: Any, page: Page, event: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(ws.recv())
            self._note(page, message)
            if message.get("method") == event:
                return
        raise AssertionError(f"no {event} within {timeout} s")

    @staticmethod
    def _note(page: Page, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
            page.errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            page.errors.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            page.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Network.loadingFailed":
            page.errors.append(f"load failed: {params.get('errorText')}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if not url.startswith(("file:", "data:", "about:")):
                page.errors.append(f"network request: {url}")
