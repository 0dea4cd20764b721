"""`mgpu-cloud dashboard` as users start it: the address it prints, a busy port, a second
dashboard, the token on every interface, `--open`'s page, and nothing of it loaded by the rest
of the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from conftest import serve
from kit import cli


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - our own server
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_serves_on_loopback_and_a_second_one_on_its_port_says_so(mgpu_home: Path) -> None:
    first = serve(mgpu_home)
    try:
        assert first.url == f"{first.base}/?token={first.token}" and len(first.token) >= 32
        assert first.base.startswith("http://127.0.0.1:")
        bearer = {"Authorization": f"Bearer {first.token}"}
        status, body = get(first.base + "/api/health", bearer)
        assert status == 200 and json.loads(body) == {"app": "mgpu-cloud-dashboard"}
        with first.opener().open(first.base + "/") as resp:
            assert resp.status == 200 and "No clusters" in resp.read().decode()
        again = cli("dashboard", "--port", str(first.port), home=mgpu_home)
        assert again.returncode == 2
        assert f"a mgpu-cloud dashboard already runs on 127.0.0.1:{first.port}" in again.stderr
        assert "?token=" in again.stderr and f"--port {first.port + 1}" in again.stderr
    finally:
        first.stop()


def test_a_port_taken_by_another_program_is_an_error_saying_so(mgpu_home: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        res = cli("dashboard", "--port", str(port), home=mgpu_home)
    assert res.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use by another program" in res.stderr
    assert "pick another with --port" in res.stderr and "Traceback" not in res.stderr


def test_another_interface_prints_and_needs_a_token(mgpu_home: Path) -> None:
    served = serve(mgpu_home, "--host", "0.0.0.0")  # noqa: S104 - the option under test
    try:
        assert "?token=" in served.url
        token = served.url.split("?token=")[1]
        local = f"http://127.0.0.1:{served.port}"
        assert get(local + "/api/clusters")[0] == 401
        assert get(local + "/api/clusters", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        served.stop()


def test_each_start_makes_a_new_token(mgpu_home: Path) -> None:
    first = serve(mgpu_home)
    try:
        second = serve(mgpu_home)
        try:
            assert first.token != second.token
            assert get(second.base + "/api/health",
                       {"Authorization": f"Bearer {first.token}"})[0] == 401
        finally:
            second.stop()
    finally:
        first.stop()


def test_the_open_page_is_the_owners_only_and_carries_the_token(mgpu_home: Path) -> None:
    """`--open` hands the browser a file, not the address: a browser's arguments are in
    `ps` for every local user to read."""
    from provision.operations.dashboard.server import redirect_page

    url = "http://127.0.0.1:8765/?token=abc&x=<1>"
    page = redirect_page(url)
    try:
        assert page.stat().st_mode & 0o777 == 0o600
        text = page.read_text()
        assert 'content="0;url=http://127.0.0.1:8765/?token=abc&amp;x=&lt;1&gt;"' in text
    finally:
        page.unlink()


def test_bad_host_is_a_clear_error(mgpu_home: Path) -> None:
    res = cli("dashboard", "--host", "192.0.2.1", "--port", "0", home=mgpu_home)
    assert res.returncode == 2 and "192.0.2.1 is not an address of this machine" in res.stderr


def test_the_rest_of_the_cli_loads_nothing_of_the_dashboard() -> None:
    probe = ("import sys; sys.argv = ['mgpu-cloud', '--help']\n"
             "import provision.cli as c\n"
             "try: c.app()\nexcept SystemExit: pass\n"
             "print([m for m in ('starlette', 'uvicorn', 'provision.operations.dashboard') "
             "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "dashboard" in out  # listed in --help ...
    assert out.strip().splitlines()[-1] == "[]"  # ... but nothing of it imported


def test_without_the_extra_it_says_what_to_install(mgpu_home: Path) -> None:
    probe = ("import sys; sys.modules['uvicorn'] = None  # as if not installed\n"
             "sys.argv = ['mgpu-cloud', 'dashboard', '--port', '0']\n"
             "from provision.cli import main\n"
             "main()")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "MGPU_CLOUD_HOME": str(mgpu_home)})
    assert res.returncode == 4, res.stderr
    assert "the dashboard needs starlette and uvicorn (uvicorn is not installed)" in res.stderr
    assert "pip install 'mgpu-cloud[dashboard]'" in res.stderr
