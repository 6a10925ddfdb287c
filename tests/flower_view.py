"""Flower as a user reaches it in tests: its HTTP API with basic auth, its pages in Chromium.

``Browser`` drives one headless Chromium over the DevTools protocol (a websocket, through
tornado's client: Flower brings tornado), so a test can type into a page's search box as a user
does, wait for the table to redraw and take the picture.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tornado.websocket import WebSocketClientConnection, websocket_connect

from tests.conftest import require

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")  # fmt: skip
# Virtual time Chromium gives a page's scripts (Flower's task table loads by XHR) before it
# takes the picture or dumps the DOM.
SETTLE_MS = 8000
DEVTOOLS_PORT_FILE = "DevToolsActivePort"  # Chromium writes its debugging port here
CDP_MESSAGE_BYTES = 64 * 1024 * 1024  # a full-page screenshot arrives as one base64 message
# Every Flower endpoint that would act on the fleet, with a body that would make it act.
ACTIONS = {
    "apply": ("/api/task/apply/{task}", {"args": []}),
    "async-apply": ("/api/task/async-apply/{task}", {"args": []}),
    "send-task": ("/api/task/send-task/{task}", {"args": []}),
    "abort": ("/api/task/abort/{task_id}", {}),
    "revoke": ("/api/task/revoke/{task_id}?terminate=true", {}),
    "timeout": ("/api/task/timeout/{task}?workername={worker}&hard=1", {}),
    "rate-limit": ("/api/task/rate-limit/{task}?workername={worker}&ratelimit=1", {}),
    "shutdown": ("/api/worker/shutdown/{worker}", {}),
    "pool-restart": ("/api/worker/pool/restart/{worker}", {}),
    "pool-grow": ("/api/worker/pool/grow/{worker}?n=1", {}),
    "pool-shrink": ("/api/worker/pool/shrink/{worker}?n=1", {}),
    "autoscale": ("/api/worker/pool/autoscale/{worker}?min=1&max=2", {}),
    "add-consumer": ("/api/worker/queue/add-consumer/{worker}?queue=coordinator", {}),
    "cancel-consumer": ("/api/worker/queue/cancel-consumer/{worker}?queue=host.lab-a", {}),
}


@dataclass
class FlowerView:
    """One Flower instance at ``base`` (``http://host:port``) with its credentials."""

    base: str
    user: str
    password: str

    def _request(self, path: str, body: dict[str, Any] | None, auth: bool) -> tuple[int, str]:
        """Status and text of a GET (no body) or POST (JSON body) of ``path``."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode(errors="replace")

    def get(self, path: str, auth: bool = True) -> tuple[int, str]:
        """Status and text of ``GET path``."""
        return self._request(path, None, auth)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """Status and text of ``POST path`` with a JSON body, authenticated."""
        return self._request(path, body, True)

    def json(self, path: str) -> Any:
        """``GET path`` as parsed JSON; AssertionError unless it answered 200."""
        code, text = self.get(path)
        assert code == 200, (path, code, text[:300])
        return json.loads(text)

    def answers(self) -> bool:
        """Whether Flower answers its API yet."""
        try:
            return self.get("/api/workers?refresh=0")[0] == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def tasks(self, name: str = "run_environment") -> dict[str, Any]:
        """Flower's task list of task ``name``."""
        found: dict[str, Any] = self.json(f"/api/tasks?taskname={name}")
        return found

    def _page_url(self, path: str) -> str:
        """``path`` with the credentials in the URL (Chromium then answers the auth challenge)."""
        scheme, rest = self.base.split("://", 1)
        return f"{scheme}://{self.user}:{self.password}@{rest}{path}"

    def auth_header(self) -> str:
        """The ``Authorization`` header value of this Flower's basic auth."""
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

    def _chromium(self, *args: str, profile: Path) -> subprocess.CompletedProcess[str]:
        """Run headless Chromium with ``args`` and a private profile."""
        argv = [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                f"--virtual-time-budget={SETTLE_MS}", *args]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)

    def screenshot(self, path: str, shot: Path, size: str = "1600,900") -> Path:
        """A PNG of page ``path`` once its scripts settled; the PNG's path."""
        self._chromium(f"--window-size={size}", f"--screenshot={shot}", self._page_url(path),
                       profile=shot.parent / "chromium-shot")  # fmt: skip
        assert shot.stat().st_size > 10_000, "Chromium wrote an empty screenshot"
        return shot

    def dom(self, path: str, work: Path) -> str:
        """The DOM of page ``path`` as Chromium has it once its scripts settled."""
        done = self._chromium("--dump-dom", self._page_url(path), profile=work / "chromium-dom")
        return done.stdout


def chromium_binary() -> str:
    """Chromium's path, or a reasoned skip (failure in CI)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    require(chromium is not None, "chromium (apt package chromium, installed by ops/setup.sh)")
    assert chromium is not None
    return chromium


class Browser:
    """One headless Chromium page driven over the DevTools protocol (stop it with ``close``)."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1600, 900)) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        argv = [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}", "--remote-debugging-port=0",
                "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.loop = asyncio.new_event_loop()
        self.ws: WebSocketClientConnection | None = None
        self.next_id = 0
        port_file = profile / DEVTOOLS_PORT_FILE
        try:
            port = _wait(lambda: port_file.exists() and port_file.read_text().split()[0], 30)
            pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
            url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")

            async def connect() -> WebSocketClientConnection:
                return await websocket_connect(url, max_message_size=CDP_MESSAGE_BYTES)

            self.ws = self.loop.run_until_complete(connect())
        except BaseException:
            self.close()
            raise

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events in between are skipped)."""
        self.next_id += 1
        ident = self.next_id

        async def exchange() -> dict[str, Any]:
            assert self.ws is not None
            await self.ws.write_message(json.dumps({"id": ident, "method": method,
                                                    "params": params}))  # fmt: skip
            while True:
                text = await self.ws.read_message()
                assert text is not None, f"Chromium closed the connection during {method}"
                message: dict[str, Any] = json.loads(text)
                if message.get("id") == ident:
                    assert "error" not in message, (method, message["error"])
                    return dict(message.get("result", {}))

        return self.loop.run_until_complete(asyncio.wait_for(exchange(), 60))

    def open(self, url: str, headers: dict[str, str]) -> None:
        """Load ``url`` with extra request ``headers`` (on every request of the page)."""
        self.call("Network.enable")
        self.call("Network.setExtraHTTPHeaders", headers=headers)
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        _wait(lambda: self.js("document.readyState") == "complete", 30)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def type_into(self, selector: str, text: str) -> None:
        """Type ``text`` into the input at ``selector`` as a keyboard would, replacing its text."""
        field = f"document.querySelector({json.dumps(selector)})"
        assert self.js(f"!!{field}"), selector
        self.js(f"{field}.focus(), {field}.select()")
        self.call("Input.insertText", text=text)

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        return _wait(lambda: self.js(expression), timeout)

    def screenshot(self, path: Path) -> Path:
        """A PNG of what the page shows now."""
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        """Stop Chromium and reap it."""
        if self.ws is not None:
            self.ws.close()
        self.proc.kill()
        self.proc.wait()
        self.loop.close()


def _wait(check: Callable[[], Any], timeout: float) -> Any:
    """Poll ``check`` until it returns something true; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s"
        time.sleep(0.2)
    return value
