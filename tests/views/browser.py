"""A tiny headless-Chromium driver over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

No pip package, no chromedriver, no download: Debian's ``chromium`` is started with the network cut
(an unreachable proxy, every host name unresolvable, ``Network.emulateNetworkConditions`` offline),
the page is opened from a ``file://`` path, and every request, console message and uncaught exception
is recorded. Tests call :func:`chromium_or_skip` first: without chromium they skip with the reason.

    with Browser() as b:
        b.open(path)                 # waits for the load event
        b.eval("1 + 1")              # Runtime.evaluate, the value returned
        b.hover(x, y); b.click(x, y, shift=True)
        b.screenshot()               # PNG bytes
        b.errors, b.requests         # console errors / exceptions, URLs other than the page and data:
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
TIMEOUT_S = 60.0


def chromium_path() -> str | None:
    """The Chromium binary (``ANCHORLENS_CHROMIUM`` first), or None when none is installed."""
    for path in (os.environ.get("ANCHORLENS_CHROMIUM"), *CANDIDATES, shutil.which("chromium")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def chromium_or_skip() -> str:
    """The Chromium binary; pytest.skip naming the fix when none is installed."""
    import pytest

    path = chromium_path()
    if path is None:
        pytest.skip("no headless Chromium (apt-get install chromium, or set ANCHORLENS_CHROMIUM)")
    return path


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe; the network is cut."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width, self.height = width, height
        self.errors: list[str] = []  # console errors, uncaught exceptions, failed loads
        self.requests: list[str] = []  # every request URL the page made
        self.page_url = ""
        self._id = 0
        self._buffer = b""
        self._events: list[dict] = []

    # process -------------------------------------------------------------------------------------
    def __enter__(self) -> Browser:
        binary = chromium_path()
        if binary is None:
            raise RuntimeError("no Chromium installed")
        self._profile = tempfile.mkdtemp(prefix="anchorlens-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # the child reads commands on fd 3 and writes replies on fd 4
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [
            binary,
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--proxy-server=127.0.0.1:9",  # nothing listens there: any request that leaves fails
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={self._profile}",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        self._proc = subprocess.Popen(
            args,
            close_fds=False,  # fds 3 and 4 are made in preexec_fn; Python's own fds are close-on-exec anyway
            preexec_fn=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable", session=True)
        self.send(
            "Network.emulateNetworkConditions",
            session=True,
            offline=True,
            latency=0,
            downloadThroughput=0,
            uploadThroughput=0,
        )
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.send("Browser.close")
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self._profile, ignore_errors=True)

    # protocol ------------------------------------------------------------------------------------
    def send(self, method: str, session: bool = False, **params: Any) -> dict:
        """Send one command and wait for its reply (events on the way are recorded); RuntimeError on error."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise RuntimeError("Chromium did not answer")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the pipe")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def _event(self, event: dict) -> None:
        method, params = event.get("method", ""), event.get("params", {})
        self._events.append(event)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(
                "exception: " + str(details.get("exception", {}).get("description", details.get("text")))
            )
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append("log: " + params["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            self.errors.append("load failed: " + params.get("errorText", ""))

    def wait_event(self, method: str, timeout: float = TIMEOUT_S) -> dict:
        """The first recorded (or next) event named ``method``."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method:
                    return self._events.pop(i)
            self._event(self._read(deadline))

    # page ----------------------------------------------------------------------------------------
    def open(self, path: str | Path) -> None:
        """Load a local HTML file and wait for its load event (and one more animation frame)."""
        self.page_url = Path(path).resolve().as_uri()
        self._events.clear()
        self.send("Page.navigate", session=True, url=self.page_url)
        self.wait_event("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))", wait=True)

    @property
    def outside_requests(self) -> list[str]:
        """Requests for anything but the page itself and inline data: URLs."""
        return [u for u in self.requests if u != self.page_url and not u.startswith(("data:", "blob:"))]

    def eval(self, expression: str, wait: bool = True) -> Any:
        """The JSON value of ``expression`` in the page (awaited when it is a promise); RuntimeError on a throw."""
        result = self.send(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=wait
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def rect(self, selector: str) -> dict:
        """{x, y, width, height} (viewport pixels) of the first element matching ``selector`` (its first line box, for
        text that wraps), scrolled into view."""
        found = self.eval(
            f"(() => {{const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center', inline: 'center'}); const r = e.getClientRects()[0] || e.getBoundingClientRect();"
            " return {x: r.x, y: r.y, width: r.width, height: r.height};})()"
        )
        if found is None:
            raise LookupError(f"no element matches {selector!r}")
        return found

    def _mouse(self, kind: str, x: float, y: float, shift: bool = False, **extra: Any) -> None:
        self.send("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, modifiers=8 if shift else 0, **extra)

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to viewport (x, y)."""
        self._mouse("mouseMoved", x, y)
        self.eval("new Promise(r => requestAnimationFrame(() => setTimeout(r, 20)))")

    def click(self, x: float, y: float, shift: bool = False) -> None:
        """A left click at viewport (x, y), with shift held when asked."""
        self._mouse("mouseMoved", x, y, shift)
        self._mouse("mousePressed", x, y, shift, button="left", clickCount=1)
        self._mouse("mouseReleased", x, y, shift, button="left", clickCount=1)
        self.eval("new Promise(r => requestAnimationFrame(() => setTimeout(r, 20)))")

    def center(self, selector: str) -> tuple[float, float]:
        """Viewport centre of the first element matching ``selector``."""
        r = self.rect(selector)
        return r["x"] + r["width"] / 2, r["y"] + r["height"] / 2

    def screenshot(self) -> bytes:
        """PNG of the viewport."""
        return base64.b64decode(self.send("Page.captureScreenshot", session=True, format="png")["data"])
