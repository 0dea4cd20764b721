"""Fixtures of the dashboard tests: the app in-process (Starlette's TestClient) and the real
`mgpu-cloud dashboard` in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dash_synthetic, browser

CSRF = "test-csrf-token"
TOKEN = "test-access-token"
BASE = "http://127.0.0.1:8765"


def make_client(home: Path, token: str = TOKEN, host: str = "127.0.0.1",
                login: bool = True) -> Any:
    """The app in-process; `login`: holding the cookie the printed address gives (taken the
    way a browser takes it: `?token=` and its redirect)."""
    from starlette.testclient import TestClient

    from provision.operations.dashboard.actions import Removals
    from provision.operations.dashboard.live import Live
    from provision.operations.dashboard.security import Access
    from provision.operations.dashboard.web import Dashboard, create_app

    dash = Dashboard(access=Access(host, token, CSRF, port=8765), home=home, live=Live(home),
                     removals=Removals(home))
    client = TestClient(create_app(dash), base_url=BASE, raise_server_exceptions=False)
    client.dash = dash  # type: ignore[attr-defined]
    if login:
        res = client.get(f"/api/health?token={token}", follow_redirects=False)
        assert res.status_code == 303 and client.cookies.get(dash.access.cookie) == token
    return client


@pytest.fixture
def client(mgpu_home: Path) -> Iterator[Any]:
    c = make_client(mgpu_home)
    try:
        yield c
    finally:
        c.dash.live.close()


class Served:
    """`mgpu-cloud dashboard` running in a subprocess; `url` is what it printed (with
    ?token=), `base` the address without it, `token` the token."""

    def __init__(self, home: Path, *args: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.err_path = home / f"dashboard-{os.getpid()}-{id(self)}.stderr"
        with self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "provision.cli", "dashboard", *args],
                stdout=subprocess.PIPE, stderr=err, text=True,
                env={**os.environ, "MGPU_CLOUD_HOME": str(home)})
        line = self._first_line(deadline_s=60)  # the address line, or "" when it failed
        m = re.match(r"dashboard: (\S+)", line)
        if not m:
            self.stop()
            raise AssertionError(f"the dashboard did not start: {line!r} {self.stderr}")
        self.url = m.group(1)
        self.base = self.url.split("?")[0].rstrip("/")
        self.token = self.url.split("?token=")[1] if "?token=" in self.url else ""
        self.port = int(self.base.rsplit(":", 1)[1])

    def _first_line(self, deadline_s: float) -> str:
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=deadline_s)
        sel.close()
        return self.proc.stdout.readline() if ready else ""

    @property
    def stderr(self) -> str:
        return self.err_path.read_text() if self.err_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


    def opener(self) -> Any:
        """A urllib opener holding the dashboard's cookie, as a script gets it: by opening
        the printed address (its redirect sets the cookie)."""
        import urllib.request

        op = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with op.open(self.url, timeout=30) as resp:
            assert resp.status == 200, resp.status
        return op


def serve(home: Path, *args: str) -> Served:
    return Served(home, "--port", "0", *args)
