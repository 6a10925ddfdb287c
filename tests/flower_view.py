"""Flower as a user reaches it in tests: its HTTP API with basic auth, its pages in Chromium."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import require

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")  # fmt: skip
# Virtual time Chromium gives a page's scripts (Flower's task table loads by XHR) before it
# takes the picture or dumps the DOM.
SETTLE_MS = 8000
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

    def _chromium(self, *args: str, profile: Path) -> subprocess.CompletedProcess[str]:
        """Run headless Chromium with ``args`` and a private profile."""
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        require(chromium is not None, "chromium (apt package chromium, installed by ops/setup.sh)")
        assert chromium is not None
        argv = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
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
